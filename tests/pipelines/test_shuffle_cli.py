"""``esa shuffle`` through the command line, on the default, multi-process and portable runners."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import fastavro
import pytest

from pipelines.commandline import main as cli
from schemas.recipes import load_recipe
from schemas.release import commit as rel
from schemas.release.crowd_buckets import DEFAULT_CROWD_BUCKETS
from tests.pipelines import shuffled
from tests.transforms import report_factory as rf
from transforms.shuffler import decide


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str]:
    """A recipe file (a shipped recipe renamed, minimum crowd 5) and report files using it."""
    return rf.cli_reports(tmp_path, "cli_test")


def _shuffle(tmp_path: Path, recipe: str, pattern: str, *extra: str) -> tuple[int, Path]:
    output = tmp_path / "out"
    argv = ["shuffle", "--input", pattern, "--output", str(output), "--recipe", recipe, *extra]
    return cli.main(argv), output


def _check_release(output: Path) -> dict:
    private = Path(f"{output}.private")
    metrics = json.loads((private / "metrics.json").read_text())
    assert metrics["adds_up"] and metrics["read"] == 65
    assert metrics["released"] == 60 and metrics["withheld"] == 3
    assert metrics["rejected_by_reason"] == {"crc_mismatch": 1, "instance_out_of_range": 1}
    verified = shuffled.verify(output)  # the release holds exactly what it commits
    assert verified.records == verified.commit["records_released"] == 60
    assert sorted(path.name for path in output.iterdir()) == [
        rel.COMMIT_FILE,
        "crowds",
        "messages",
    ]
    crowds = shuffled.crowds(verified)
    assert sorted(crowd["status"] for crowd in crowds) == ["released", "withheld"]
    assert (verified.commit["crowds_released"], verified.commit["crowds_withheld"]) == (1, 1)
    assert verified.commit["respondents_released"] == 30
    released = next(crowd for crowd in crowds if crowd["status"] == "released")
    assert released["respondents_released"] == 30 and released["messages_released"] == 60
    manifests = [
        m
        for path in (private / "manifest").rglob("*.avro")
        for m in fastavro.reader(open(path, "rb"))
    ]
    assert sorted(m["status"] for m in manifests) == ["RELEASED", "WITHHELD"]
    assert not (private / "spill").exists()  # spill files are removed after the run
    return metrics


def test_batch_run_on_the_default_runner(tmp_path: Path, inputs: tuple[str, str], capsys) -> None:
    status, output = _shuffle(
        tmp_path,
        *inputs,
        "--crowd-threshold",
        "10",
        "--window",
        "6h",
        "--crowd-buckets",
        "3",
        "--json",
    )
    assert status == 0
    metrics = _check_release(output)
    assert shuffled.verify(output).commit["parameters"]["crowd_buckets"] == 3
    assert json.loads(capsys.readouterr().out)["read"] == metrics["read"]
    assert metrics["beam_counters"]["read"] == 65 and metrics["beam_counters_add_up"]
    assert len(glob.glob(f"{output}.private/dead_letter/*.avro")) >= 1


def test_deletion_flags(tmp_path: Path, inputs: tuple[str, str]) -> None:
    status, output = _shuffle(
        tmp_path,
        *inputs,
        "--crowd-threshold",
        "2",
        "--deletion-epsilon",
        "2",
        "--deletion-delta",
        "1e-6",
    )
    assert status == 0
    metrics = json.loads(Path(f"{output}.private/metrics.json").read_text())
    # Scale 1, offset ceil(log(2e6)) = 15: 15 - Z of the 30 respondents are deleted; no deletion
    # (Z = 15), an abort (Z > 15) or fewer than 5 left (Z < -10) each have probability < 1e-4.
    assert metrics["adds_up"] and metrics["deleted"] > 0 and metrics["released"] > 0
    # The release states its deletion parameters, so a standalone analyzer can report them.
    assert metrics["deletion"] == {"epsilon": 2.0, "delta": 1e-6}
    parameters = shuffled.verify(output).commit["parameters"]
    assert (parameters["deletion_epsilon"], parameters["deletion_delta"]) == (2.0, 1e-6)
    assert parameters["crowd_buckets"] == DEFAULT_CROWD_BUCKETS


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--deletion-epsilon", "1"), "go together"),
        (("--window", "1 week"), "duration"),
        (("--crowd-threshold", "0"), "--crowd-threshold"),
        (("--crowd-buckets", "0"), "--crowd-buckets must be an integer in [1, 65536], got 0"),
        (("--crowd-buckets", "65537"), "--crowd-buckets must be an integer in [1, 65536]"),
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, inputs: tuple[str, str], capsys, extra, message
) -> None:
    status, _ = _shuffle(tmp_path, *inputs, *extra)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_missing_input_and_used_output_exit_2(
    tmp_path: Path, inputs: tuple[str, str], capsys
) -> None:
    recipe, _ = inputs
    status, _ = _shuffle(tmp_path, recipe, str(tmp_path / "nothing" / "*.avro"))
    assert status == 2 and "matches no file" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part.avro").write_bytes(b"")  # what a killed run may leave
    status, _ = _shuffle(tmp_path, *inputs)
    err = capsys.readouterr().err
    assert status == 2 and "uncommitted" in err and "--overwrite" in err
    (tmp_path / "file").write_text("x")
    status = cli.main(["shuffle", "--input", inputs[1], "--output", str(tmp_path / "file")])
    assert status == 2 and "not a directory" in capsys.readouterr().err
    private_inside = ("--private-output", str(tmp_path / "out" / "private"))
    status, _ = _shuffle(tmp_path, *inputs, *private_inside)
    assert status == 2 and "must not be inside" in capsys.readouterr().err


def test_rerun_refuses_a_release_unless_overwrite(
    tmp_path: Path, inputs: tuple[str, str], capsys
) -> None:
    status, output = _shuffle(tmp_path, *inputs, "--crowd-threshold", "10")
    assert status == 0
    capsys.readouterr()
    status, _ = _shuffle(tmp_path, *inputs, "--crowd-threshold", "10")
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.endswith("already holds a release; pass --overwrite to replace it")
    assert "\n" not in err
    status, _ = _shuffle(tmp_path, *inputs, "--crowd-threshold", "10", "--overwrite")
    assert status == 0
    _check_release(output)


def test_one_origin_moves_respondents_released_by_at_most_one(tmp_path: Path) -> None:
    """A device that sends 10,000 presence and data messages into one crowd counts as one
    respondent and gets at most the recipe's per-origin cap of data messages released."""
    recipe, fields = rf.write_recipe(tmp_path, "cli_test", min_crowd_size=5)
    honest = []
    for index in range(30):  # one presence message and two data messages each
        honest.append(rf.report(f"d{index}", b"", **fields))
        honest += [rf.report(f"d{index}", f"d{index}/{j}".encode(), **fields) for j in range(2)]
    flood = [
        rf.report("flooder", b"" if index % 2 else f"f{index}".encode(), **fields)
        for index in range(10_000)
    ]
    (tmp_path / "reports").mkdir()
    rf.write_reports(tmp_path / "reports" / "a.avro", honest + flood)
    status, output = _shuffle(
        tmp_path, recipe, str(tmp_path / "reports" / "*.avro"), "--crowd-threshold", "10"
    )
    assert status == 0
    (crowd,) = shuffled.crowds(shuffled.verify(output))
    assert crowd["respondents_released"] == 31  # 30 honest respondents + 1
    metrics = json.loads(Path(f"{output}.private/metrics.json").read_text())
    assert metrics["adds_up"] and metrics["presence"] == 31
    rejected = metrics["rejected_by_reason"]
    assert rejected["duplicate_presence"] == 5_000 - 1
    cap = 10_000 // 2 - rejected["over_origin_cap"]
    # The recipe's cap for instance 0 (weight 1/4): the 1e-12 tail of k-RAPPOR's set bits.
    assert cap == decide.recipe_origin_caps(load_recipe(recipe))[0]
    assert crowd["messages_released"] == metrics["released"] == 60 + cap


def test_portable_runner(tmp_path: Path, inputs: tuple[str, str]) -> None:
    flags = ("--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK")
    status, output = _shuffle(tmp_path, *inputs, "--crowd-threshold", "10", *flags)
    assert status == 0
    _check_release(output)


@pytest.mark.slow
def test_multi_process_direct_runner(tmp_path: Path, inputs: tuple[str, str]) -> None:
    flags = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
    status, output = _shuffle(tmp_path, *inputs, "--crowd-threshold", "10", *flags)
    assert status == 0
    _check_release(output)


def test_stale_spill_is_removed_and_a_live_runs_is_kept(tmp_path: Path) -> None:
    from pipelines import shuffle as shuffle_pipeline

    root = tmp_path / "spill"
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(finished.stdout)
    tag = shuffle_pipeline.spill_run_name().split("-")[1]
    live_name, dead_name = f"run-{tag}-{os.getppid()}-aa", f"run-{tag}-{dead}-bb"
    for name in (live_name, dead_name, "leftover"):
        (root / name / "reports").mkdir(parents=True)
        (root / name / "reports" / "x.arrow").write_bytes(b"origin-hash,payload")
    removed = shuffle_pipeline.remove_stale_spill(str(root))
    assert sorted(removed) == sorted([dead_name, "leftover"])
    assert [path.name for path in root.iterdir()] == [live_name]

"""``esa shuffle`` through the command line, on the default, multi-process and portable runners."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import fastavro
import pytest

from pipelines import cli
from schemas.recipes import RECIPE_DIR
from tests.transforms import report_factory as rf


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str]:
    """A recipe file (a shipped recipe renamed, minimum crowd 5) and report files using it."""
    recipe = json.loads((RECIPE_DIR / "image_grid_onehot.json").read_text())
    recipe.update(name="cli_test", min_crowd_size=5)
    recipe_path = tmp_path / "cli_test.json"
    recipe_path.write_text(json.dumps(recipe))
    fields = {"recipe_id": "cli_test@1", "channel": recipe["channel"]}
    reports = tmp_path / "reports"
    reports.mkdir()
    rf.write_reports(reports / "a.avro", rf.crowd(30, 2, **fields))
    rf.write_reports(
        reports / "b.avro",
        rf.crowd(3, 1, prefix="few", crowd_id="few", **fields)
        + [rf.report("x", instance=4, **fields), rf.report("y", crc=1, **fields)],
    )
    return str(recipe_path), str(reports / "*.avro")


def _shuffle(tmp_path: Path, recipe: str, pattern: str, *extra: str) -> tuple[int, Path]:
    output = tmp_path / "out"
    argv = ["shuffle", "--input", pattern, "--output", str(output), "--recipe", recipe, *extra]
    return cli.main(argv), output


def _check_release(output: Path) -> dict:
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["adds_up"] and metrics["read"] == 65
    assert metrics["released"] == 60 and metrics["withheld"] == 3
    assert metrics["rejected_by_reason"] == {"crc_mismatch": 1, "instance_out_of_range": 1}
    files = glob.glob(str(output / "messages" / "window_start=*" / "channel=*" / "part-*.avro"))
    assert sum(len(list(fastavro.reader(open(path, "rb")))) for path in files) == 60
    manifests = list(fastavro.reader(open(output / "manifest.avro", "rb")))
    assert sorted(m["status"] for m in manifests) == ["RELEASED", "WITHHELD"]
    assert not glob.glob(str(output / "_spill-*"))  # spill files are removed after the run
    return metrics


def test_batch_run_on_the_default_runner(tmp_path: Path, inputs: tuple[str, str], capsys) -> None:
    status, output = _shuffle(tmp_path, *inputs, "--crowd-threshold", "10", "--window", "6h")
    assert status == 0
    metrics = _check_release(output)
    assert json.loads(capsys.readouterr().out)["read"] == metrics["read"]
    assert metrics["beam_counters"]["read"] == 65 and metrics["beam_counters_add_up"]
    assert len(glob.glob(str(output / "dead_letter" / "*.avro"))) >= 1


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
    metrics = json.loads((output / "metrics.json").read_text())
    # Scale 1, offset ceil(log(2e6)) = 15: 15 - Z of the 30 respondents are deleted; no deletion
    # (Z = 15), an abort (Z > 15) or fewer than 5 left (Z < -10) each have probability < 1e-4.
    assert metrics["adds_up"] and metrics["deleted"] > 0 and metrics["released"] > 0
    # The release states its deletion parameters, so a standalone analyzer can report them.
    assert metrics["deletion"] == {"epsilon": 2.0, "delta": 1e-6}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--deletion-epsilon", "1"), "go together"),
        (("--window", "1 week"), "duration"),
        (("--crowd-threshold", "0"), "--crowd-threshold"),
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, inputs: tuple[str, str], capsys, extra, message
) -> None:
    status, _ = _shuffle(tmp_path, *inputs, *extra)
    assert status == 2
    assert message in capsys.readouterr().err


def test_missing_input_and_used_output_exit_2(
    tmp_path: Path, inputs: tuple[str, str], capsys
) -> None:
    recipe, _ = inputs
    status, _ = _shuffle(tmp_path, recipe, str(tmp_path / "nothing" / "*.avro"))
    assert status == 2 and "matches no file" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.avro").write_bytes(b"")
    status, _ = _shuffle(tmp_path, *inputs)
    assert status == 2 and "already holds a release" in capsys.readouterr().err


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

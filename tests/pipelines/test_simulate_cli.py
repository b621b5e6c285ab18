"""``esa simulate`` and ``esa recipes list`` end to end: files, readers, CRCs, χ², refusals, errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import avro.datafile
import avro.io
import fastavro
import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats

from pipelines.commandline.main import main
from schemas import crc32c
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import EncodedPayloads, decode_payloads
from schemas.recipes import load_recipe, recipe_names

FAST_RUNNER = "--runner=FnApiRunner"


def simulate(tmp_path: Path, name: str, *flags: str) -> tuple[int, Path]:
    output = tmp_path / name
    code = main(["simulate", "--output", str(output), FAST_RUNNER, *flags])
    return code, output


def report_files(output: Path) -> list[Path]:
    return sorted(output.glob("instance=*/reports-*.avro"))


def fastavro_records(path: Path) -> list[dict]:
    with open(path, "rb") as handle:
        return list(fastavro.reader(handle, return_record_name=False))


def as_plain(record: dict) -> dict:
    out = dict(record)
    if not isinstance(out["event_time"], int):
        out["event_time"] = round(out["event_time"].timestamp() * 1000)
    return out


def test_files_are_read_by_both_readers_with_every_crc_matching(tmp_path):
    code, output = simulate(tmp_path, "run", "--respondents", "150", "--seed", "3")
    assert code == 0
    summary = json.loads((output / "simulation.json").read_text())
    files = report_files(output)
    assert [str(f.relative_to(output)) for f in files] == sorted(summary["files"])
    total = 0
    for path in files:
        fast = [as_plain(r) for r in fastavro_records(path)]
        reader = avro.datafile.DataFileReader(io.BytesIO(path.read_bytes()), avro.io.DatumReader())
        apache = [as_plain(r) for r in reader]
        reader.close()
        assert apache == fast
        assert all(crc32c(r["payload"]) == r["payload_crc32c"] for r in apache)
        instance = int(path.parent.name.split("=")[1])
        assert {r["shuffler_instance"] for r in fast} == {instance}
        total += len(fast)
    assert total == summary["messages"] + summary["presence_messages"]
    assert summary["presence_per_instance"] == [150] * 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_encoded_messages_follow_the_randomizer_distribution(tmp_path):
    n = 1500
    code, output = simulate(tmp_path, "run", "--respondents", str(n), "--seed", "8")
    assert code == 0
    randomizer = load_recipe("image_grid_onehot").build_randomizer()
    payloads, crcs = [], []
    for path in report_files(output):
        records = fastavro_records(path)
        payloads += [r["payload"] for r in records]
        crcs += [r["payload_crc32c"] for r in records]
    encoded = EncodedPayloads.from_list(payloads)
    assert np.array_equal(crc32c_many(encoded), np.asarray(crcs, dtype=np.uint32))
    presence = encoded.lengths == 0
    assert presence.sum() == 4 * n  # one empty presence payload per device and instance
    decoded = decode_payloads(encoded, allowed_kinds=["bucket"])
    assert decoded.valid[~presence].all()
    observed = np.bincount(decoded.columns["bucket"][decoded.is_kind("bucket")], minlength=4096)
    truth = pq.read_table(output / "truth.parquet").to_pydict()
    assert sum(truth["count"]) == n and set(truth["window"]) == {0}
    counts = np.zeros(4096)
    counts[truth["bucket"]] = truth["count"]
    p1, p0 = randomizer.p_one, randomizer.p_zero
    mean = counts * p1 + (n - counts) * p0
    variance = counts * p1 * (1 - p1) + (n - counts) * p0 * (1 - p0)
    # Independent binomial sums per bucket: the sum of squared z-scores is ~chi2(4096);
    # the 1 - 1e-6 quantile makes the false-failure rate about 1e-6.
    statistic = float(np.sum((observed - mean) ** 2 / variance))
    assert statistic < stats.chi2.ppf(1 - 1e-6, 4096)


def test_refused_budget_count_reaches_simulation_json(tmp_path):
    # image_grid_onehot charges its central target 1.0 per run: 2.5 pays for 2 of 3 rounds.
    code, output = simulate(
        tmp_path,
        "run",
        "--respondents",
        "250",
        "--rounds",
        "3",
        "--device-budget",
        "2.5",
        "--seed",
        "1",
    )
    assert code == 0
    summary = json.loads((output / "simulation.json").read_text())
    assert summary["refusals"] == 250 and summary["device_rounds"] == 750
    assert summary["presence_per_instance"] == [500] * 4
    truth = pq.read_table(output / "truth.parquet").to_pydict()
    assert set(truth["window"]) == {0, 1}


def test_same_seed_same_bytes(tmp_path):
    flags = ("--respondents", "400", "--seed", "77", "--population", "zipf,exponent=1.1")
    assert simulate(tmp_path, "a", *flags)[0] == 0
    assert simulate(tmp_path, "b", *flags)[0] == 0
    assert (
        simulate(tmp_path, "c", "--respondents", "400", "--seed", "78", "--population", "zipf")[0]
        == 0
    )
    a, b, c = (sorted(p for p in (tmp_path / d).rglob("*") if p.is_file()) for d in "abc")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != c[0].read_bytes()


def test_longitudinal_and_image_populations(tmp_path):
    code, output = simulate(
        tmp_path,
        "long",
        "--recipe",
        "longitudinal_boolean",
        "--population",
        "longitudinal",
        "--respondents",
        "200",
    )
    assert code == 0
    truth = pq.read_table(output / "truth.parquet").to_pydict()
    assert set(truth["window"]) == set(range(16)) and set(truth["bucket"]) <= {0, 1}
    summary = json.loads((output / "simulation.json").read_text())
    assert summary["presence_per_instance"] == [200 * 16] * 4
    start, day = 1_704_067_200_000, 86_400_000  # 2024-01-01T00:00Z, the default start
    times = np.array([as_plain(r)["event_time"] for r in fastavro_records(report_files(output)[0])])
    assert np.all((start <= times) & (times < start + 16 * day))
    pytest.importorskip("skimage")
    code, output = simulate(
        tmp_path, "horse", "--population", "image:horse", "--respondents", "300"
    )
    assert code == 0
    assert json.loads((output / "simulation.json").read_text())["respondents"] == 300


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--recipe", "no_such_recipe"], "no shipped recipe"),
        (["--respondents", "0"], "respondents"),
        (["--population", "zipf"], "needs a number of respondents"),
        (["--population", "image:disc,size=10x10"], "4096"),
        (["--device-budget", "0.5"], "budget_too_small"),
        (["--query-class-fields", "app_category"], "field_not_in_query_class"),
        (["--instance-weights", "1,1"], "instance weights"),
        (["--start", "yesterday"], "ISO 8601"),
        (["--compression-level", "12"], "--compression-level"),
    ],
)
def test_bad_input_is_one_line_a_nonzero_exit_and_no_output(tmp_path, capsys, flags, words):
    code, output = simulate(tmp_path, "out", *flags)
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(error) == 1 and error[0].startswith("esa simulate: error:") and words in error[0]
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_image_is_a_clear_error(tmp_path, capsys):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG but not really")
    code, output = simulate(tmp_path, "out", "--population", f"image:{broken}")
    assert code == 2 and "cannot read image" in capsys.readouterr().err
    assert not output.exists()


def test_existing_output_is_kept_and_a_failed_run_leaves_nothing(tmp_path, capsys, monkeypatch):
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    assert main(["simulate", "--output", str(output), "--respondents", "50", FAST_RUNNER]) == 2
    assert "pass --overwrite" in capsys.readouterr().err and (output / "keep.txt").exists()

    import transforms.devices.encode

    def broken_shard(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(transforms.devices.encode, "write_shard", broken_shard)
    with pytest.raises(Exception, match="disk full"):
        main(["simulate", "--output", str(tmp_path / "new"), "--respondents", "50", FAST_RUNNER])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_recipes_list_prints_the_shipped_names(capsys):
    assert main(["recipes", "list", "--names"]) == 0
    assert capsys.readouterr().out.split() == recipe_names()
    assert main(["recipes", "list", "--verbose"]) == 0
    assert "image_grid_onehot@1" in capsys.readouterr().out


@pytest.mark.slow
def test_multi_process_and_portable_runners_write_the_same_files(tmp_path):
    flags = ["--respondents", "1500", "--seed", "4", "--messages-per-shard", "20000"]
    outputs = []
    for name, runner in [
        ("fnapi", [FAST_RUNNER]),
        (
            "multi",
            [
                "--runner=DirectRunner",
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=2",
            ],
        ),
        (
            "portable",
            ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
        ),
    ]:
        output = tmp_path / name
        assert main(["simulate", "--output", str(output), *flags, *runner]) == 0
        outputs.append(
            sorted(
                (p.relative_to(output), p.read_bytes()) for p in output.rglob("*") if p.is_file()
            )
        )
    assert outputs[0] == outputs[1] == outputs[2]
    assert len([name for name, _ in outputs[0] if name.suffix == ".avro"]) > 4

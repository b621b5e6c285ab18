"""``esa analyze --streaming`` on per-window releases made by the batch shuffler (no engine
needed: the analyzer follows commit records itself), and ``esa simulate --stream``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import fastavro
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import analyze, simulate, stream_analyze, stream_simulate
from pipelines.commandline import main as cli
from pipelines.commandline.analyze_options import AnalyzeOptions
from schemas.windows import window_name

DAY = 86_400_000
GRID = {
    "name": "stream_grid",
    "version": 1,
    "channel": "stream_grid",
    "randomizer": "one_hot_rappor",
    "randomizer_params": {"domain_size": 16, "epsilon": 4.0},
    "fragmentation": "attribute",
    "epsilon_local": 4.0,
    "epsilon_central_target": 4.0,
    "delta": 1e-6,
    "min_crowd_size": 50,
    "query_class": "test",
    "data_fields": ["value"],
    "shuffler_instances": 2,
    "window": "1d",
}
DAY0, DAY1 = "window=20240101T000000Z", "window=20240102T000000Z"


@pytest.fixture(scope="module")
def simulation(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("stream")
    recipe = root / "stream_grid.json"
    recipe.write_text(json.dumps(GRID))
    output = root / "sim"
    argv = ["simulate", "--recipe", str(recipe), "--population", "uniform", "--respondents",
            "300", "--rounds", "2", "--seed", "9", "--output", str(output)]  # fmt: skip
    assert cli.main(argv) == 0
    return recipe, output


def _split_by_window(simulation: Path, root: Path) -> None:
    """Each instance's reports as one file per day: root/u/<window>/reports.avro."""
    for u in (0, 1):
        parts: dict[str, list] = {}
        for path in (simulation / f"instance={u}").glob("*.avro"):
            reader = fastavro.reader(open(path, "rb"))
            schema = reader.writer_schema
            for record in reader:
                start = int(record["event_time"].timestamp() * 1000) // DAY * DAY
                parts.setdefault(window_name(start), []).append(record)
        for name, records in parts.items():
            (root / str(u) / name).mkdir(parents=True)
            with open(root / str(u) / name / "reports.avro", "wb") as handle:
                fastavro.writer(handle, schema, records)


def _release(recipe: Path, split: Path, releases: Path, u: int, name: str) -> None:
    argv = ["shuffle", "--input", str(split / str(u) / name / "*.avro"), "--output",
            str(releases / f"instance={u}" / name), "--instance", str(u), "--recipe", str(recipe)]  # fmt: skip
    assert cli.main(argv) == 0


def _analyze(releases: Path, output: Path, recipe: Path, **extra) -> dict:
    values = dict(
        analyze_input=[str(releases)],
        analyze_output=str(output),
        analyze_recipe=[str(recipe)],
        analyze_no_pictures=True,
        analyze_watch_interval=0.2,
        analyze_watch_for=0.0,
        analyze_instance_timeout=0.0,
    )
    values.update(extra)
    options = PipelineOptions(["--streaming"], **values)
    assert not options.view_as(AnalyzeOptions).validate()
    lines: list[str] = []
    summary = stream_analyze.run(options, analyze.run, say=lines.append)
    summary["lines"] = lines
    return summary


def test_windows_are_analyzed_once_each_when_their_instances_committed(
    simulation, tmp_path: Path
) -> None:
    recipe, sim = simulation
    split, releases, output = tmp_path / "split", tmp_path / "shuffled", tmp_path / "analysis"
    _split_by_window(sim, split)
    for u in (0, 1):
        for name in (DAY0, DAY1):
            _release(recipe, split, releases, u, name)
    first = _analyze(releases, output, recipe, analyze_instances=2)
    assert [line.split()[0] for line in first["lines"]] == [DAY0, DAY1]
    assert all("n=300" in line and "missing" not in line for line in first["lines"])
    summary = json.loads((output / "summary.json").read_text())
    assert [w["window"] for w in summary["windows"]] == [DAY0, DAY1]
    assert all(w["instances"] == [0, 1] for w in summary["windows"])
    table = pq.read_table(output / "histograms.parquet")
    assert sorted({"window=" + v for v in table.column("window").to_pylist()}) == [DAY0, DAY1]
    assert table.num_rows == 2 * 16
    for name in (DAY0, DAY1):
        assert os.listdir(output / "histograms.parquet" / name)
        assert (output / "windows" / f"{name}.json").is_file()
    # Started again: every window is done, none is analyzed twice.
    assert _analyze(releases, output, recipe, analyze_instances=2)["lines"] == []


def test_an_instance_is_waited_for_until_it_is_past_the_window(tmp_path: Path) -> None:
    folder = tmp_path / "instance=1"
    folder.mkdir()
    entry = stream_analyze.WindowCommits(0, {str(tmp_path / "instance=0"): "r0"})
    folders = [str(tmp_path / "instance=0"), str(folder)]
    assert stream_analyze.missing_instances(entry, folders) == ([str(folder)], [str(folder)])
    progress = {"committed_through_ms": DAY - 1, "window_ms": DAY, "allowed_lateness_ms": 0}
    for through, waiting in ((DAY - 1, True), (DAY, False)):
        (folder / "_STREAM.json").write_text(
            json.dumps(dict(progress, committed_through_ms=through))
        )
        assert bool(stream_analyze.missing_instances(entry, folders)[1]) is waiting
    (folder / "_STREAM.json").write_text(json.dumps(dict(progress, finished=True)))
    assert stream_analyze.missing_instances(entry, folders)[1] == []


def test_a_window_an_instance_never_commits_is_analyzed_after_the_timeout_naming_it(
    simulation, tmp_path: Path
) -> None:
    recipe, sim = simulation
    split, releases, output = tmp_path / "split", tmp_path / "shuffled", tmp_path / "analysis"
    _split_by_window(sim, split)
    _release(recipe, split, releases, 0, DAY0)
    summary = _analyze(releases, output, recipe, analyze_instances=2)
    (line,) = summary["lines"]
    assert line.startswith(DAY0) and line.endswith("(missing: instance=1)")
    (window,) = summary["windows"]
    assert window["instances"] == [0] and window["missing_instances"] == ["instance=1"]
    # n comes from the instance present: about half the respondents (instance weights 1/2).
    assert 0 < window["crowds"][0]["n"] < 300


def test_a_half_done_window_is_analyzed_again(simulation, tmp_path: Path) -> None:
    recipe, sim = simulation
    split, releases, output = tmp_path / "split", tmp_path / "shuffled", tmp_path / "analysis"
    _split_by_window(sim, split)
    for u in (0, 1):
        _release(recipe, split, releases, u, DAY0)
    # What a run killed while moving its results leaves: a partition, no window record.
    stale = output / "histograms.parquet" / DAY0
    stale.mkdir(parents=True)
    (stale / "part-stale.parquet").write_bytes(b"half")
    summary = _analyze(releases, output, recipe, analyze_instances=2)
    assert [line.split()[0] for line in summary["lines"]] == [DAY0]
    assert "part-stale.parquet" not in os.listdir(stale)
    assert pq.read_table(output / "histograms.parquet").num_rows == 16


def test_simulate_stream_writes_window_after_window(simulation, tmp_path: Path) -> None:
    recipe, _ = simulation
    output = tmp_path / "live"
    options = PipelineOptions(
        ["--runner=FnApiRunner"],
        simulate_recipe=str(recipe),
        simulate_population="uniform",
        simulate_respondents=300,
        simulate_seed=9,
        simulate_windows=2,
        simulate_output=str(output),
    )
    summary = stream_simulate.prepare(options, simulate.run)
    assert (output / "truth.parquet").is_file() and not list(output.glob("instance=*"))
    began = time.monotonic()
    files = stream_simulate.replay(output, summary, window_seconds=1.0)
    assert time.monotonic() - began >= 1.5  # the last chunk of window 1 waits 1.5 s
    names = sorted(p.relative_to(output).as_posix() for p in output.glob("instance=*/*.avro"))
    assert names == [
        f"instance={u}/reports-w0000{w}-c{c}.avro" for u in (0, 1) for w in (0, 1) for c in (0, 1)
    ]
    assert not list(output.glob("instance=*/.*"))  # no hidden partial file left
    # Every report of the fleet, once, each file within its window.
    assert sum(f["records"] for f in files) == summary["messages"] + summary["presence_messages"]
    for path in output.glob("instance=*/*.avro"):
        window = int(path.name.split("-w")[1][:5])
        days = {
            int(r["event_time"].timestamp() * 1000) // DAY
            for r in fastavro.reader(open(path, "rb"))
        }
        assert days == {19723 + window}


def test_streaming_without_prism_is_one_error_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ESA_ENGINES_DIR", str(tmp_path / "no-engines"))
    (tmp_path / "in").mkdir()
    argv = ["shuffle", "--streaming", "--input", str(tmp_path / "in" / "*.avro"),
            "--output", str(tmp_path / "out"), "--watch-for", "1"]  # fmt: skip
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("esa shuffle: error: --streaming runs on Prism")
    assert "make engines" in error[0]


@pytest.mark.parametrize(
    ("flag", "value"), [("--allowed-lateness", "soon"), ("--allowed-lateness", "1.5h")]
)
def test_bad_allowed_lateness_is_refused(tmp_path: Path, capsys, flag: str, value: str) -> None:
    argv = ["shuffle", "--streaming", "--input", str(tmp_path / "*.avro"),
            "--output", str(tmp_path / "out"), flag, value]  # fmt: skip
    assert cli.main(argv) == 2
    assert "--allowed-lateness" in capsys.readouterr().err


@pytest.mark.parametrize("runner", ["DirectRunner", "BundleBasedDirectRunner", "FlinkRunner"])
def test_runners_that_cannot_follow_files_are_refused(tmp_path: Path, capsys, runner: str) -> None:
    argv = ["shuffle", "--streaming", "--input", str(tmp_path / "in" / "*.avro"),
            "--output", str(tmp_path / "out"), f"--runner={runner}"]  # fmt: skip
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(
        f"esa shuffle: error: --streaming cannot follow files on --runner={runner}"
    )
    assert not (tmp_path / "out").exists()


def test_one_instance_folder_given_itself(simulation, tmp_path: Path) -> None:
    recipe, sim = simulation
    split, releases, output = tmp_path / "split", tmp_path / "shuffled", tmp_path / "analysis"
    _split_by_window(sim, split)
    _release(recipe, split, releases, 0, DAY0)
    summary = _analyze(releases / "instance=0", output, recipe)
    assert [line.split()[0] for line in summary["lines"]] == [DAY0]
    assert summary["windows"][0]["missing_instances"] == []


def test_an_analyzer_killed_mid_window_analyzes_it_once_after_a_restart(
    simulation, tmp_path: Path
) -> None:
    """SIGKILL while a window's batch analysis runs, then the same command again."""
    import signal
    import subprocess
    import sys

    recipe, sim = simulation
    split, releases, output = tmp_path / "split", tmp_path / "shuffled", tmp_path / "analysis"
    _split_by_window(sim, split)
    for u in (0, 1):
        _release(recipe, split, releases, u, DAY0)
    argv = [sys.executable, "-m", "pipelines.commandline.main", "analyze", "--streaming",
            "--input", str(releases), "--output", str(output), "--recipe", str(recipe),
            "--instances", "2", "--no-pictures", "--watch-interval", "0.2"]  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    analyzer = subprocess.Popen(
        [*argv, "--watch-for", "60"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    work = output / "_work" / DAY0
    deadline = time.time() + 60
    while not work.exists():
        assert time.time() < deadline and analyzer.poll() is None
        time.sleep(0.05)
    analyzer.send_signal(signal.SIGKILL)  # mid-analysis of day 0
    analyzer.communicate()
    assert not (output / "windows" / f"{DAY0}.json").exists()
    for u in (0, 1):
        _release(recipe, split, releases, u, DAY1)
    again = subprocess.run(
        [*argv, "--watch-for", "1", "--instance-timeout", "0"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line.split()[0] for line in again.stdout.splitlines() if line.startswith("window=")]
    assert lines == [DAY0, DAY1]
    table = pq.read_table(output / "histograms.parquet")
    assert table.num_rows == 2 * 16  # each window's rows once
    assert not (output / "_work").exists() or not os.listdir(output / "_work")

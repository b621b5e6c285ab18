"""Streaming end to end on Prism: ``esa shuffle --streaming`` follows a folder and commits a
release per event-time window while it runs; late rows are dead-lettered; the releases equal the
batch shuffler's on the same files; a SIGKILL and a restart lose nothing and redo nothing; ``esa
analyze --streaming`` analyzes each window once, as batch does.

Each command runs as its own process (the way a person runs them), on files dropped into its
input folder by atomic rename while it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import fastavro
import pytest

from pipelines.engines import runners
from schemas.windows import window_name
from tests.pipelines import shuffled
from tests.transforms import report_factory as rf

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(
        runners.prism_binary() is None, reason="no Prism binary: run `make engines`"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
DAY = rf.DAY_MS
DAY0, DAY1 = window_name(rf.T0), window_name(rf.T0 + DAY)


def _esa(*argv: str) -> subprocess.Popen:
    """``esa ARGV`` as a process of its own session (so that its Prism dies with it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.commandline.main", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(process: subprocess.Popen, timeout: float = 120) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"did not stop by itself:\n{output[-3000:]}") from None
    assert process.returncode == 0, output[-3000:]
    return output


def _wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"stopped before {what}:\n{process.stdout.read()[-3000:]}")
        if time.time() > deadline:
            raise AssertionError(f"no {what} after 60 s")
        time.sleep(0.2)


def _drop(folder: Path, name: str, records: list[dict]) -> None:
    """A report file appears by atomic rename, as a collector writes it."""
    partial = folder / f".{name}.partial"
    partial.write_bytes(rf.report_bytes(records))
    os.rename(partial, folder / name)


def _shuffle(inbox: Path, output: Path, recipe: str, watch_for: float) -> subprocess.Popen:
    return _esa(
        "shuffle", "--streaming", "--input", str(inbox / "*.avro"), "--output", str(output),
        "--instance", "0", "--recipe", recipe, "--crowd-threshold", "3",
        "--watch-interval", "1", "--watch-for", str(watch_for), "--allowed-lateness", "0",
    )  # fmt: skip


def _messages(release: Path) -> Counter:
    verified = shuffled.verify(release)
    return Counter(
        rf.shuffled_key(record)
        for path in verified.files
        if "/messages/" in path
        for record in fastavro.reader(open(path, "rb"))
    )


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _tables(release: Path) -> list[dict]:
    return shuffled.crowds(shuffled.verify(release))


def test_streaming_shuffler_commits_each_window_as_it_closes(tmp_path: Path) -> None:
    recipe, fields = rf.write_recipe(tmp_path, "stream_test", min_crowd_size=3)
    inbox, output = tmp_path / "in", tmp_path / "shuffled" / "instance=0"
    inbox.mkdir()
    shuffler = _shuffle(inbox, output, recipe, watch_for=30)  # started on an empty folder
    _wait_for(lambda: (output / "_STREAM.json").exists(), "progress record", shuffler)
    day0 = rf.crowd(6, 2, **fields) + rf.crowd(2, 1, prefix="few", crowd_id="few", **fields)
    day1 = rf.crowd(5, 1, prefix="d1", event_time=rf.T0 + DAY + 5, **fields)
    _drop(inbox, "a.avro", day0[:7])
    _drop(inbox, "b.avro", day0[7:] + [rf.report("bad", crc=1, **fields)])
    (inbox / ".c.avro").write_bytes(b"half-written, never renamed")  # never read
    time.sleep(3)
    assert not (output / DAY0).exists()  # day 0 stays open until the watermark passes it
    _drop(inbox, "d.avro", day1)
    _wait_for(lambda: (output / DAY0 / "_COMMIT.json").exists(), "day 0 commit", shuffler)
    assert shuffler.poll() is None  # committed while the shuffler runs
    _drop(inbox, "e.avro", rf.crowd(2, 1, prefix="late", **fields))  # day 0 is closed: late
    _finish(shuffler)

    private = Path(f"{output}.private")
    metrics = json.loads((private / "metrics.json").read_text())
    assert metrics["adds_up"], metrics
    assert metrics["read"] == len(day0) + 1 + len(day1) + 2 and metrics["files_read"] == 4
    assert metrics["rejected_at_ingest"] == {"crc_mismatch": 1}
    assert metrics["late_data"] == 2 and metrics["windows_committed"] == 2
    assert metrics["windows"][DAY0]["released"] == 12 and metrics["windows"][DAY0]["withheld"] == 2
    assert metrics["windows"][DAY1]["released"] == 5  # committed when the input ended
    late = [
        letter["reason"]
        for path in (private / "stream" / "late" / DAY0).glob("*.avro")
        for letter in fastavro.reader(open(path, "rb"))
    ]
    assert late == ["late_data", "late_data"]
    assert json.loads((output / "_STREAM.json").read_text())["finished"] is True
    assert not list((private / "stream").glob("staging/*/*.avro"))  # nothing of closed windows

    # The same files through the batch shuffler (the late file aside): the same release.
    batch = tmp_path / "batch"
    _finish(
        _esa(
            "shuffle",
            "--input",
            str(inbox / "[abd].avro"),
            "--output",
            str(batch),
            "--instance",
            "0",
            "--recipe",
            recipe,
            "--crowd-threshold",
            "3",
        )  # fmt: skip
    )
    batch_messages, batch_tables = _messages(batch), _tables(batch)
    for name, start in ((DAY0, rf.T0), (DAY1, rf.T0 + DAY)):
        window = output / name
        assert _messages(window) == Counter(
            {key: count for key, count in batch_messages.items() if _ms(key[0]) == start}
        )
        assert _tables(window) == [t for t in batch_tables if t["window_start_ms"] == start]


GRID = {
    "name": "stream_grid",
    "version": 1,
    "channel": "stream_grid",
    "randomizer": "one_hot_rappor",
    "randomizer_params": {"domain_size": 64, "epsilon": 4.0},
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
DAY0_2024, DAY1_2024 = "window=20240101T000000Z", "window=20240102T000000Z"


def _simulation(tmp_path: Path) -> tuple[str, Path, dict[tuple[int, str], list[dict]]]:
    """A two-day simulation (two instances, unsealed): its recipe, folder and records per
    (instance, window)."""
    recipe = tmp_path / "stream_grid.json"
    recipe.write_text(json.dumps(GRID))
    simulation = tmp_path / "sim"
    _finish(
        _esa(
            "simulate",
            "--recipe",
            str(recipe),
            "--population",
            "uniform",
            "--respondents",
            "800",
            "--rounds",
            "2",
            "--seed",
            "5",
            "--output",
            str(simulation),
        )  # fmt: skip
    )
    parts: dict[tuple[int, str], list[dict]] = {}
    for instance in (0, 1):
        for path in sorted((simulation / f"instance={instance}").glob("*.avro")):
            for record in fastavro.reader(open(path, "rb")):
                start = _ms(record["event_time"]) // DAY * DAY
                record["event_time"] = _ms(record["event_time"])
                parts.setdefault((instance, window_name(start)), []).append(record)
    return str(recipe), simulation, parts


def _histograms(table) -> list[dict]:
    rows = table.drop_columns([c for c in table.column_names if c == "window"]).to_pylist()
    return sorted(rows, key=lambda row: (str(row["window_start"]), row["crowd"], row["bucket"]))


def test_streaming_analyzer_analyzes_each_window_once_all_instances_committed_it(
    tmp_path: Path,
) -> None:
    import pyarrow.parquet as pq

    recipe, simulation, parts = _simulation(tmp_path)
    releases, analysis = tmp_path / "shuffled", tmp_path / "analysis"
    inboxes = [tmp_path / f"in{u}" for u in (0, 1)]
    for inbox in inboxes:
        inbox.mkdir()
    releases.mkdir()
    analyzer = _esa(
        "analyze", "--streaming", "--input", str(releases), "--output", str(analysis),
        "--instances", "2", "--watch-interval", "1", "--watch-for", "35",
        "--recipe", recipe, "--truth", str(simulation), "--no-pictures",
    )  # fmt: skip
    shufflers = [
        _esa(
            "shuffle",
            "--streaming",
            "--input",
            str(inbox / "*.avro"),
            "--output",
            str(releases / f"instance={u}"),
            "--instance",
            str(u),
            "--recipe",
            recipe,
            "--watch-interval",
            "1",
            "--watch-for",
            "30",
            "--allowed-lateness",
            "0",
        )  # fmt: skip
        for u, inbox in enumerate(inboxes)
    ]
    for u, shuffler in enumerate(shufflers):
        _wait_for(
            lambda u=u: (releases / f"instance={u}" / "_STREAM.json").exists(), "start", shuffler
        )
    for u, inbox in enumerate(inboxes):
        _drop(inbox, "day0.avro", parts[(u, DAY0_2024)])
    time.sleep(2)
    for u, inbox in enumerate(inboxes):
        _drop(inbox, "day1.avro", parts[(u, DAY1_2024)])
    _wait_for(lambda: (analysis / "windows" / f"{DAY0_2024}.json").exists(), "day 0", analyzer)
    assert all(process.poll() is None for process in [analyzer, *shufflers])
    for shuffler in shufflers:
        _finish(shuffler)
    printed = _finish(analyzer)
    lines = [line for line in printed.splitlines() if line.startswith("window=")]
    assert [line.split()[0] for line in lines] == [DAY0_2024, DAY1_2024], printed
    assert all("n=800" in line and "eps_c=" in line and "rmse=" in line for line in lines)
    summary = json.loads((analysis / "summary.json").read_text())
    assert summary["windows_analyzed"] == 2 and summary["windows_waiting"] == []
    assert all(w["instances"] == [0, 1] and not w["missing_instances"] for w in summary["windows"])

    # Batch: each instance's files shuffled once, analyzed once: the same histograms.
    batch = tmp_path / "batch"
    for u in (0, 1):
        _finish(
            _esa(
                "shuffle",
                "--input",
                str(simulation / f"instance={u}" / "*.avro"),
                "--output",
                str(batch / f"instance={u}"),
                "--instance",
                str(u),
                "--recipe",
                recipe,
            )  # fmt: skip
        )
    _finish(
        _esa(
            "analyze",
            "--input",
            str(batch),
            "--output",
            str(tmp_path / "batch-analysis"),
            "--recipe",
            recipe,
            "--truth",
            str(simulation),
            "--no-pictures",
        )  # fmt: skip
    )
    streamed = _histograms(pq.read_table(analysis / "histograms.parquet"))
    assert len(streamed) == 2 * 64
    assert streamed == _histograms(
        pq.read_table(tmp_path / "batch-analysis" / "histograms.parquet")
    )

    # Started again on the same folders: every window is already analyzed, none twice.
    again = _finish(
        _esa(
            "analyze",
            "--streaming",
            "--input",
            str(releases),
            "--output",
            str(analysis),
            "--instances",
            "2",
            "--watch-interval",
            "1",
            "--watch-for",
            "1",
            "--instance-timeout",
            "1",
            "--recipe",
            recipe,
            "--no-pictures",
        )  # fmt: skip
    )
    assert not [line for line in again.splitlines() if line.startswith("window=")], again


def test_a_killed_shuffler_restarts_from_its_input_files_and_commit_records(
    tmp_path: Path,
) -> None:
    recipe, fields = rf.write_recipe(tmp_path, "stream_test", min_crowd_size=3)
    inbox, output = tmp_path / "in", tmp_path / "shuffled" / "instance=0"
    private = Path(f"{output}.private")
    inbox.mkdir()
    day1 = [
        rf.crowd(4, 1, prefix=f"d1{part}", event_time=rf.T0 + DAY + 5, **fields) for part in "abc"
    ]
    shuffler = _shuffle(inbox, output, recipe, watch_for=120)
    _wait_for(lambda: (output / "_STREAM.json").exists(), "progress record", shuffler)
    _drop(inbox, "day0.avro", rf.crowd(5, 2, **fields))
    _drop(inbox, "day1a.avro", day1[0])
    _wait_for(lambda: (output / DAY0 / "_COMMIT.json").exists(), "day 0 commit", shuffler)
    _drop(inbox, "day1b.avro", day1[1])
    ingest = private / "stream" / "ingest"
    _wait_for(lambda: len(list(ingest.glob("*.json"))) == 3, "day1b read", shuffler)
    os.killpg(shuffler.pid, signal.SIGKILL)  # day 1 is open: staged, not committed
    shuffler.communicate()
    assert not (output / DAY1).exists()
    commit = output / DAY0 / "_COMMIT.json"
    committed_bytes, committed_at = commit.read_bytes(), commit.stat().st_mtime_ns
    # While it is down: more of day 1, and rows of day 0, which was committed (late).
    _drop(inbox, "day1c.avro", day1[2])
    _drop(inbox, "late.avro", rf.crowd(3, 1, prefix="late", **fields))

    _finish(_shuffle(inbox, output, recipe, watch_for=10))
    assert commit.read_bytes() == committed_bytes and commit.stat().st_mtime_ns == committed_at
    metrics = json.loads((private / "metrics.json").read_text())
    assert metrics["adds_up"], metrics
    assert metrics["windows_committed_before"] == 1 and metrics["windows_committed"] == 2
    assert [line["window"] for line in metrics["committed_now"]] == [DAY1]
    assert metrics["read"] == 10 + 12 + 3 and metrics["late_data"] == 3
    # Day 1 from all three of its files (two read before the kill), each message once.
    payloads = Counter(key[-1] for key in _messages(output / DAY1).elements())
    assert payloads == Counter(record["payload"] for part in day1 for record in part)
    assert sum(_messages(output / DAY0).values()) == 10


def test_run_stream_prints_one_line_per_window_as_it_is_analyzed(tmp_path: Path) -> None:
    recipe = tmp_path / "stream_grid.json"
    recipe.write_text(json.dumps(GRID))
    output = tmp_path / "live"
    printed = _finish(
        _esa(
            "run",
            "--stream",
            "--windows",
            "2",
            "--window-seconds",
            "4",
            "--output",
            str(output),
            "--recipe",
            str(recipe),
            "--population",
            "uniform",
            "--respondents",
            "400",
            "--seed",
            "3",
        ),  # fmt: skip
        timeout=300,
    )
    lines = [line for line in printed.splitlines() if line.startswith("window=")]
    assert [line.split()[0] for line in lines] == [DAY0_2024, DAY1_2024], printed
    assert all("n=400" in line and "rmse=" in line for line in lines)
    summary = json.loads((output / "analysis" / "summary.json").read_text())
    assert [w["instances"] for w in summary["windows"]] == [[0, 1], [0, 1]]
    # Shuffler-private outputs stay outside what the analyzer is given.
    assert sorted(p.name for p in (output / "releases").iterdir()) == ["instance=0", "instance=1"]
    for u in (0, 1):
        metrics = json.loads((output / f"shuffler-{u}" / "private" / "metrics.json").read_text())
        assert metrics["adds_up"] and metrics["windows_committed"] == 2
    # Sealed to the analyzer and signed by each instance (the analyzer verified both).
    for u in (0, 1):
        for name in (DAY0_2024, DAY1_2024):
            commit = json.loads(
                (output / "releases" / f"instance={u}" / name / "_COMMIT.json").read_text()
            )
            assert commit["signature"]["algorithm"] == "Ed25519"

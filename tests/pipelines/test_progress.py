"""The progress line (pipelines/commandline/progress.py) and the counts that feed it
(schemas/progress_counts.py): on a terminal the line shows the stage, its count against the
total with rate and time left; off a terminal it prints and counts nothing. Worker processes
each write their running total to their own file and the driver sums them; a directory that
does not exist costs nothing and breaks nothing; the shuffler, the analyzer and the device
simulation count exactly the records (device rounds) they read (simulate)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import analyze as analyze_pipeline
from pipelines import shuffle as shuffle_pipeline
from pipelines.commandline import progress as progress_line
from pipelines.commandline import stage_logs
from schemas import progress_counts
from schemas.recipes import load_recipe
from simulators.plan import SimulationPlan
from simulators.shards import ShardContext, simulate_shard
from tests.transforms import report_factory as rf


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# ---------------------------------------------------------------------------------------------
# The line
# ---------------------------------------------------------------------------------------------


def test_the_line_shows_count_total_and_rate_on_a_terminal(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(stage_logs, "_TERMINAL", [terminal])
    monkeypatch.setattr(progress_line, "POLL_SECONDS", 0.05)
    done = [0]
    with progress_line.stage_progress("simulate", 1000, "devices", count=lambda: done[0], delay=0):
        for step in range(1, 5):
            done[0] = 250 * step
            time.sleep(0.15)
    text = terminal.getvalue()
    assert "simulate:  50%" in text and "simulate, finishing: 100%" in text
    assert "1.00k/1.00k" in text and "devices/s]" in text and "<00:00" in text  # rate, time left
    assert text.endswith("\r")  # the line is cleared when the stage ends


def test_a_total_set_while_the_stage_runs_is_shown(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(stage_logs, "_TERMINAL", [terminal])
    monkeypatch.setattr(progress_line, "POLL_SECONDS", 0.05)
    done = [0]
    with progress_line.stage_progress("analyze", None, "messages", lambda: done[0], 0) as line:
        done[0] = 100
        # Before the total is known: the count and its rate.
        assert _shown(terminal, "analyze: 100 messages [")
        line.set_total(400)
        assert _shown(terminal, "analyze:  25%|") and "100/400" in terminal.getvalue()


def test_text_printed_while_the_line_is_drawn_goes_above_it(monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(stage_logs, "_TERMINAL", [terminal])
    monkeypatch.setattr(progress_line, "POLL_SECONDS", 0.05)
    with progress_line.stage_progress("shuffle", 10, "records", lambda: 4, delay=0):
        assert _shown(terminal, "4.00/10")
        before = len(terminal.getvalue())
        progress_line.print_above("  instance 0: released 4 of 4 messages")
        # The line was wiped before the text went out, and drawn again after it.
        assert re.search(r"\r {20,}\r.*4.00/10", terminal.getvalue()[before:])
    assert capsys.readouterr().out == "  instance 0: released 4 of 4 messages\n"
    progress_line.print_above("after the stage")  # no line: a plain print
    assert capsys.readouterr().out == "after the stage\n"


def _shown(terminal: Terminal, text: str, patience: float = 30.0) -> bool:
    """Whether ``text`` appears on the terminal within ``patience`` seconds (the line is
    redrawn every POLL_SECONDS by its own thread)."""
    give_up = time.monotonic() + patience
    while text not in terminal.getvalue():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.02)
    return True


def test_nothing_is_printed_or_counted_off_a_terminal(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(stage_logs, "_TERMINAL", [stream])
    monkeypatch.delenv(progress_counts.ENVIRONMENT, raising=False)
    with progress_line.stage_progress("shuffle", delay=0):
        time.sleep(0.1)
    with progress_line.counted_stage("shuffle", 10, delay=0):
        assert progress_counts.ENVIRONMENT not in os.environ
        time.sleep(0.1)
    assert stream.getvalue() == ""


def test_esa_progress_0_turns_the_line_off(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(stage_logs, "_TERMINAL", [terminal])
    monkeypatch.setenv("ESA_PROGRESS", "0")
    monkeypatch.delenv(progress_counts.ENVIRONMENT, raising=False)
    with progress_line.counted_stage("analyze", delay=0):
        assert progress_counts.ENVIRONMENT not in os.environ
        time.sleep(0.1)
    assert terminal.getvalue() == ""


def test_a_counted_stage_names_a_directory_for_its_duration_only(monkeypatch):
    monkeypatch.setattr(stage_logs, "_TERMINAL", [Terminal()])
    monkeypatch.setenv(progress_counts.ENVIRONMENT, "/the/outer/stage")
    with progress_line.counted_stage("shuffle", delay=60):
        directory = os.environ[progress_counts.ENVIRONMENT]
        assert os.path.isdir(directory)
        progress_counts.add(7)
        progress_counts.flush()
        assert progress_counts.total(directory) == 7
    assert os.environ[progress_counts.ENVIRONMENT] == "/the/outer/stage"
    assert not os.path.exists(directory)


# ---------------------------------------------------------------------------------------------
# The counts (pure functions)
# ---------------------------------------------------------------------------------------------

_WORKER = """
import sys
from schemas import progress_counts
for amount in map(int, sys.argv[1:]):
    progress_counts.add(amount)
progress_counts.flush()
"""


def test_two_processes_add_and_the_driver_sums_their_files(tmp_path, monkeypatch):
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(tmp_path))
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, *amounts], env=dict(os.environ))
        for amounts in (["5", "10", "20"], ["1000", "1"])
    ]
    assert [worker.wait(timeout=60) for worker in workers] == [0, 0]
    progress_counts.add(3)  # the driver's own process (an in-process runner's workers)
    progress_counts.flush()
    assert progress_counts.total(str(tmp_path)) == 35 + 1001 + 3
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 3 and all(name.endswith(progress_counts.SUFFIX) for name in names)
    # Each file holds one decimal count and nothing else.
    assert all(re.fullmatch(r"[0-9]+", (tmp_path / name).read_text()) for name in names)


def test_adding_again_replaces_the_process_file(tmp_path, monkeypatch):
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(tmp_path))
    progress_counts.add(2)
    progress_counts.flush()
    progress_counts.add(5)
    progress_counts.flush()
    assert progress_counts.total(str(tmp_path)) == 7
    assert len(os.listdir(tmp_path)) == 1


def test_counted_adds_per_item_and_flushes_at_the_end(tmp_path, monkeypatch):
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(tmp_path))
    batches = [[1, 2, 3], [4], [5, 6]]
    assert list(progress_counts.counted(batches, len)) == batches
    assert progress_counts.total(str(tmp_path)) == 6


def test_a_missing_directory_writes_nothing_and_fails_nothing(tmp_path, monkeypatch):
    absent = tmp_path / "on-another-machine"
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(absent))
    progress_counts.add(10)
    progress_counts.flush()
    assert list(progress_counts.counted([[1], [2]], len)) == [[1], [2]]
    assert not absent.exists() and list(tmp_path.iterdir()) == []
    assert progress_counts.total(str(absent)) == 0


# ---------------------------------------------------------------------------------------------
# The stages count what they read
# ---------------------------------------------------------------------------------------------


def test_the_simulation_counts_device_rounds(tmp_path, monkeypatch):
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(tmp_path))
    plan = SimulationPlan.for_recipe(load_recipe("small_binary_rr"), "zipf", 3, respondents=700)
    context = ShardContext(plan)
    for shard in context.shards():
        list(simulate_shard(context, shard))
    assert progress_counts.total(str(tmp_path)) == 700


@pytest.fixture
def reports(tmp_path: Path) -> tuple[str, str]:
    """A recipe (minimum crowd 5) and two report files: 60 valid reports, 5 others."""
    return rf.cli_reports(tmp_path, "progress_test")


def _shuffle(tmp_path: Path, recipe: str, pattern: str, *flags: str) -> dict:
    options = PipelineOptions(
        list(flags), input=pattern, output=str(tmp_path / "out"), recipe=[recipe],
        crowd_threshold=10, batch_records=7, instance=0,
    )  # fmt: skip
    return shuffle_pipeline.run(options)


def test_the_shuffler_counts_the_records_it_reads(tmp_path, monkeypatch, reports):
    counts = tmp_path / "progress"
    counts.mkdir()
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(counts))
    # The line's total: what the inputs' block headers state, without decoding them.
    assert progress_line.avro_input_records([reports[1]]) == 65
    summary = _shuffle(tmp_path, *reports)
    assert summary["read"] == 65 and summary["adds_up"]
    assert progress_counts.total(str(counts)) == summary["read"]

    # The analyzer counts the messages it reads, against the total its verified releases state.
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(tmp_path / "analyze-progress"))
    os.mkdir(tmp_path / "analyze-progress")
    stated = []
    analysis = analyze_pipeline.run(
        PipelineOptions(
            [],
            analyze_input=[str(tmp_path / "out")],
            analyze_output=str(tmp_path / "analysis"),
            analyze_recipe=[reports[0]],
        ),
        stated.append,
    )
    released = json.loads((tmp_path / "out" / "_COMMIT.json").read_text())["records_released"]
    assert stated == [released] == [summary["released"]] and released > 0
    assert progress_counts.total(str(tmp_path / "analyze-progress")) == released
    assert analysis["metrics"]["adds_up"]


def test_worker_processes_count_into_the_directory(tmp_path, monkeypatch, reports):
    counts = tmp_path / "progress"
    counts.mkdir()
    monkeypatch.setenv(progress_counts.ENVIRONMENT, str(counts))
    flags = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
    summary = _shuffle(tmp_path, *reports, *flags)
    assert progress_counts.total(str(counts)) == summary["read"] == 65
    # Written by the worker processes, none by this one.
    assert not any(name.startswith(f"{os.getpid()}-") for name in os.listdir(counts))

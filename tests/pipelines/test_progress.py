"""The progress line (pipelines/commandline/progress.py): on a terminal it shows the stage, its
count against the total with rate and time left; off a terminal it prints nothing; the device
simulation reports the device rounds it ran (simulators/progress.py)."""

from __future__ import annotations

import io
import time

from pipelines.commandline import progress as progress_line
from pipelines.commandline import stage_logs
from schemas.recipes import load_recipe
from simulators import progress
from simulators.plan import SimulationPlan
from simulators.shards import PROGRESS_COUNTER, ShardContext, simulate_shard


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


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
    assert "simulate:  50%" in text and "simulate: 100%" in text
    assert "1.00k/1.00k" in text and "devices/s]" in text and "<00:00" in text  # rate, time left
    assert text.endswith("\r")  # the line is cleared when the stage ends


def test_nothing_is_printed_off_a_terminal(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(stage_logs, "_TERMINAL", [stream])
    with progress_line.stage_progress("shuffle", delay=0):
        time.sleep(0.1)
    assert stream.getvalue() == ""


def test_the_simulation_counts_device_rounds():
    plan = SimulationPlan.for_recipe(load_recipe("small_binary_rr"), "zipf", 3, respondents=700)
    context = ShardContext(plan)
    progress.reset(PROGRESS_COUNTER)
    for shard in context.shards():
        list(simulate_shard(context, shard))
    assert progress.read(PROGRESS_COUNTER) == 700

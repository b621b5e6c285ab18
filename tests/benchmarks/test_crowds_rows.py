"""bench_crowds' analysis rate row: ``esa analyze`` as run given no runner flags, against the
same analysis in one process."""

from __future__ import annotations

import pytest

from benchmarks.bench_crowds import ANALYZE_CROWDS_PER_S, analyze_rate_row


def test_the_rate_is_the_default_runs_and_the_baseline_one_process():
    default = {"crowds": 99_518, "seconds": 2.0, "workers": 9}
    one = {"crowds": 99_518, "seconds": 4.0}
    tenth = {"crowds": 9_959, "seconds": 2.1}
    row = analyze_rate_row(default, one, tenth)
    assert row["value"] == pytest.approx(99_518 / 2.0)
    assert row["baseline"] == pytest.approx(99_518 / 4.0) and row["ratio"] == pytest.approx(2.0)
    assert "on 9 worker processes" in row["note"] and row["note"].endswith(": met")
    slow = analyze_rate_row({**default, "seconds": 99_518 / (ANALYZE_CROWDS_PER_S - 1)}, one, tenth)
    assert slow["note"].endswith(": not met")
    single = analyze_rate_row({**default, "workers": 1}, one, tenth)
    assert "on 1 worker process (" in single["note"]

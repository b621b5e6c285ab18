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


def test_crowds_of_many_sizes_hold_as_many_respondents_as_drawn(tmp_path):
    """crowd_sizes: fixed by its seed, none below the uniform crowds' size, many distinct; the
    report files generate() writes of them hold crowd i's messages from sizes[i] respondents
    (fewer origins where a respondent's randomized bits were all 0: about 1 in 10 here)."""
    import collections

    import fastavro

    from benchmarks.bench_crowds import (
        CHANNELS,
        RESPONDENTS_PER_CROWD,
        T0,
        WINDOWS,
        crowd_sizes,
        generate,
    )

    sizes = crowd_sizes(400)
    assert (sizes == crowd_sizes(400)).all() and sizes.min() >= RESPONDENTS_PER_CROWD
    assert len(set(sizes.tolist())) > 40
    generate(tmp_path, 60, sizes=sizes[:60])
    origins = collections.defaultdict(set)
    for path in sorted(tmp_path.glob("*.avro")):
        with open(path, "rb") as handle:
            for record in fastavro.reader(handle):
                day = int(record["event_time"].timestamp()) // 86_400
                key = (record["channel"], day, record["crowd_id"])
                origins[key].add(record["origin"])
    assert len(origins) == 60
    t0_day = T0 // 86_400_000
    seen = [
        len(origins[(f"crowds{c % CHANNELS}", t0_day + (c // CHANNELS) % WINDOWS, f"c{c // (CHANNELS * WINDOWS):06d}")])
        for c in range(60)
    ]  # fmt: skip
    assert all(0 < count <= size for count, size in zip(seen, sizes[:60].tolist(), strict=True))
    assert sum(seen) >= 0.8 * sizes[:60].sum()


def test_the_command_row_is_the_commands_seconds_against_the_analysis_alone():
    from benchmarks.bench_crowds import command_row

    row = command_row({"seconds": 6.0, "pictures": 24}, {"crowds": 99_518, "seconds": 3.0})
    assert (row["benchmark"], row["metric"]) == ("crowds_command", "wall_s")
    assert (row["value"], row["baseline"], row["ratio"]) == (6.0, 3.0, 2.0)
    assert "99,518 crowds" in row["note"] and "24 pictures" in row["note"]


def test_the_command_is_timed_as_a_user_runs_it(tmp_path):
    """analyze_command: esa analyze in a fresh process over a release, with its pictures; a
    refused one raises with its error line."""
    from benchmarks import bench_crowds
    from benchmarks.bench_crowds import analyze_command

    recipes, shuffled = bench_crowds.shuffled_release(tmp_path, 40)
    assert shuffled["adds_up"]
    done = analyze_command(tmp_path / "shuffled", tmp_path / "analysis", recipes)
    assert done["seconds"] > 0 and done["pictures"] > 0
    assert (tmp_path / "analysis" / "report.html").is_file()
    with pytest.raises(RuntimeError, match="no_such_dir"):
        analyze_command(tmp_path / "no_such_dir", tmp_path / "other", recipes)

"""benchmarks/history.py: the history row comes from bench.json's rows, and rows are appended
to the README's table (its header written once)."""

from __future__ import annotations

from benchmarks import bench_scaling, history

RESULTS = {
    "meta": {"quick": True, "started": "2026-11-26T14:00:00+00:00", "cores": 2,
             "load_before": [1.234, 1.0, 0.9]},
    "rows": [
        {"benchmark": "shuffle", "metric": "messages_per_s", "value": 5e5, "ratio": 2.345},
        {"benchmark": "analyze", "metric": "messages_per_s", "value": 7e5, "ratio": 3.1},
        {"benchmark": "crowds_analyze", "metric": "crowds_per_s", "value": 31234.6},
        {"benchmark": "scaling", "metric": "shuffle_direct_1w_messages_per_s", "ratio": 1.0},
        {"benchmark": "scaling", "metric": "shuffle_direct_2w_messages_per_s", "ratio": 1.51},
        {"benchmark": "scaling", "metric": "shuffle_direct_16w_messages_per_s", "ratio": 9.5},
        {"benchmark": "scaling", "metric": "shuffle_prism_16w_messages_per_s", "ratio": 1.0},
        {"benchmark": "scaling", "metric": "analyze_direct_2w_messages_per_s"},
        {"benchmark": "make_run", "metric": "wall_s", "value": 28.44},
    ],
}  # fmt: skip


def test_the_row_quotes_bench_json():
    row = history.history_row(RESULTS, commit="abc1234")
    assert row == (
        "| 2026-11-26 14:00:00 | quick | abc1234 | 2 | 1.23 | 2.35 | 3.10 | 31,235 "
        "| 9.50x (16 w) | - | 28.4 |"
    )
    empty = history.history_row({"meta": {}, "rows": []}, commit="-")
    assert empty == "| - | full | - | - | - | - | - | - | - | - | - |"  # nothing measured


def test_rows_are_appended_under_one_header(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\n\n{history.START}\n{history.END}\n\nMore text.\n")
    history.append_row(readme, "| first |")
    history.append_row(readme, "| second |")
    text = readme.read_text()
    assert text.count("| date (UTC) |") == 1
    assert text.index("| first |") < text.index("| second |") < text.index(history.END)
    assert text.endswith(f"{history.END}\n\nMore text.\n")


def test_scaling_workers_default_to_one_two_and_every_core(monkeypatch):
    monkeypatch.setattr(bench_scaling.os, "cpu_count", lambda: 1)
    assert bench_scaling.default_workers() == [1]
    monkeypatch.setattr(bench_scaling.os, "cpu_count", lambda: 2)
    assert bench_scaling.default_workers() == [1, 2]
    monkeypatch.setattr(bench_scaling.os, "cpu_count", lambda: 16)
    assert bench_scaling.default_workers() == [1, 2, 16]
    assert bench_scaling.devices_for(False, [1, 4, 16]) == 640_000
    assert bench_scaling.devices_for(False, [1, 2]) == bench_scaling.FULL_DEVICES


def test_scaling_speed_ups_are_against_one_worker_of_the_same_engine():
    measured = {
        ("shuffle", 1): {"rate": 100.0, "read": 1000, "wall": 10.0},
        ("shuffle", 2): {"rate": 170.0, "read": 1000, "wall": 5.9},
        ("analyze", 1): {"rate": 50.0, "read": 900, "wall": 18.0},
        ("analyze", 2): {"error": "failed: boom"},
    }
    contexts = {"shuffle": "4x the devices", "analyze": "the analyzer's devices"}
    rows = {r["metric"]: r for r in bench_scaling._rows_for("direct", measured, [1, 2], contexts)}
    assert rows["shuffle_direct_2w_messages_per_s"]["ratio"] == 1.7
    assert rows["shuffle_direct_2w_messages_per_s"]["note"].endswith("4x the devices")
    assert rows["analyze_direct_1w_messages_per_s"]["note"].endswith("the analyzer's devices")
    assert "target >= 1.5x" in rows["shuffle_direct_2w_messages_per_s"]["note"]
    assert rows["analyze_direct_1w_messages_per_s"]["ratio"] == 1.0
    assert "value" not in rows["analyze_direct_2w_messages_per_s"]
    assert rows["analyze_direct_2w_messages_per_s"]["note"] == "failed: boom"


def test_full_mode_shuffles_more_devices_than_the_analyzer_reads():
    """The shuffle rows' own workload in full mode (at the analyzer's size its work is small
    against the fixed cost of a run); quick mode and explicit sizes use one simulation."""
    assert bench_scaling.shuffle_devices_for(False, 160_000) == 4 * 160_000
    assert bench_scaling.shuffle_devices_for(True, 40_000) == 40_000
    assert bench_scaling.devices_for(False, [1, 2]) == bench_scaling.FULL_DEVICES
    assert bench_scaling.devices_for(False, [1, 16]) == 16 * bench_scaling.DEVICES_PER_WORKER


def test_the_scaling_table_quotes_the_rows():
    rows = [
        {"benchmark": "scaling", "metric": "shuffle_direct_1w_messages_per_s", "value": 119963.2,
         "ratio": 1.0, "note": "speed-up vs 1 worker; 962,472 messages in 8.0 s; 16 cores"},
        {"benchmark": "scaling", "metric": "shuffle_direct_16w_messages_per_s", "value": 1.8e5,
         "ratio": 1.4847, "note": "speed-up vs 1 worker; 962,472 messages in 5.4 s"},
        {"benchmark": "scaling", "metric": "analyze_direct_1w_messages_per_s", "value": 10041.0,
         "ratio": 1.0, "note": "1,284,119 messages in 127.9 s"},
        {"benchmark": "scaling", "metric": "analyze_direct_16w_messages_per_s", "value": 9.0e4,
         "ratio": 8.987, "note": "1,284,119 messages in 14.2 s"},
        {"benchmark": "scaling", "metric": "analyze_prism_16w_messages_per_s", "value": 1.0,
         "ratio": 0.5, "note": "another engine: not in the direct table"},
    ]  # fmt: skip
    assert history.scaling_table({"rows": rows}).splitlines() == [
        "| stage | 1 worker | 16 workers |",
        "|---|---|---|",
        "| `shuffle` | 119,963 msg/s (8.0 s) | 1.48x (5.4 s) |",
        "| `analyze` | 10,041 msg/s (127.9 s) | 8.99x (14.2 s) |",
    ]


def test_a_scaling_run_of_its_own_names_its_size_as_the_mode():
    results = {"meta": {"mode": "320,000 devices", "cores": 16}, "rows": RESULTS["rows"]}
    assert history.history_row(results, commit="abc1234").startswith(
        "| - | 320,000 devices | abc1234 | 16 |"
    )

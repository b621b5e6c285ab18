"""esa shuffle given no runner flags: a large input runs on the multi-process DirectRunner, one
worker per CPU (``pipelines.shuffle.worker_processes``), its files read in ranges of blocks
(``pipelines.shuffle.range_records``), and its release is the same shuffle's: every message
accounted for; ``max_processes`` (esa run's shuffles side by side) caps it."""

from __future__ import annotations

from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from pipelines import shuffle as shuffle_pipeline
from pipelines.commandline import flags
from tests.transforms import report_factory as rf

RESPONDENTS, MESSAGES = 40, 3


def _inputs(tmp_path: Path) -> tuple[str, str]:
    recipe, fields = rf.write_recipe(tmp_path, "processes_test", min_crowd_size=5)
    records = rf.crowd(RESPONDENTS, MESSAGES, **fields)
    (tmp_path / "reports").mkdir()
    for part in range(2):  # two files of small blocks (sync_interval in bytes), cut into ranges
        rf.write_reports(
            tmp_path / "reports" / f"r{part}.avro", records[part::2], sync_interval=1500
        )
    return recipe, str(tmp_path / "reports" / "*.avro")


@pytest.fixture
def runner_modes(monkeypatch) -> list[tuple[str, int]]:
    """(direct_running_mode, direct_num_workers) of every pipeline the shuffle sets up."""
    seen: list[tuple[str, int]] = []
    original = shuffle_pipeline.with_default_runner

    def observed(options, worker_processes=1):
        chosen = original(options, worker_processes).view_as(DirectOptions)
        seen.append((chosen.direct_running_mode, chosen.direct_num_workers))
        return options

    monkeypatch.setattr(shuffle_pipeline, "with_default_runner", observed)
    monkeypatch.setattr(flags.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(shuffle_pipeline.os, "cpu_count", lambda: 2)
    return seen


def _options(recipe: str, pattern: str, output: Path) -> PipelineOptions:
    return PipelineOptions([], input=pattern, output=str(output), recipe=[recipe],
                           crowd_threshold=5)  # fmt: skip


def test_a_large_input_runs_on_a_worker_per_cpu(tmp_path, monkeypatch, runner_modes):
    recipe, pattern = _inputs(tmp_path)
    monkeypatch.setattr(shuffle_pipeline, "SPREAD_MIN_INPUT_BYTES", 1)  # every input is large
    planned = []

    def range_records(input_bytes, workers):
        planned.append((input_bytes, workers))
        return 25  # records per range: each file in about three ranges

    monkeypatch.setattr(shuffle_pipeline, "range_records", range_records)
    summary = shuffle_pipeline.run(_options(recipe, pattern, tmp_path / "release"))
    assert runner_modes == [("multi_processing", 2)]
    input_bytes = sum(path.stat().st_size for path in (tmp_path / "reports").iterdir())
    assert planned == [(input_bytes, 2)]
    assert summary["read"] == RESPONDENTS * MESSAGES and summary["adds_up"]
    assert summary["released"] == RESPONDENTS * MESSAGES


def test_a_small_input_or_a_cap_of_one_runs_in_this_process(tmp_path, monkeypatch, runner_modes):
    recipe, pattern = _inputs(tmp_path)
    small = shuffle_pipeline.run(_options(recipe, pattern, tmp_path / "small"))
    monkeypatch.setattr(shuffle_pipeline, "SPREAD_MIN_INPUT_BYTES", 1)
    capped = shuffle_pipeline.run(_options(recipe, pattern, tmp_path / "capped"), max_processes=1)
    assert runner_modes == [("in_memory", 1), ("in_memory", 1)]
    assert small["released"] == capped["released"] == RESPONDENTS * MESSAGES


def test_ranges_are_about_four_per_worker_and_never_small():
    least = shuffle_pipeline.MIN_RANGE_RECORDS
    per_report = shuffle_pipeline.BYTES_PER_REPORT
    assert shuffle_pipeline.range_records(0, 16) == least
    assert shuffle_pipeline.range_records(per_report * 10_000_000, 2) == 1_250_000
    assert shuffle_pipeline.range_records(per_report * 10_000_000, 16) == 156_250
    assert shuffle_pipeline.range_records(per_report * 1_000_000, 16) == least

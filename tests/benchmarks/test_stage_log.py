"""The benchmarks' stage log names FnApiRunner's fused stages by their own first step and times
them (benchmarks/stage_log.py)."""

from __future__ import annotations

import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from benchmarks import stage_log

READ_STAGE = (
    "((((SpreadFiles/ReshufflePerKey/GroupByKey/Read)+(ref_AppliedPTransform_SpreadFiles-"
    "ReshufflePerKey-FlatMap-restore_metadata_default_window-_13))+(ref_AppliedPTransform_"
    "SpreadFiles-RemoveRandomKeys_14))+(ref_AppliedPTransform_Shuffle-ReadReportFile-ParDo-"
    "ReadReportFile-_23))+(ref_AppliedPTransform_Shuffle-ValidateBatch-ParDo-ValidateBatch-_27)"
)
SEED_STAGE = (
    "(((ref_AppliedPTransform_Shuffle-OriginKeySeed-Impulse_24)+(ref_AppliedPTransform_Shuffle-"
    "OriginKeySeed-FlatMap-lambda-at-core-py-4094-_25))+(ref_AppliedPTransform_Shuffle-"
    "OriginKeySeed-Map-decode-_27))+(ref_AppliedPTransform_Shuffle-DrawOriginKey_28)"
)


def test_short_names_skip_beams_plumbing():
    assert stage_log.short_stage_name(READ_STAGE) == "Shuffle-ReadReportFile"
    assert stage_log.short_stage_name(SEED_STAGE) == "Shuffle-DrawOriginKey"
    only_plumbing = "(Group/Read)+(Group/Write)"
    assert stage_log.short_stage_name(only_plumbing) == "Group/Read"


def test_a_pipelines_stages_are_timed_and_the_slow_one_named_first():
    def slow(value: int) -> int:
        time.sleep(0.3)
        return value

    stage_log.record_stages()
    stage_log.record_stages()  # once
    started = time.perf_counter()
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        (
            pipeline
            | beam.Create([1, 2], reshuffle=False)
            | "Spread" >> beam.Reshuffle()
            | "Sleepy" >> beam.Map(slow)
        )
    wall = time.perf_counter() - started
    summary = stage_log.stage_summary(wall, top=2)
    name, seconds = summary["slowest"][0]
    assert name == "Sleepy" and 0.6 <= seconds <= wall
    assert summary["stages"] >= 2 and 0 <= summary["outside_s"] < wall
    text = stage_log.describe(summary)
    assert text.startswith("stages: Sleepy ") and f"its {summary['stages']} stages" in text
    assert stage_log.describe({"stages": 0, "slowest": [], "outside_s": 1.0}) == ""

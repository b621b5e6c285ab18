"""FnApiRunner's multi-process stages go only to the workers their input reaches
(pipelines/engines/busy_bundles.py)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.testing.util import assert_that, equal_to

from pipelines.commandline.flags import with_default_runner
from pipelines.engines import busy_bundles

WORKERS = 3


def test_parts_with_input_keeps_part_zero_and_every_part_holding_bytes():
    assert busy_bundles.parts_with_input([{}, {}, {}]) == [0]
    assert busy_bundles.parts_with_input([{"in": [b""]}, {"in": [b""]}, {"in": [b"x"]}]) == [0, 2]
    assert busy_bundles.parts_with_input([{"a": [], "b": [b"", b"y"]}, {"a": [b"z"]}]) == [0, 1]
    assert busy_bundles.parts_with_input([{"in": [b"x"]}, {"in": []}, {"in": [b""]}]) == [0]


class _CountBundles(beam.DoFn):
    """Counts the bundles it starts in the counter ``bundles:<name>``."""

    def __init__(self, name: str) -> None:
        self._name = name

    def finish_bundle(self) -> None:
        Metrics.counter("test", f"bundles:{self._name}").inc()

    def process(self, element):
        yield element


def _bundles_and_run() -> dict[str, int]:
    """A 3-worker pipeline: one element through one stage, sixty spread through another."""
    options = with_default_runner(
        PipelineOptions(
            ["--direct_running_mode=multi_processing", f"--direct_num_workers={WORKERS}"]
        )
    )
    pipeline = beam.Pipeline(options=options)
    single = (
        pipeline
        | "One" >> beam.Create(["seed"], reshuffle=False)
        | "CountOne" >> beam.ParDo(_CountBundles("one"))
    )
    many = (
        pipeline
        | "Many" >> beam.Create(range(60), reshuffle=False)
        | "Spread" >> beam.Reshuffle()
        | "CountMany" >> beam.ParDo(_CountBundles("many"))
    )
    assert_that(single, equal_to(["seed"]), label="OneArrives")
    assert_that(many, equal_to(list(range(60))), label="ManyArrive")
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace("test"))["counters"]
    return {c.key.metric.name: c.committed for c in counters}


def test_a_stage_runs_only_where_its_input_is():
    assert busy_bundles.send_only_busy_bundles()
    assert fn_runner.ParallelBundleManager.process_bundle is busy_bundles.process_busy_bundles
    bundles = _bundles_and_run()
    assert bundles["bundles:one"] == 1  # not one per worker
    assert bundles["bundles:many"] == WORKERS  # spread elements still reach every worker


def test_the_check_fails_with_beams_own_bundles(monkeypatch):
    """Beam's process_bundle sends the one-element stage to every worker."""
    assert busy_bundles.send_only_busy_bundles()
    monkeypatch.setattr(busy_bundles, "send_only_busy_bundles", lambda: True)
    monkeypatch.setattr(
        fn_runner.ParallelBundleManager, "process_bundle", busy_bundles.beams_process_bundle[0]
    )
    bundles = _bundles_and_run()
    assert bundles["bundles:one"] == WORKERS

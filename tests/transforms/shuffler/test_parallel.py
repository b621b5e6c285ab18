"""One crowd's work spreads over workers: on Beam's multi-process DirectRunner with 2 workers, a
single crowd in one report file, read in ranges of blocks, split into several origin shards and
output groups, is read, counted, deleted and permuted in at least as many bundles as workers
(the ``bundles:<step>`` counters, ``config.BUNDLES_PREFIX``), and its release is still whole and
in crowd order."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tests.transforms import report_factory as rf
from tests.transforms.shuffler.test_shuffle import _collect, _config, _pipeline
from transforms.shuffler import decide
from transforms.shuffler import shuffle as sh
from transforms.shuffler.read import PlanReportRanges

WORKERS = 2
RESPONDENTS, MESSAGES = 150, 2


@pytest.mark.slow  # ~25 s: worker processes start, and each stage runs apart
def test_one_crowd_is_worked_on_in_at_least_as_many_bundles_as_workers(tmp_path: Path) -> None:
    # Small blocks: the file is cut into ranges of at most 40 records, as pipelines/shuffle.py does.
    path = rf.write_reports(
        tmp_path / "r.avro", rf.crowd(RESPONDENTS, MESSAGES), sync_interval=1500
    )
    config = _config(messages_per_shard=40, messages_per_file=50)
    output, private = tmp_path / "out", tmp_path / "out.private"
    options = PipelineOptions(
        [  # FnApiRunner by name: a bare DirectRunner hands the pipeline to Prism when a Prism
            # job server is already up in the process (as in a full suite): one SDK worker.
            "--runner=FnApiRunner",
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={WORKERS}",
        ]
    )
    pipeline = beam.Pipeline(options=options)
    _pipeline(
        pipeline,
        beam.Create([path]) | beam.ParDo(PlanReportRanges(40)) | beam.Reshuffle(),
        output,
        private,
        config,
    )
    result = pipeline.run()
    result.wait_until_finish()
    release = _collect(output, private, False, result)

    total = RESPONDENTS * MESSAGES
    assert release.metrics["adds_up"] and release.metrics["released"] == total
    assert len(release.manifests) == 1  # one crowd...
    assert len(release.files) == 1 << decide.split_bits(total, 50)  # ...written in 8 files
    for step in ("ReadReportFile", "CountShard", "DeleteAndScatter", "PermuteGroup"):
        assert release.counters[sh.BUNDLES_PREFIX + step] >= WORKERS, step

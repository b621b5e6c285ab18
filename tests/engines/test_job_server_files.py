"""The Flink job server ``esa run`` starts (``runners.one_job_server``) keeps its JVM's
temporary files in a directory of its own, removed when it stops: its embedded cluster unpacks
its RPC system (a 21 MB ``flink-rpc-akka*.jar``) and keeps a ``minicluster_*`` directory there,
which used to stay in the system's temporary directory whenever Flink did not remove them
itself (a test run of ``esa run`` on Flink left both every time)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.engines import runners
from pipelines.engines.new_pipeline import new_pipeline

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
]


def test_the_flink_job_servers_temporary_files_go_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        flags = runners.runner_flags("flink")
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    runners.quiet_worker_hangups()  # the job-end hang-up of the LOOPBACK worker's channel
    with runners.one_job_server(flags) as shared:
        (java_temp,) = tmp_path.glob("esa-flink-job-server-*")
        with new_pipeline(PipelineOptions(shared)) as pipeline:
            _ = pipeline | beam.Create([1, 2]) | beam.Map(lambda value: value + 1)
        # the embedded cluster's files went there
        assert any(path.name.startswith("minicluster_") for path in java_temp.iterdir())
    assert not java_temp.exists()
    # and nothing else stays (but Beam's requirements cache, one directory kept by design)
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left in ([], ["beam-requirements-cache"])

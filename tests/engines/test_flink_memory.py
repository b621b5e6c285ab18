"""A standalone Flink cluster's TaskManager has the direct memory its slots' gRPC streams to SDK
workers take (``flink_cluster.GRPC_OFF_HEAP_MB_PER_SLOT``): a step slower than its input, on
two slots, used to run it out of direct memory ("OutOfMemoryError: Direct buffer memory", the
job failed with "call is closed"), every time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipelines.engines import runners
from pipelines.engines.flink_cluster import FlinkCluster

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ELEMENTS = 400
ELEMENT_BYTES = 2_000_000  # a gRPC message each (Beam's runner flushes from ~1 MB)

# A fresh interpreter (this one has pytest's threads, so it would not fork SDK workers): 400
# elements of 1 MB through a grouping to a step that takes 50 ms each, on 2 slots and 2 forked
# SDK workers; the count printed last.
_DRIVER = r"""
import sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines.commandline.flags import with_default_runner
from pipelines.engines import runners

master, elements, element_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def slow(element):
    time.sleep(0.05)
    return len(element[1])

flags = runners.runner_flags("flink_cluster", 2, master)
with beam.Pipeline(options=with_default_runner(PipelineOptions(flags))) as pipeline:
    (pipeline
     | beam.Create(range(4))
     | beam.FlatMap(lambda key: ((key, index, bytes(element_bytes))
                                 for index in range(elements // 4)))
     | beam.Map(lambda element: (element[0] * elements + element[1], element[2]))
     | beam.Reshuffle()
     | beam.Map(slow)
     | beam.CombineGlobally(sum)
     | beam.Map(lambda total: print("TOTAL", total, flush=True)))
"""


def test_a_step_slower_than_its_input_on_two_slots_does_not_fail_the_job() -> None:
    lib = runners.flink_cluster_lib()
    if lib is None:
        pytest.skip("no assembled Flink jars for a standalone cluster: run `make engines`")
    with FlinkCluster(lib, slots=2, restart_attempts=0) as cluster:  # a failure is not retried
        done = subprocess.run(
            [sys.executable, "-c", _DRIVER, cluster.master, str(ELEMENTS), str(ELEMENT_BYTES)],
            capture_output=True, text=True, timeout=300, cwd=os.getcwd(),
        )  # fmt: skip
        log = (cluster.work / "taskmanager.log").read_text(errors="replace")
    assert "Direct buffer memory" not in log
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"TOTAL {ELEMENTS * ELEMENT_BYTES}" in done.stdout

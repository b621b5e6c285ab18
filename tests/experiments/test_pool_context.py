"""experiments.sketch.pool_context: the experiments' worker processes are forked only from a
process where no other thread runs (a fork of a process that had run a Beam pipeline, with gRPC's
threads alive, died in ``os.fork``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from experiments.sketch import pool_context

_ASK = "from experiments.sketch import pool_context; print(pool_context().get_start_method())"
_AFTER_A_PIPELINE = """
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
flags = ["--runner=FnApiRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
with beam.Pipeline(options=PipelineOptions(flags)) as pipeline:
    pipeline | beam.Create(range(4)) | beam.Reshuffle()
""" + _ASK.replace("; ", "\n")


def _start_method(code: str) -> str:
    environment = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


@pytest.mark.skipif(sys.platform != "linux", reason="fork and /proc: Linux")
def test_a_fresh_process_forks_and_one_that_ran_a_pipeline_spawns():
    assert _start_method(_ASK) == "fork"
    assert _start_method(_AFTER_A_PIPELINE) == "spawn"


def test_another_thread_means_spawn():
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert pool_context().get_start_method() == "spawn"
    finally:
        stop.set()
        other.join()

"""FnApiRunner's workers are closed together at the end of a pipeline
(pipelines/engines/worker_shutdown.py)."""

from __future__ import annotations

import logging
import sys
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner, worker_handlers
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import environments

from pipelines.commandline.flags import with_default_runner
from pipelines.engines import worker_shutdown


class _Handler:
    """A worker handler whose ``close`` returns only once ``parties`` closes are under way."""

    def __init__(self, barrier: threading.Barrier, closed: list, fails: bool = False) -> None:
        self._barrier, self._closed, self._fails = barrier, closed, fails

    def close(self) -> None:
        self._barrier.wait()  # closed one after another, the first waits in vain
        self._closed.append(self)
        if self._fails:
            raise RuntimeError("this worker would not stop")


def _manager(handlers: dict) -> worker_handlers.WorkerHandlerManager:
    manager = worker_handlers.WorkerHandlerManager({}, None)
    manager._cached_handlers.update(handlers)
    manager._workers_by_id.update({str(i): h for i, h in enumerate(handlers["env"])})
    return manager


def test_every_handler_is_closed_once_and_at_the_same_time(caplog) -> None:
    closed: list = []
    barrier = threading.Barrier(4, timeout=20)
    handlers = [_Handler(barrier, closed) for _ in range(3)] + [_Handler(barrier, closed, True)]
    manager = _manager({"env": [*handlers, handlers[0]]})  # listed twice, closed once
    with caplog.at_level(logging.ERROR, logger=worker_shutdown.__name__):
        worker_shutdown.close_all_together(manager)
    assert sorted(map(id, closed)) == sorted(map(id, handlers))
    assert not barrier.broken
    # One handler's failure is logged, as Beam's loop does, and the others still close.
    assert [r.message for r in caplog.records if "would not stop" in (r.exc_text or "")] == [
        f"Error closing worker_handler {handlers[3]}"
    ]
    assert dict(manager._cached_handlers) == {} and manager._workers_by_id == {}
    assert manager._grpc_server is None


def test_the_check_fails_for_closes_one_after_another() -> None:
    """Beam's own loop over the same handlers: the first close waits for the others in vain."""
    barrier = threading.Barrier(2, timeout=0.2)
    closed: list = []
    handlers = [_Handler(barrier, closed), _Handler(barrier, closed)]
    with pytest.raises(threading.BrokenBarrierError):
        for handler in handlers:
            handler.close()
    assert closed == []


def test_pipelines_install_it_and_multi_process_runs_end() -> None:
    options = with_default_runner(
        PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=3"])
    )
    assert worker_handlers.WorkerHandlerManager.close_all is worker_shutdown.close_all_together
    with beam.Pipeline(options=options) as pipeline:
        doubled = (
            pipeline
            | beam.Create(range(60))
            | beam.Reshuffle()
            | beam.Map(lambda value: 2 * value)
            | beam.CombineGlobally(sum)
        )
        assert_that(doubled, equal_to([2 * sum(range(60))]))


LINGER_S = 15  # each worker process lives this long after its harness has ended (a loaded
# machine starts 2 workers and runs the pipeline well within it)


@pytest.mark.slow  # the lingering workers are waited for at its end
def test_the_pipeline_returns_before_its_worker_processes_have_exited() -> None:
    """Worker processes that linger after their last bundle (a shell that sleeps once the SDK
    harness ends) do not hold the pipeline up; their threads still reap them."""
    worker_shutdown.close_workers_together()
    command = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main; sleep {LINGER_S}"
    runner = FnApiRunner(
        default_environment=environments.SubprocessSDKEnvironment.from_command_string(command)
    )
    started = time.monotonic()
    with beam.Pipeline(runner=runner, options=PipelineOptions(["--direct_num_workers=2"])) as p:
        total = p | beam.Create(range(40)) | beam.Reshuffle() | beam.CombineGlobally(sum)
        assert_that(total, equal_to([sum(range(40))]))
    returned = time.monotonic() - started
    winding_down = [t for t in threading.enumerate() if t.name == "run_worker" and t.is_alive()]
    for thread in winding_down:
        thread.join(timeout=3 * LINGER_S)
    assert returned < LINGER_S and len(winding_down) == 2
    assert not any(thread.is_alive() for thread in winding_down)

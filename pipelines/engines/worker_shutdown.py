"""Close FnApiRunner's SDK workers together, not one after another.

FnApiRunner ends every pipeline with ``WorkerHandlerManager.close_all``, which closes its worker
handlers in a loop. In the multi-process mode (``--direct_running_mode=multi_processing``) a
handler's ``close`` waits for its worker process to exit, about 0.5 s each (the SDK harness's own
shutdown), so a run's last stage was followed by 0.5 s per worker of waiting: measured on a
16-core machine, the time from ``esa analyze``'s last stage to its end was ~0 s with 1 worker,
2.4 s with 4 and 8 s with 16 (``close_all`` timed at 0.5 s per handler here too).

:func:`close_workers_together` replaces ``close_all`` with one that closes each handler in its
own thread and waits for all of them, logging a handler's failure as the original does; what is
closed, and the state left behind, are the same. A worker process (Beam's
``SubprocessSdkWorkerHandler``) is not waited for: once its control stream is closed it has run
every bundle and only winds down (~0.4 s on 2 cores, measured as the last stage's time of a
2-worker shuffle: 0.46-0.48 s waited, 0.10 s not), so the pipeline returns and the worker exits
beside what comes next; its thread (``run_worker``, which reaps the process and stops its
logging server) still ends before the interpreter does, and :func:`wait_for_workers` waits for
such threads where a worker must be gone (a fork server is stopped only after its workers). It is installed by
``pipelines.commandline.flags.with_default_runner``, which every pipeline passes through. If the
installed Beam's ``WorkerHandlerManager`` lacks the attributes this relies on, the original is
kept.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from pipelines.engines.install_once import install_once

__all__ = ["close_all_together", "close_workers_together", "wait_for_workers"]

_LOGGER = logging.getLogger(__name__)
_ATTRIBUTES = ("_cached_handlers", "_workers_by_id", "_grpc_server")
_winding_down: list[threading.Thread] = []  # run_worker threads of closed, unjoined workers


def close_all_together(manager: Any) -> None:
    """``WorkerHandlerManager.close_all``, with the handlers closed concurrently."""
    handlers = {handler for listed in manager._cached_handlers.values() for handler in listed}

    def close(handler: Any) -> None:
        try:
            if isinstance(handler, _subprocess_handler()) and hasattr(handler, "worker_thread"):
                handler.stop_worker = _winds_down_alone  # this handler only: not joined
                _winding_down.append(handler.worker_thread)
            handler.close()
        except Exception:  # noqa: BLE001 - logged per handler, as the original loop does
            _LOGGER.error("Error closing worker_handler %s", handler, exc_info=True)

    threads = [threading.Thread(target=close, args=(h,), name="close_worker") for h in handlers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manager._cached_handlers = collections.defaultdict(list)
    manager._workers_by_id = {}
    if manager._grpc_server is not None:
        manager._grpc_server.close()
        manager._grpc_server = None


def _subprocess_handler() -> type:
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    return worker_handlers.SubprocessSdkWorkerHandler


def _winds_down_alone() -> None:
    """A closed worker process's ``stop_worker``: its ``run_worker`` thread waits for it."""


def wait_for_workers(timeout_s: float = 60.0) -> None:
    """Wait (at most ``timeout_s`` in all) until the worker processes of closed pipelines have
    exited."""
    deadline = time.monotonic() + timeout_s
    while _winding_down:
        thread = _winding_down.pop()
        thread.join(max(0.0, deadline - time.monotonic()))


@install_once
def close_workers_together() -> bool:
    """Install :func:`close_all_together` as FnApiRunner's ``close_all`` (once; idempotent).
    Returns whether it is installed."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    manager = worker_handlers.WorkerHandlerManager
    probe = manager.__init__.__code__.co_names
    fits = all(name in probe for name in _ATTRIBUTES) and callable(
        getattr(manager, "close_all", None)
    )
    if fits:
        manager.close_all = close_all_together
    return fits

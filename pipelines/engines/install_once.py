"""Installing a change to Beam at most once per process.

The modules here that patch Beam (``busy_bundles.py``, ``dofn_specs.py``,
``pickle_compression.py``, ``process_workers.py``, ``state_sampling.py``, ``worker_shutdown.py``,
``yield_checks.py``; and the benchmarks' ``stage_log.py``) are called
from every pipeline's options (``with_default_runner``) and from ``esa run``'s fork server:
:func:`install_once` makes their install functions run once, under a lock, and return what the
first call returned (whether the change fits the installed Beam and is in place) to every later
call, whatever its arguments.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["install_once"]


def install_once(install: Callable[..., bool]) -> Callable[..., bool]:
    """``install`` run by its first call only; every call returns that call's result."""
    lock = threading.Lock()
    result: list[bool] = []

    @functools.wraps(install)
    def once(*args: Any, **kwargs: Any) -> bool:
        with lock:
            if not result:
                result.append(bool(install(*args, **kwargs)))
            return result[0]

    return once

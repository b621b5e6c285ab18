"""In-process progress counters: the device simulation adds the device rounds it has run, and the
command line's progress line (``pipelines/commandline/progress.py``) reads them. A worker in
another process (multi-process or portable runners) counts in its own copy, and the line then
shows the elapsed time only."""

from __future__ import annotations

import threading

__all__ = ["add", "read", "reset"]

_LOCK = threading.Lock()
_COUNTS: dict[str, int] = {}


def add(name: str, amount: int) -> None:
    with _LOCK:
        _COUNTS[name] = _COUNTS.get(name, 0) + int(amount)


def read(name: str) -> int:
    with _LOCK:
        return _COUNTS.get(name, 0)


def reset(name: str) -> None:
    with _LOCK:
        _COUNTS.pop(name, None)

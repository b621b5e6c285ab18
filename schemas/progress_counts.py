"""Progress counts across the processes of one host: workers add the records (or device rounds)
they have done, the command line's progress line (``pipelines/commandline/progress.py``) sums them.

The command names a directory in ``$ESA_PROGRESS_DIR`` before the pipeline starts; worker
processes (the multi-process DirectRunner's, ``esa run``'s parallel shufflers) inherit it. Each
process keeps its running total and writes it, as one decimal integer, to its own file
``<pid>-<random>.count`` there (written aside and renamed, so a reader never sees half a
number): at most every :data:`WRITE_SECONDS` when it adds, and whenever :func:`flush` is called
(the end of each file or shard read). The driver sums the files (:func:`total`). A file holds a
count and nothing else: no record, payload, key or path.

Without ``$ESA_PROGRESS_DIR`` (not on a terminal, ``ESA_PROGRESS=0``) :func:`add` returns at
once; where the directory does not exist (a worker on another machine) nothing is written and
nothing fails. Called per batch, never per record.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

__all__ = ["ENVIRONMENT", "WRITE_SECONDS", "add", "counted", "flush", "total"]

ENVIRONMENT = "ESA_PROGRESS_DIR"
WRITE_SECONDS = 0.5
SUFFIX = ".count"

Item = TypeVar("Item")


class _Process:
    """This process's running totals per progress directory (reset in a forked child)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name = f"{self.pid}-{secrets.token_hex(4)}{SUFFIX}"
        self.totals: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.last_write: dict[str, float] = {}


_LOCK = threading.Lock()
_STATE = [_Process()]


def _state() -> _Process:
    if _STATE[0].pid != os.getpid():  # a forked child counts its own work only
        _STATE[0] = _Process()
    return _STATE[0]


def _write(state: _Process, directory: str) -> None:
    """Replace this process's file in ``directory`` with its total; nothing if there is none."""
    value = state.totals.get(directory, 0)
    state.last_write[directory] = time.monotonic()
    if state.written.get(directory) == value or not os.path.isdir(directory):
        return
    path = os.path.join(directory, state.name)
    aside = os.path.join(directory, "." + state.name)
    with contextlib.suppress(OSError):  # the directory went away: the stage is over
        with open(aside, "w") as handle:
            handle.write(str(value))
        os.replace(aside, path)
        state.written[directory] = value


def add(amount: int) -> None:
    """Add ``amount`` done to this process's total; written at most every WRITE_SECONDS."""
    directory = os.environ.get(ENVIRONMENT)
    if not directory:
        return
    with _LOCK:
        state = _state()
        state.totals[directory] = state.totals.get(directory, 0) + int(amount)
        if time.monotonic() - state.last_write.get(directory, -WRITE_SECONDS) >= WRITE_SECONDS:
            _write(state, directory)


def flush() -> None:
    """Write this process's total now (the end of a file, shard or bundle)."""
    directory = os.environ.get(ENVIRONMENT)
    if not directory:
        return
    with _LOCK:
        state = _state()
        if directory in state.totals:
            _write(state, directory)


def counted(items: Iterable[Item], size: Callable[[Item], int]) -> Iterator[Item]:
    """``items``, adding ``size(item)`` for each (a batch: never one record at a time) before
    it is handed on, and flushing when they run out."""
    try:
        for item in items:
            add(size(item))
            yield item
    finally:
        flush()


def total(directory: str) -> int:
    """The sum of the counts the processes wrote into ``directory`` (0 when there is none)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    found = 0
    for name in names:
        if name.startswith(".") or not name.endswith(SUFFIX):
            continue
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(directory, name)) as handle:
                found += int(handle.read())
    return found

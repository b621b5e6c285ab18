"""Give memory that a step freed back to the operating system (the shuffler's column batches).

A step that decodes, sorts and spills a batch of tens of thousands of rows allocates and frees
tens of megabytes. Both allocators involved keep freed pages for reuse instead of returning them:
Arrow's memory pool (mimalloc or jemalloc) and glibc's malloc (numpy's arrays, Python objects),
whose heap fragments as batches of different sizes come and go. Peak RSS then grows with the
number of batches a worker processes, i.e. with the input's size, though each batch is freed
(measured on the 7 batches of 51,567 rows of benchmarks/bench_crowds.py's 328,399 messages, read,
validated and spilled one after another: RSS +70 MB after the last batch, +22 MB with
:func:`release_freed_memory` after each). Calling it after each batch keeps a worker's memory
at about one batch's, whatever the number of batches; it costs a few milliseconds.

Returning pages has a price beyond the call: the next batch takes them back from the operating
system, a page fault and a zeroed page each (a quarter to a third of the CPU time of
bench_shuffle's 10,000,000-message shuffle was the kernel's). :class:`MemoryReleaser` therefore
returns them only once the resident set has grown :data:`RELEASE_MARGIN_BYTES` past where the
last release left it: memory stays flat in the input (within that margin), and most batches
reuse the pages the one before freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows).
    Looked up among the symbols the interpreter already has loaded (its C library's) before
    by name: ``ctypes.util.find_library`` runs ``ldconfig -p`` in a subprocess, a fork of a
    worker of hundreds of megabytes on every worker's first batch."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        try:
            trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
        except (OSError, AttributeError, TypeError):
            return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> None:
    """Return the pages freed since the last call to the operating system: Arrow's pool first
    (``MemoryPool.release_unused``), then glibc's heap (``malloc_trim(0)``) where there is one."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# How far a worker's resident set may grow past where its last release left it before freed
# pages are returned again: a few batches' growth without releases (about 10 MB per batch of
# 51,567 reports, above); the 200 batches of bench_shuffle's 10,000,000 messages release once.
RELEASE_MARGIN_BYTES = 32 << 20


def resident_bytes() -> int | None:
    """This process's resident set size in bytes (``/proc/self/statm``), or None where the
    system has no such file."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryReleaser:
    """:func:`release_freed_memory`, called after each batch, that returns pages only when the
    resident set (``resident``: :func:`resident_bytes`) has grown more than ``margin`` bytes
    past where the previous release left it; always where the resident set cannot be read.
    A worker's memory then stays within ``margin`` of one batch's, and the batches in between
    reuse freed pages instead of faulting in new ones."""

    def __init__(
        self,
        margin: int = RELEASE_MARGIN_BYTES,
        resident: Callable[[], int | None] = resident_bytes,
        release: Callable[[], None] = release_freed_memory,
    ) -> None:
        if int(margin) < 0:
            raise ValueError(f"margin must be >= 0 bytes, got {margin}")
        self._margin, self._resident, self._release = int(margin), resident, release
        self._floor: int | None = None  # the resident set just after the last release

    def __call__(self) -> bool:
        """Release if the resident set grew past the margin (or is unknown); returns whether
        it released."""
        now = self._resident()
        if now is not None and self._floor is not None and now <= self._floor + self._margin:
            return False
        self._release()
        self._floor = self._resident()
        return True

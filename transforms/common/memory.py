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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import pyarrow as pa


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        library = ctypes.CDLL(name)
        trim = library.malloc_trim
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

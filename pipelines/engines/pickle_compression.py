"""Beam's bz2 compression of pickled DoFns, done once per distinct input in a process.

Beam pickles every DoFn of a pipeline with cloudpickle and compresses the pickle with bz2 at
level 9 (``apache_beam.internal.cloudpickle_pickler.dumps``/``loads``): into the pipeline's
proto, and again in every bundle processor, which unpickles each ParDo's DoFn, pickles it again
with its windowing (``bundle_processor._create_pardo_operation``) and unpickles that. bz2 at
level 9 sets up its whole block-sorting state on each call whatever the input, so a call costs
about 0.3 ms even on a pickle of a few kilobytes, and most calls repeat an earlier input: a tiny
analysis (40 crowds) on FnApiRunner made 166 compressions and 286 decompressions per run, 0.086 s
of its 0.78 s, 0.074 s of it on inputs seen before (every pipeline run pays this, each streaming
window's analysis too). Remembered: 0.66-0.72 s per run against 0.72-0.77 s (alternating).

:func:`remembering` gives a bz2 whose ``compress`` and ``decompress`` keep each result under its
input (and a compression's input under its result, which is what the next decompression of it
asks), up to :data:`CACHE_BYTES` of inputs and results in all, the least recently used dropped
first. Results are bz2's own bytes, so nothing else changes: a pickle made in this process opens
in any other, and one made elsewhere opens here. :func:`remember_compression` installs it as
the module Beam's cloudpickle pickler calls (``with_default_runner``, which every pipeline
passes through; forked workers inherit it). If the installed Beam's pickler has no ``bz2``,
nothing changes.
"""

from __future__ import annotations

import bz2
import threading
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from pipelines.engines.install_once import install_once

__all__ = ["CACHE_BYTES", "remember_compression", "remembering"]

# Inputs and results kept, in bytes (DoFn pickles are kilobytes to a few hundred).
CACHE_BYTES = 32 << 20


def remembering(codec: Any = bz2, limit_bytes: int = CACHE_BYTES) -> SimpleNamespace:
    """A stand-in for ``codec`` (the bz2 module) whose ``compress(data, compresslevel=9)`` and
    ``decompress(data)`` return what ``codec``'s do, each asked of ``codec`` once per distinct
    input while it is kept (entries larger than ``limit_bytes`` are never kept)."""
    kept: OrderedDict[tuple, bytes] = OrderedDict()
    held = [0]  # bytes of the kept keys' data and values
    lock = threading.Lock()

    def recall(key: tuple) -> bytes | None:
        with lock:
            value = kept.get(key)
            if value is not None:
                kept.move_to_end(key)
            return value

    def keep(key: tuple, value: bytes) -> None:
        size = len(key[1]) + len(value)
        if size > limit_bytes:
            return
        with lock:
            if key in kept:
                return
            kept[key] = value
            held[0] += size
            while held[0] > limit_bytes:
                oldest, dropped = kept.popitem(last=False)
                held[0] -= len(oldest[1]) + len(dropped)

    def compress(data: Any, compresslevel: int = 9) -> bytes:
        data = bytes(data)
        key = ("compress", data, compresslevel)
        result = recall(key)
        if result is None:
            result = codec.compress(data, compresslevel=compresslevel)
            keep(key, result)
            keep(("decompress", result), data)
        return result

    def decompress(data: Any) -> bytes:
        data = bytes(data)
        key = ("decompress", data)
        result = recall(key)
        if result is None:
            result = codec.decompress(data)
            keep(key, result)
        return result

    return SimpleNamespace(compress=compress, decompress=decompress, kept=kept)


@install_once
def remember_compression() -> bool:
    """Install :func:`remembering` as the bz2 of Beam's cloudpickle pickler (once;
    idempotent). Returns whether it is installed."""
    from apache_beam.internal import cloudpickle_pickler

    codec = getattr(cloudpickle_pickler, "bz2", None)
    fits = codec is bz2
    if fits:
        cloudpickle_pickler.bz2 = remembering(codec)
    return fits

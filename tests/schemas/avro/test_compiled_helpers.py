"""The compiled helpers of ``esa_avro_blocks`` (schemas/avro_blocks) refuse arguments that do
not describe their rows, so that the callers fall back to numpy instead of reading out of
bounds. What they compute is checked against fastavro and google-crc32c with the callers'
tests (test_container.py, test_crc32c.py), which run on both paths."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest

esa_avro_blocks = pytest.importorskip("esa_avro_blocks", reason="make venv builds it")


def test_the_compiled_crcs_refuse_offsets_that_leave_the_data() -> None:
    native = esa_avro_blocks.crc32c_many
    offsets = np.array([0, 3, 2], dtype="<i8").tobytes()  # decreasing
    assert native(b"abc", offsets) is None
    assert native(b"abc", np.array([0, 4], dtype="<i8").tobytes()) is None  # past the end
    assert native(b"abc", b"\x00" * 7) is None  # not whole int64 values
    assert native(b"abc", np.array([-1, 2], dtype="<i8").tobytes()) is None
    empty = native(b"", np.array([0, 0], dtype="<i8").tobytes())
    assert np.frombuffer(empty, "<u4").tolist() == [google_crc32c.value(b"")]


def test_the_compiled_writer_refuses_pieces_that_do_not_fit_the_rows() -> None:
    native = esa_avro_blocks.encode_rows
    longs = np.arange(3, dtype="<i8").tobytes()
    offsets = np.array([0, 1, 2, 3], dtype="<i8").tobytes()
    assert native(3, [(1, longs, None, None), (2, b"abc", offsets, None)]) is not None
    assert native(4, [(1, longs, None, None)]) is None  # three values for four rows
    assert native(3, [(2, b"ab", offsets, None)]) is None  # offsets past the data
    decreasing = np.array([0, 2, 1, 3], dtype="<i8").tobytes()
    assert native(3, [(2, b"abc", decreasing, None)]) is None
    out_of_list = np.array([0, 3, 1], dtype="<i8").tobytes()
    assert native(3, [(3, b"abc", offsets, out_of_list)]) is None
    assert native(3, [(9, b"", None, None)]) is None  # no such kind

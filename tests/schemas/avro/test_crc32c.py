"""CRC32C of many byte strings at once (schemas/avro/crc32c.py) against the native CRC."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest

from schemas.avro import crc32c
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import EncodedPayloads


@pytest.fixture(autouse=True, params=["numpy", "native"])
def crc_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test once on the numpy paths and once on the compiled ``crc32c_many``."""
    if request.param == "numpy":
        monkeypatch.setattr(crc32c, "_native_crc32c_many", None)
    else:
        assert crc32c._native_crc32c_many is not None, (
            "esa_avro_blocks is not installed (make venv)"
        )
    return request.param


@pytest.mark.parametrize("arrow_type", [pa.binary(), pa.large_binary(), pa.string()])
def test_matches_the_native_crc_on_arrow_arrays(arrow_type: pa.DataType) -> None:
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 40, 500)
    lengths[rng.integers(0, 500, 8)] = rng.integers(100, 5000, 8)  # a few long ones
    payloads: list = [rng.bytes(int(n)) for n in lengths]
    if arrow_type == pa.string():
        payloads = [bytes(b % 128 for b in payload).decode() for payload in payloads]
    payloads[3] = None
    array = pa.array(payloads, type=arrow_type).slice(2, 450)  # offset into the buffers
    expected = [
        -1 if p is None else google_crc32c.value(p.encode() if isinstance(p, str) else p)
        for p in payloads[2:452]
    ]
    assert crc32c_many(array).tolist() == expected
    chunked = pa.chunked_array([array.slice(0, 100), array.slice(100)])
    assert crc32c_many(chunked).tolist() == expected
    assert crc32c_many(pa.array([], type=arrow_type)).size == 0


def test_matches_the_native_crc_on_lists_and_payload_buffers() -> None:
    rng = np.random.default_rng(5)
    short = [rng.bytes(int(n)) for n in rng.integers(0, 40, 500)]
    long = [rng.bytes(int(n)) for n in rng.integers(60, 200, 50)]
    huge = [rng.bytes(40_000), *short[:40]]  # a length past 16-bit sort keys
    for items in (short, long, short + long, huge):
        expected = [google_crc32c.value(item) for item in items]
        assert crc32c_many(items).tolist() == expected
        assert crc32c_many(EncodedPayloads.from_list(items)).tolist() == expected
    assert crc32c_many([]).size == 0


@pytest.mark.parametrize("length", [1, 16, 83, 256, 257])
def test_matches_the_native_crc_on_strings_of_one_length(length: int) -> None:
    """Strings of one length back to back (fixed-size payloads) take the matrix path up to 256
    bytes; more rows than one transposed block, and a slice that starts inside the buffer."""
    rng = np.random.default_rng(length)
    rows = (1 << 19) // length + 7
    data = rng.bytes(length * rows)
    array = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(length), rows, [None, pa.py_buffer(data)]
    ).cast(pa.binary())
    array = array.slice(3)
    expected = [google_crc32c.value(data[i * length : (i + 1) * length]) for i in range(3, rows)]
    assert crc32c_many(array).tolist() == expected

"""LDP-SGD payloads (seed + sign, 18 bytes) and per-epoch channels."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from schemas.ldp_sgd import (
    PAYLOAD_BYTES,
    SgdChannel,
    decode_sgd_payloads,
    encode_sgd_payloads,
)


def test_payloads_round_trip():
    rng = np.random.default_rng(1)
    seeds = rng.integers(0, 256, size=(500, 16), dtype=np.uint8)
    signs = rng.choice(np.array([-1, 1], dtype=np.int8), size=500)
    payloads = encode_sgd_payloads(seeds, signs)
    assert len(payloads) == 500 and all(len(p) == PAYLOAD_BYTES for p in payloads.to_pylist()[:5])
    decoded = decode_sgd_payloads(payloads)
    np.testing.assert_array_equal(decoded.seeds, seeds)
    np.testing.assert_array_equal(decoded.signs, signs)
    assert decoded.rejected_rows.size == 0


def test_bad_payloads_are_rejected_with_reasons():
    good = encode_sgd_payloads(np.zeros((1, 16), dtype=np.uint8), np.array([1])).to_pylist()[0]
    rows = [good, good[:-1], b"\x00" + good[1:], good[:-1] + b"\x07", b"", None, good]
    decoded = decode_sgd_payloads(pa.array(rows, type=pa.binary()))
    assert decoded.signs.tolist() == [1, 1]
    assert decoded.rejected_rows.tolist() == [1, 2, 3, 4, 5]
    assert decoded.rejected_reasons == (
        "bad_payload_length",
        "bad_payload_tag",
        "bad_payload_sign",
        "bad_payload_length",
        "bad_payload_length",
    )


def test_each_epoch_has_its_own_channel_and_recipe():
    first = SgdChannel("synthetic:400", 1, 1.9, 1.0, 650, instances=2)
    second = SgdChannel("synthetic:400", 2, 1.9, 1.0, 650, instances=2)
    assert first.channel != second.channel and first.recipe_id != second.recipe_id
    assert first.recipe_id == "ldp-sgd-synthetic-400-e0001-eps1.9-l1-d650-k2-tau1@1"
    assert "/" not in first.channel and ":" not in first.channel

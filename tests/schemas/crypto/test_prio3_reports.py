"""Prio3 report payloads: sealed input shares per aggregator, sealed aggregate shares."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.crypto.analyzer_keys import KeyRing, generate_key
from schemas.crypto.prio3_reports import (
    BAD_LENGTH,
    BAD_VERSION,
    OK,
    OPEN_FAILED,
    PAYLOAD_VERSION,
    REPORT_ID_BYTES,
    RETIRED_KEY,
    SHARE_REASONS,
    UNKNOWN_KEY,
    add_checksums,
    layout_of,
    open_aggregate_share,
    open_shares,
    parse_reports,
    report_id_checksum,
    seal_aggregate_share,
    seal_reports,
)
from schemas.crypto.vdaf import Prio3
from schemas.crypto.verify_keys import generate_verify_key

DAY_MS = 86_400_000
T0 = 19_723 * DAY_MS
COORDS = {"recipe_id": "r@1", "channel": "c", "crowd_id": None}


@pytest.fixture(scope="module")
def keys():
    return [generate_key() for _ in range(2)]


def _seal(vdaf, keys, measurements, rng, window_start=T0):
    ids = [rng.bytes(REPORT_ID_BYTES) for _ in measurements]
    payloads = seal_reports(
        vdaf,
        [key.public for key in keys],
        measurements,
        ids,
        window_starts_ms=[window_start] * len(ids),
        window_ms=DAY_MS,
        **COORDS,
    )
    return ids, payloads


def _open(vdaf, keys, payloads, agg_id, window_start=T0, crowd_id=None, ring_key=None):
    parsed = parse_reports(payloads, layout_of(vdaf), agg_id)
    ring = KeyRing([ring_key or keys[agg_id]])
    coords = dict(COORDS, crowd_id=crowd_id)
    return parsed, open_shares(
        ring,
        agg_id,
        parsed,
        window_start_ms=window_start,
        window_end_ms=window_start + DAY_MS,
        **coords,
    )


def test_sealed_shares_open_verify_and_add_up(keys):
    rng = np.random.default_rng(1)
    vdaf = Prio3("multihot", 12, max_weight=12)
    measurements = [rng.integers(0, 2, 12) for _ in range(6)]
    ids, payloads = _seal(vdaf, keys, measurements, rng)
    layout = layout_of(vdaf)
    assert {len(p) for p in payloads} == {layout.payload}
    assert all(
        p[0] == PAYLOAD_VERSION and p[1 : 1 + REPORT_ID_BYTES] == i
        for p, i in zip(payloads, ids, strict=True)
    )
    verify_key = generate_verify_key()
    opened = [_open(vdaf, keys, payloads, agg_id) for agg_id in range(2)]
    for parsed, (_, status) in opened:
        assert (status == OK).all()
        assert parsed.report_ids == ids
    outputs: list[list[bytes]] = [[], []]
    for row, report_id in enumerate(ids):
        initialized = [
            vdaf.verify_init(
                verify_key, j, report_id, opened[j][0].public_shares[row], opened[j][1][0][row]
            )
            for j in range(2)
        ]
        for j in range(2):
            outputs[j].append(vdaf.verify_finish(j, initialized[j][0], [s for _, s in initialized]))
    counts = vdaf.unshard([vdaf.aggregate(o) for o in outputs], len(ids))
    np.testing.assert_array_equal(counts, np.sum(measurements, axis=0))


def test_a_share_opens_only_for_its_aggregator_report_window_and_crowd(keys):
    rng = np.random.default_rng(2)
    vdaf = Prio3("histogram", 4)
    _, payloads = _seal(vdaf, keys, [1, 2], rng)
    # Aggregator 1's key ring given aggregator 0's share (the right key, the wrong info).
    _, (_, status) = _open(vdaf, keys, payloads, 0, ring_key=keys[1])
    assert (status == UNKNOWN_KEY).all()
    parsed = parse_reports(payloads, layout_of(vdaf), 0)
    ring = KeyRing([keys[0]])
    for moved in (
        {"window_start_ms": T0 + DAY_MS, "window_end_ms": T0 + 2 * DAY_MS, **COORDS},
        {"window_start_ms": T0, "window_end_ms": T0 + DAY_MS, **dict(COORDS, crowd_id="x")},
        {"window_start_ms": T0, "window_end_ms": T0 + DAY_MS, **dict(COORDS, recipe_id="r@2")},
    ):
        _, status = open_shares(ring, 0, parsed, **moved)
        assert (status == OPEN_FAILED).all(), moved
    # Aggregator 0 opening share 0 as if it were aggregator 1's (agg id is bound too).
    swapped = parse_reports(payloads, layout_of(vdaf), 0)
    _, status = open_shares(
        ring, 1, swapped, window_start_ms=T0, window_end_ms=T0 + DAY_MS, **COORDS
    )
    assert (status == OPEN_FAILED).all()
    # Another report's id on the same sealed share.
    other = [
        payloads[0][:1] + payloads[1][1 : 1 + REPORT_ID_BYTES] + payloads[0][1 + REPORT_ID_BYTES :]
    ]
    _, (_, status) = _open(vdaf, keys, other, 0)
    assert status.tolist() == [OPEN_FAILED]


def test_bad_payloads_get_reasons_not_exceptions(keys):
    rng = np.random.default_rng(3)
    vdaf = Prio3("histogram", 4)
    _, payloads = _seal(vdaf, keys, [0], rng)
    good = payloads[0]
    flipped = good[:-1] + bytes([good[-1] ^ 1])  # aggregator 1's ciphertext
    bad = [b"", good[:-1], good + b"\x00", b"\x01" + good[1:], flipped]
    _, (_, status) = _open(vdaf, keys, bad, 1)
    assert [SHARE_REASONS[s] for s in status] == [
        SHARE_REASONS[BAD_LENGTH],
        SHARE_REASONS[BAD_LENGTH],
        SHARE_REASONS[BAD_LENGTH],
        SHARE_REASONS[BAD_VERSION],
        SHARE_REASONS[OPEN_FAILED],
    ]
    _, (_, status) = _open(vdaf, keys, [flipped], 0)  # aggregator 0's part is intact
    assert status.tolist() == [OK]
    retired = generate_key(valid_from_ms=0, valid_until_ms=T0)
    sealed_to_retired = [keys[0], retired]
    _, payloads = _seal(vdaf, sealed_to_retired, [0], rng)
    _, (_, status) = _open(vdaf, sealed_to_retired, payloads, 1)
    assert status.tolist() == [RETIRED_KEY]


def test_report_id_checksum_is_order_free_and_mergeable():
    ids = [bytes([i]) * REPORT_ID_BYTES for i in range(5)]
    whole = report_id_checksum(ids)
    assert whole == report_id_checksum(ids[::-1])
    assert whole == add_checksums(report_id_checksum(ids[:2]), report_id_checksum(ids[2:]))
    assert whole != report_id_checksum(ids[:4])
    assert report_id_checksum([]) == 0


def test_aggregate_share_opens_only_under_what_both_aggregators_stated():
    analyzer = generate_key()
    ring = KeyRing([analyzer])
    coordinates = {
        "recipe_id": "r@1",
        "channel": "c",
        "window_start_ms": T0,
        "window_end_ms": T0 + DAY_MS,
        "crowd_id": None,
        "reports": 7,
        "checksum": 12345,
    }
    sealed = seal_aggregate_share(analyzer.public, b"share", 0, "run-1", **coordinates)
    assert open_aggregate_share(ring, sealed, 0, "run-1", **coordinates) == b"share"
    assert open_aggregate_share(ring, sealed, 1, "run-1", **coordinates) is None
    assert open_aggregate_share(ring, sealed, 0, "run-2", **coordinates) is None
    assert open_aggregate_share(ring, sealed, 0, "run-1", **(coordinates | {"reports": 6})) is None
    assert open_aggregate_share(ring, sealed, 0, "run-1", **(coordinates | {"checksum": 1})) is None
    assert open_aggregate_share(ring, sealed[:-1], 0, "run-1", **coordinates) is None
    assert open_aggregate_share(ring, b"", 0, "run-1", **coordinates) is None

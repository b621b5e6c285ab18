"""Prio3 (VDAF draft 18, the ``prio`` crate via ``schemas.crypto.vdaf``) against plain additive sharing.

At d = 64, 256 and 1,024 buckets (Prio3Histogram: one index per report), per report:

* ``shard``: the device's sharding (the proof included), against splitting a one-hot vector into
  two additive shares mod 2^64 with numpy (a batch of reports at once, divided by their number);
* ``verify`` per aggregator: ``verify_init`` plus ``verify_finish`` (combining both verifier
  shares, deciding the proof, the output share) of one aggregator, against adding one share
  vector into a running sum with numpy;
* bytes of the leader's and the helper's input share and of the public share, against the
  8 d bytes of one numpy share;
* a device's shard plus HPKE sealing of both input shares (``schemas.crypto.prio3_reports``),
  and an aggregator's parsing and opening of its sealed share, beside the VDAF alone;
* end to end, reports per second of the whole prio3 path against the sealed shuffled path on the
  same randomized reports (``_end_to_end_rows``).

The gap is the price of the validity proofs: without them one device can add any amount to any
bucket (samplable-anonymous-aggregation §4.4.1). CPU seconds of this process (one core; the
machine's cores are shared).
"""

from __future__ import annotations

import time

import numpy as np

from privacy.randomizers import build_randomizer
from schemas.crypto import sealing
from schemas.crypto.analyzer_keys import KeyRing, generate_key
from schemas.crypto.prio3_reports import (
    REPORT_ID_BYTES,
    layout_of,
    open_shares,
    parse_reports,
    seal_reports,
)
from schemas.crypto.vdaf import NONCE_SIZE, SHARES, Prio3
from schemas.crypto.verify_keys import generate_verify_key
from schemas.payloads import encode_message_batch, payload_limits

DIMENSIONS = (64, 256, 1024)


def _cpu(function):
    started = time.process_time()
    result = function()
    return result, time.process_time() - started


def _numpy_sharing(d: int, reports: int, rng: np.random.Generator) -> tuple[float, float]:
    """CPU seconds per report of additive sharing mod 2^64 and of summing one share vector."""
    values = rng.integers(0, d, size=reports)

    def share():
        one_hot = np.zeros((reports, d), dtype=np.uint64)
        one_hot[np.arange(reports), values] = 1
        mask = rng.integers(0, 2**64, size=(reports, d), dtype=np.uint64, endpoint=False)
        return mask, one_hot - mask  # wraps mod 2^64

    (leader, helper), share_s = _cpu(share)
    total = np.zeros(d, dtype=np.uint64)

    def add():
        nonlocal total
        for row in leader:
            total += row

    _, add_s = _cpu(add)
    assert ((leader + helper).sum(axis=0) == np.bincount(values, minlength=d)).all()
    return share_s / reports, add_s / reports


def _rows_for(d: int, reports: int, rng: np.random.Generator) -> list[dict]:
    vdaf = Prio3("histogram", d)
    verify_key = generate_verify_key()
    values = rng.integers(0, d, size=reports)
    nonces = [rng.bytes(NONCE_SIZE) for _ in range(reports)]
    shards, shard_s = _cpu(
        lambda: [vdaf.shard(value, nonce) for value, nonce in zip(values, nonces, strict=True)]
    )
    initialized = [
        [
            vdaf.verify_init(verify_key, agg_id, nonce, s.public_share, s.input_shares[agg_id])
            for agg_id in range(SHARES)
        ]
        for nonce, s in zip(nonces, shards, strict=True)
    ]
    verify_s = []
    outputs: list[list[bytes]] = []
    for agg_id in range(SHARES):

        def verify(agg_id=agg_id):
            shares = []
            for nonce, s, both in zip(nonces, shards, initialized, strict=True):
                state, _ = vdaf.verify_init(
                    verify_key, agg_id, nonce, s.public_share, s.input_shares[agg_id]
                )
                shares.append(vdaf.verify_finish(agg_id, state, [share for _, share in both]))
            return shares

        shares, seconds = _cpu(verify)
        outputs.append(shares)
        verify_s.append(seconds / reports)
    counts = vdaf.unshard([vdaf.aggregate(shares) for shares in outputs], reports)
    assert (counts == np.bincount(values, minlength=d)).all()
    # A device's whole cost: shard and seal each input share to its aggregator (HPKE), and an
    # aggregator's: open its sealed share and verify (schemas.crypto.prio3_reports).
    keys = [generate_key() for _ in range(SHARES)]
    ids = [rng.bytes(REPORT_ID_BYTES) for _ in range(reports)]
    payloads, seal_s = _cpu(
        lambda: seal_reports(
            vdaf, [k.public for k in keys], list(values), ids, "r@1", "c", [0] * reports, 1, None
        )
    )
    layout = layout_of(vdaf)
    _, open_s = _cpu(
        lambda: open_shares(
            KeyRing([keys[1]]), 1, parse_reports(payloads, layout, 1), "r@1", "c", 0, 1, None
        )
    )
    numpy_share_s, numpy_add_s = _numpy_sharing(d, max(reports, 1000), rng)
    sizes = shards[0]
    numpy_bytes = 8 * d
    shard_us = shard_s / reports * 1e6
    rows = [
        {
            "benchmark": "prio3",
            "metric": f"shard_us_d{d}",
            "value": shard_us,
            "baseline": numpy_share_s * 1e6,
            "ratio": shard_us / (numpy_share_s * 1e6),
            "note": f"Prio3Histogram shard vs numpy additive sharing; {reports} reports",
        }
    ]
    rows.append(
        {
            "benchmark": "prio3",
            "metric": f"device_shard_seal_us_d{d}",
            "value": seal_s / reports * 1e6,
            "baseline": shard_us,
            "ratio": seal_s / reports * 1e6 / shard_us,
            "note": "shard + HPKE-seal both input shares vs shard alone",
        }
    )
    rows.append(
        {
            "benchmark": "prio3",
            "metric": f"aggregator_open_us_d{d}",
            "value": open_s / reports * 1e6,
            "baseline": verify_s[1] * 1e6,
            "ratio": open_s / reports / verify_s[1],
            "note": "parse + HPKE-open one input share vs its verification",
        }
    )
    for agg_id, seconds in enumerate(verify_s):
        rows.append(
            {
                "benchmark": "prio3",
                "metric": f"verify_us_d{d}_aggregator{agg_id}",
                "value": seconds * 1e6,
                "baseline": numpy_add_s * 1e6,
                "ratio": seconds / numpy_add_s,
                "note": "verify_init + verify_finish vs adding one numpy share vector",
            }
        )
    for name, size in (
        ("leader_share", len(sizes.input_shares[0])),
        ("helper_share", len(sizes.input_shares[1])),
        ("public_share", len(sizes.public_share)),
    ):
        rows.append(
            {
                "benchmark": "prio3",
                "metric": f"{name}_bytes_d{d}",
                "value": size,
                "baseline": numpy_bytes,
                "ratio": size / numpy_bytes,
                "note": "bytes per report vs one uint64 numpy share",
            }
        )
    return rows


def _end_to_end_rows(d: int, reports: int, rng: np.random.Generator) -> list[dict]:
    """Reports/s of the two paths on the same population (one-hot k-RAPPOR at eps 4), the
    pure cores without Beam: the prio3 path (the device's shard and seal of its bit vector, both
    aggregators' open, verify_init and finish, their sums and the unshard) against the shuffled
    path (the same randomized messages each sealed to the analyzer, opened and counted)."""
    randomizer = build_randomizer("one_hot_rappor", {"domain_size": d, "epsilon": 4.0})
    values = rng.integers(0, d, size=reports)
    messages = randomizer.randomize(values, rng)
    bits = np.zeros((reports, d), dtype=np.uint8)
    bits[messages.respondent, messages.bucket] = 1
    vdaf = Prio3("multihot", d, max_weight=d)
    keys = [generate_key() for _ in range(SHARES)]
    analyzer = generate_key()
    verify_key = generate_verify_key()
    coordinates = ("r@1", "c", 0, 86_400_000, None)

    def prio3_path():
        ids = [rng.bytes(REPORT_ID_BYTES) for _ in range(reports)]
        payloads = seal_reports(
            vdaf,
            [k.public for k in keys],
            list(bits),
            ids,
            "r@1",
            "c",
            [0] * reports,
            86_400_000,
            None,
        )
        layout = layout_of(vdaf)
        opened = []
        for j in range(SHARES):
            parsed = parse_reports(payloads, layout, j)
            shares, _ = open_shares(KeyRing([keys[j]]), j, parsed, *coordinates)
            opened.append(
                [
                    vdaf.verify_init(
                        verify_key, j, parsed.report_ids[r], parsed.public_shares[r], shares[r]
                    )
                    for r in range(reports)
                ]
            )
        sums = [
            vdaf.aggregate(
                [
                    vdaf.verify_finish(j, opened[j][r][0], [opened[0][r][1], opened[1][r][1]])
                    for r in range(reports)
                ]
            )
            for j in range(SHARES)
        ]
        return vdaf.unshard(sums, reports)

    def shuffled_path():
        payloads = encode_message_batch(messages, "bucket").to_list()
        pad_to = sealing.padded_length("bucket", payload_limits(randomizer))
        sealer = sealing.Sealer(analyzer.public)
        info = sealer.info("r@1", "c", 0, 86_400_000, None)
        sealed = sealer.seal_many(payloads, [info] * len(payloads), pad_to)
        opened = sealing.open_sealed(KeyRing([analyzer]), sealed, pad_to, *coordinates)
        return len(opened.payloads)

    counts, prio3_s = _cpu(prio3_path)
    assert (counts == bits.sum(axis=0)).all()
    _, shuffled_s = _cpu(shuffled_path)
    return [
        {
            "benchmark": "prio3",
            "metric": f"end_to_end_reports_per_s_d{d}",
            "value": reports / prio3_s,
            "baseline": reports / shuffled_s,
            "ratio": shuffled_s / prio3_s,
            "note": f"prio3 path vs sealed shuffled messages ({len(messages) / reports:.1f} per "
            "report), pure cores, one core",
        }
    ]


def run(quick: bool) -> list[dict]:
    rng = np.random.default_rng(25)
    reports = {64: 40, 256: 20, 1024: 10} if quick else {64: 2000, 256: 1000, 1024: 400}
    rows: list[dict] = []
    for d in DIMENSIONS:
        rows.extend(_rows_for(d, reports[d], rng))
    for d in DIMENSIONS:
        rows.extend(_end_to_end_rows(d, reports[d] // 2, rng))
    return rows


if __name__ == "__main__":
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(
            f"{row['metric']:32s} {row['value']:12.4g} vs {row['baseline']:12.4g} "
            f"x{row['ratio']:9.2f}  {row['note']}"
        )

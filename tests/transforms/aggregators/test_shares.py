"""The aggregators' pure core: opening, settling duplicates, finishing, summing (no Beam)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from schemas import crc32c
from schemas.crypto.analyzer_keys import generate_key, write_key_pair
from schemas.crypto.prio3_reports import REPORT_ID_BYTES, seal_reports
from schemas.crypto.verify_keys import generate_verify_key, write_verify_key
from schemas.recipes import load_recipe, recipe_from_dict
from transforms.aggregators.shares import (
    AggregateShareAccumulator,
    AggregatorSpec,
    ShareOpener,
    deduplicate,
    finish_report,
)

DAY_MS = 86_400_000
T0 = 1_704_067_200_000
FIELD128_MODULUS = 2**66 * 4611686018427387897 + 1


def small_recipe(domain: int = 16, min_crowd: int = 5):
    data = load_recipe("image_grid_prio3").to_dict()
    for name in ("expected_crowd", "solve_bound"):
        data.pop(name)
    data.update(
        name="prio3_test",
        randomizer_params={"domain_size": domain, "epsilon": 2.0},
        epsilon_local=2.0,
        min_crowd_size=min_crowd,
    )
    return recipe_from_dict(data)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("aggregators")
    recipe = small_recipe()
    keys = [generate_key() for _ in range(2)]
    for j, key in enumerate(keys):
        write_key_pair(key, root / f"agg{j}")
    write_verify_key(root / "verify.json", generate_verify_key())
    specs = [
        AggregatorSpec(j, recipe.to_json(), str(root / f"agg{j}"), str(root / "verify.json"))
        for j in range(2)
    ]
    return recipe, keys, specs


def payloads_for(recipe, keys, vectors, rng, ids=None):
    ids = ids or [rng.bytes(REPORT_ID_BYTES) for _ in vectors]
    return ids, seal_reports(
        recipe.build_vdaf(),
        [k.public for k in keys],
        vectors,
        ids,
        recipe.id,
        recipe.channel,
        [T0] * len(vectors),
        DAY_MS,
        None,
    )


def batch_of(recipe, payloads, **columns):
    n = len(payloads)
    data = {
        "schema_version": [1] * n,
        "window_start": [T0] * n,
        "window_end": [T0 + DAY_MS] * n,
        "channel": [recipe.channel] * n,
        "recipe_id": [recipe.id] * n,
        "crowd_id": [None] * n,
        "payload": payloads,
        "payload_crc32c": [crc32c(p) for p in payloads],
    }
    data.update(columns)
    return pa.RecordBatch.from_pydict(
        data,
        schema=pa.schema(
            [
                ("schema_version", pa.int32()),
                ("window_start", pa.int64()),
                ("window_end", pa.int64()),
                ("channel", pa.string()),
                ("recipe_id", pa.string()),
                ("crowd_id", pa.string()),
                ("payload", pa.binary()),
                ("payload_crc32c", pa.int64()),
            ]
        ),
    )


def test_both_aggregators_open_finish_and_sum_to_the_plain_sum(setup):
    recipe, keys, specs = setup
    rng = np.random.default_rng(1)
    vectors = [rng.integers(0, 2, 16) for _ in range(9)]
    ids, payloads = payloads_for(recipe, keys, vectors, rng)
    opened = [ShareOpener(spec).open_batch(batch_of(recipe, payloads)) for spec in specs]
    assert all(not o.rejected_rows for o in opened)
    assert [r.report_id for r in opened[0].reports] == ids
    vdaf = recipe.build_vdaf()
    totals = []
    for j in range(2):
        accumulators = [AggregateShareAccumulator(flush_at=2) for _ in range(3)]
        for index, (mine, theirs) in enumerate(
            zip(opened[j].reports, opened[1 - j].reports, strict=True)
        ):
            shares = [mine.verifier_share, theirs.verifier_share][:: 1 if j == 0 else -1]
            output, reason, _ = finish_report(vdaf, j, mine.state, shares)
            assert reason == ""
            accumulators[index % 3].add(vdaf, mine.report_id, output)
        first = accumulators[0]
        first.merge(vdaf, iter(accumulators[1:]))
        totals.append(first)
    assert totals[0].reports == totals[1].reports == 9
    assert totals[0].checksum == totals[1].checksum
    counts = vdaf.unshard([t.share(vdaf) for t in totals], 9)
    np.testing.assert_array_equal(counts, np.sum(vectors, axis=0))


def test_records_an_aggregator_cannot_use_get_reasons(setup):
    recipe, keys, specs = setup
    rng = np.random.default_rng(2)
    _, payloads = payloads_for(recipe, keys, [np.ones(16, dtype=int)] * 4, rng)
    payloads[1] = payloads[1] + b"\x00"  # oversized
    batch = batch_of(
        recipe,
        payloads,
        recipe_id=[recipe.id, recipe.id, "other@1", recipe.id],
        payload_crc32c=[crc32c(payloads[0]), crc32c(payloads[1]), crc32c(payloads[2]), 7],
    )
    opened = ShareOpener(specs[0]).open_batch(batch)
    assert opened.rejected_rows == [1, 2, 3]
    assert opened.rejected_reasons == ["prio3_bad_length", "prio3_other_recipe", "crc32c_mismatch"]
    assert len(opened.reports) == 1


def test_duplicates_count_once_when_identical_and_never_when_they_differ(setup):
    recipe, keys, specs = setup
    rng = np.random.default_rng(3)
    report_id = rng.bytes(REPORT_ID_BYTES)
    _, first = payloads_for(recipe, keys, [np.zeros(16, dtype=int)], rng, [report_id])
    _, second = payloads_for(recipe, keys, [np.ones(16, dtype=int)], rng, [report_id])
    opened = ShareOpener(specs[0]).open_batch(batch_of(recipe, first * 2 + second)).reports
    kept, reasons = deduplicate(opened[:2])
    assert kept == opened[0] and reasons == ["replayed_report"]
    kept, reasons = deduplicate(opened)
    assert kept is None and reasons == ["report_id_reused"] * 3
    assert deduplicate(opened[:1]) == (opened[0], [])


def test_a_missing_or_invalid_verifier_share_is_never_counted(setup):
    recipe, _, _ = setup
    vdaf = recipe.build_vdaf()
    rng = np.random.default_rng(4)
    nonce = rng.bytes(16)
    verify_key = generate_verify_key()
    shards = vdaf.shard(np.zeros(16, dtype=int), nonce)
    initialized = [
        vdaf.verify_init(verify_key, j, nonce, shards.public_share, shards.input_shares[j])
        for j in range(2)
    ]
    output, reason, _ = finish_report(vdaf, 0, initialized[0][0], [initialized[0][1], None])
    assert output is None and reason == "missing_verifier_share"
    # A device that sends shares of a vector with a 2 in it: the leader's share shifted by one.
    leader = shards.input_shares[0]
    value = (int.from_bytes(leader[:16], "little") + 2) % FIELD128_MODULUS
    forged = value.to_bytes(16, "little") + leader[16:]
    state, share = vdaf.verify_init(verify_key, 0, nonce, shards.public_share, forged)
    output, reason, detail = finish_report(vdaf, 0, state, [share, initialized[1][1]])
    assert output is None and reason == "prio3_invalid" and "proof" in detail

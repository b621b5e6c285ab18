"""Devices of a prio3 recipe: one sharded, sealed report per device and window, presence as always."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.crypto.analyzer_keys import KeyRing, generate_key
from schemas.crypto.prio3_reports import OK, layout_of, open_shares, parse_reports
from schemas.crypto.verify_keys import generate_verify_key
from schemas.recipes import load_recipe, recipe_from_dict
from simulators.plan import ShardSummary, SimulationPlan
from simulators.prio3_devices import prio3_devices_for, report_vectors
from simulators.shards import ShardContext, simulate_shard

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def aggregator_keys():
    return [generate_key() for _ in range(2)]


def prio3_recipe(instances: int = 2):
    data = load_recipe("image_grid_prio3").to_dict()
    data.update(shuffler_instances=instances, instance_weights=[1 / instances] * instances)
    return recipe_from_dict(data)


def plan_for(aggregator_keys, respondents: int = 120, **settings) -> SimulationPlan:
    return SimulationPlan.for_recipe(
        prio3_recipe(),
        "image:disc",
        seed=5,
        respondents=respondents,
        aggregator_keys_json=tuple(key.public.to_json() for key in aggregator_keys),
        **settings,
    )


def test_report_vectors_gather_each_devices_randomized_bits(aggregator_keys):
    context = ShardContext(plan_for(aggregator_keys))
    batch = next(context.fleet_batches(context.shards()[0]))
    origins, windows, bits = report_vectors(batch, 256)
    assert origins.size == batch.num_presence // 2 == 120  # one report per device and window
    assert len(set(origins.tolist())) == 120
    assert bits.sum() == batch.num_messages
    row_of = {origin: row for row, origin in enumerate(origins.tolist())}
    for origin, bucket in zip(
        batch.message_origin.tolist(), batch.messages.bucket.tolist(), strict=True
    ):
        assert bits[row_of[origin], bucket] == 1


def test_devices_send_one_sealed_report_whose_shares_sum_to_their_bits(aggregator_keys):
    plan = plan_for(aggregator_keys)
    context = ShardContext(plan)
    assert context.sealing is None  # nothing is sealed to the analyzer
    shard = context.shards()[0]
    items = list(simulate_shard(context, shard))
    summary = items[-1]
    assert isinstance(summary, ShardSummary)
    batches = [batch for _, chunk in items[:-1] for batch in chunk]
    records = [record for batch in batches for record in batch.to_records()]
    data = [r for r in records if r["payload"]]
    presence = [r for r in records if not r["payload"]]
    assert len(data) == summary.messages.sum() == 120  # one report per device
    assert summary.presence.tolist() == [120, 120]
    assert len(presence) == 240
    vdaf = context.recipe.build_vdaf()
    layout = layout_of(vdaf)
    assert {len(r["payload"]) for r in data} == {layout.payload}
    # Both aggregators open, verify and sum: the sum is the devices' randomized bits.
    verify_key = generate_verify_key()
    payloads = [r["payload"] for r in data]
    opened = []
    for agg_id in range(2):
        parsed = parse_reports(payloads, layout, agg_id)
        start = int(plan.start_ms)
        shares, status = open_shares(
            KeyRing([aggregator_keys[agg_id]]),
            agg_id,
            parsed,
            context.recipe.id,
            context.recipe.channel,
            start,
            start + DAY_MS,
            None,
        )
        assert (status == OK).all()
        opened.append((parsed, shares))
    assert len(set(opened[0][0].report_ids)) == 120  # unique report ids
    outputs: list[list[bytes]] = [[], []]
    for row in range(len(payloads)):
        nonce = opened[0][0].report_ids[row]
        initialized = [
            vdaf.verify_init(
                verify_key, j, nonce, opened[j][0].public_shares[row], opened[j][1][row]
            )
            for j in range(2)
        ]
        for j in range(2):
            outputs[j].append(vdaf.verify_finish(j, initialized[j][0], [s for _, s in initialized]))
    counts = vdaf.unshard([vdaf.aggregate(o) for o in outputs], len(payloads))
    fleet_batch = next(ShardContext(plan).fleet_batches(shard))  # the same devices again
    _, _, bits = report_vectors(fleet_batch, vdaf.length)
    np.testing.assert_array_equal(counts, bits.sum(axis=0))


def test_a_prio3_recipe_without_aggregator_keys_is_refused():
    recipe = prio3_recipe()
    with pytest.raises(ValueError, match="--aggregator-keys"):
        prio3_devices_for(recipe, None, DAY_MS)
    assert prio3_devices_for(load_recipe("image_grid_sealed"), None, DAY_MS) is None

"""Natural crowds (simulators/crowds.py): exact sizes from the exponent, membership independent of
sharding, every record of a respondent (data and presence) in that respondent's crowd."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.recipes import load_recipe
from simulators.crowds import CrowdAssignment, split_crowd_keys
from simulators.fleet import origin_ids
from simulators.plan import ShardSummary, SimulationPlan
from simulators.shards import ShardContext, simulate_shard


def test_sizes_follow_the_exponent_and_add_up():
    crowds = CrowdAssignment(crowds=5, respondents=10_000, seed=1, exponent=1.0, name="region")
    assert crowds.sizes.sum() == 10_000
    assert np.all(np.diff(crowds.sizes) <= 0)
    expected = 10_000 / np.arange(1, 6) / (1 / np.arange(1, 6)).sum()
    assert np.all(np.abs(crowds.sizes - expected) < 1)
    assert crowds.names == ("region-0", "region-1", "region-2", "region-3", "region-4")
    equal = CrowdAssignment(crowds=4, respondents=10_000, seed=1, exponent=0)
    assert equal.sizes.tolist() == [2500] * 4
    assert CrowdAssignment(crowds=12, respondents=100, seed=1).names[0] == "crowd-00"


def test_membership_matches_the_sizes_and_not_the_shards():
    crowds = CrowdAssignment(crowds=7, respondents=9_999, seed=3, exponent=1.3)
    whole = crowds.crowd_of(np.arange(9_999))
    assert np.bincount(whole, minlength=7).tolist() == crowds.sizes.tolist()
    parts = np.concatenate(
        [crowds.crowd_of(np.arange(a, min(a + 1000, 9_999))) for a in range(0, 9_999, 1000)]
    )
    assert np.array_equal(parts, whole)
    # Not sorted by respondent: the first thousand respondents fall in several crowds.
    assert len(set(whole[:1000].tolist())) > 1
    other = CrowdAssignment(crowds=7, respondents=9_999, seed=4, exponent=1.3)
    assert not np.array_equal(other.crowd_of(np.arange(9_999)), whole)


@pytest.mark.parametrize(
    "spec, error",
    [
        ("zipf,crowd_name=app", "need crowds=C"),
        ("zipf,crowds=2,crowds=3", "repeats crowds"),
    ],
)
def test_bad_crowd_keys_are_refused(spec, error):
    with pytest.raises(ValueError, match=error):
        split_crowd_keys(spec)
    with pytest.raises(ValueError, match="crowd_name"):
        CrowdAssignment(crowds=2, respondents=10, seed=0, name="Bad Name")
    with pytest.raises(ValueError, match="crowds must be in"):
        CrowdAssignment(crowds=0, respondents=10, seed=0)


def test_split_crowd_keys_leaves_the_population_spec():
    assert split_crowd_keys("zipf,exponent=1.2,crowds=4,crowd_name=app") == (
        "zipf,exponent=1.2",
        {"crowds": "4", "crowd_name": "app"},
    )
    assert split_crowd_keys("uniform") == ("uniform", {})


def test_every_record_is_in_its_respondents_crowd():
    recipe = load_recipe("small_asymmetric_one_hot")
    plan = SimulationPlan.for_recipe(
        recipe, "zipf,crowds=3,crowd_exponent=1", seed=5, respondents=3_000,
        messages_per_chunk=4_000,
    )  # fmt: skip
    context = ShardContext(plan)
    crowds = context.crowds
    assert crowds is not None and crowds.sizes.sum() == 3_000
    origin_to_crowd = dict(
        zip(
            origin_ids(np.arange(3_000), plan.origin_key).tolist(),
            crowds.crowd_of(np.arange(3_000)).tolist(),
            strict=True,
        )
    )
    presence = np.zeros((recipe.shuffler_instances, 3), dtype=np.int64)
    data = 0
    summary = None
    for shard in context.shards():
        for item in simulate_shard(context, shard):
            if isinstance(item, ShardSummary):
                summary = item
                continue
            for batch in item[1]:
                index = crowds.names.index(batch.crowd_id)
                origins = batch.origin.copy().view(f"S{batch.origin.shape[1]}").ravel()
                lengths = batch.payloads.lengths
                for origin, length in zip(origins.tolist(), lengths.tolist(), strict=True):
                    assert origin_to_crowd[int(origin.decode(), 16)] == index
                    if length == 0:
                        presence[batch.shuffler_instance, index] += 1
                    else:
                        data += 1
    assert summary is not None
    assert presence.tolist() == [crowds.sizes.tolist()] * recipe.shuffler_instances
    assert data == int(summary.messages.sum())

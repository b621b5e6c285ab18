"""The device fleet: budget checks and refusals, messages, presence, instances, origins, times."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from privacy.rng import seeded_generator
from schemas.recipes import load_recipe, recipe_from_dict
from simulators.fleet import (
    DeviceFleet,
    FleetConfig,
    device_policy_for,
    format_origins,
    origin_ids,
    origin_strings,
)
from simulators.populations import PopulationContext, build_population

# Each chi-square check below fails falsely with probability 1e-6.
FALSE_FAILURE = 1e-6


def chi_square_statistic_ok(statistic: float, degrees: int) -> bool:
    return statistic < stats.chi2.ppf(1 - FALSE_FAILURE, degrees)


def onehot_recipe(**changes):
    data = load_recipe("image_grid_onehot").to_dict()
    data.update(changes)
    return recipe_from_dict(data)


def test_messages_follow_the_randomizer_distribution():
    recipe = load_recipe("image_grid_onehot")
    randomizer = recipe.build_randomizer()
    n, held = 4000, 17
    batch = DeviceFleet(recipe).run(np.full(n, held), 0, seeded_generator(1))
    observed = np.bincount(batch.messages.bucket, minlength=randomizer.domain_size)
    p = np.full(randomizer.domain_size, randomizer.p_zero)
    p[held] = randomizer.p_one
    # Each bucket is Binomial(n, p_j), independent across buckets: sum of squared z-scores ~ chi2(D).
    statistic = float(np.sum((observed - n * p) ** 2 / (n * p * (1 - p))))
    assert chi_square_statistic_ok(statistic, randomizer.domain_size)


def test_every_reporting_device_sends_one_presence_message_to_every_instance():
    recipe = load_recipe("image_grid_onehot")
    fleet = DeviceFleet(recipe)
    batch = fleet.run(np.arange(500) % 4096, 1000, seeded_generator(2))
    k = recipe.shuffler_instances
    assert batch.num_presence == 500 * k
    device_origins = origin_ids(np.arange(1000, 1500), fleet.config.origin_key)
    for instance in range(k):
        in_instance = batch.presence_origin[batch.presence_instance == instance]
        assert np.array_equal(np.sort(in_instance), np.sort(device_origins))
    assert batch.truth_count.sum() == 500 and batch.refusals == 0


def test_instances_follow_uniform_or_stated_trust_weights():
    recipe = load_recipe("image_grid_onehot")
    values = np.zeros(3000, dtype=np.int64)
    for weights in (None, (0.7, 0.1, 0.1, 0.1)):
        fleet = DeviceFleet(recipe, config=FleetConfig(instance_weights=weights))
        batch = fleet.run(values, 0, seeded_generator(3))
        observed = np.bincount(batch.message_instance, minlength=4)
        p = np.full(4, 0.25) if weights is None else np.array(weights)
        statistic = float(np.sum((observed - p * observed.sum()) ** 2 / (p * observed.sum())))
        assert chi_square_statistic_ok(statistic, 3)
    with pytest.raises(ValueError, match="instance weights"):
        DeviceFleet(recipe, config=FleetConfig(instance_weights=(1.0, 1.0)))


def test_origins_are_unique_per_device_and_unrelated_to_value_and_index():
    recipe = load_recipe("image_grid_onehot")
    fleet = DeviceFleet(recipe, config=FleetConfig(origin_key=12345))
    batch = fleet.run(np.full(2000, 5), 0, seeded_generator(4))
    # Every message of a device carries that device's origin; devices never share one.
    pairs = np.unique(
        np.stack([batch.messages.respondent, batch.message_origin.astype(np.int64)]), axis=1
    )
    assert np.unique(pairs[0]).size == pairs.shape[1] == np.unique(pairs[1]).size
    ids = origin_ids(np.arange(100_000), 12345)
    assert np.unique(ids).size == ids.size
    rho = stats.spearmanr(np.arange(ids.size), ids.astype(np.float64)).statistic
    assert abs(rho) < 5 / np.sqrt(ids.size)  # 5 sigma under independence: ~6e-7 false failure
    assert not np.array_equal(ids, origin_ids(np.arange(100_000), 54321))
    text = origin_strings(ids[:3])
    assert all(len(s) == 16 and int(s, 16) == int(i) for s, i in zip(text, ids[:3], strict=True))
    assert format_origins(ids[:3]).shape == (3, 16)


def test_event_times_fall_inside_the_window_of_their_period():
    recipe = load_recipe("longitudinal_boolean")
    fleet = DeviceFleet(recipe, config=FleetConfig(start_ms=1_000_000, rounds=2))
    randomizer = recipe.build_randomizer()
    population = build_population(
        "longitudinal",
        PopulationContext(randomizer.domain_size, periods=16, max_changes=2),
        300,
        seed=1,
    )
    batch = fleet.run(population.values(0, 300), 0, seeded_generator(5))
    day = 86_400_000
    # Longitudinal messages of period t (1..d) of round r belong to window r d + t - 1.
    round_of = batch.message_window // 16
    assert np.array_equal(batch.message_window, round_of * 16 + batch.messages.period - 1)
    for window, times in (
        (batch.message_window, batch.message_event_ms),
        (batch.presence_window, batch.presence_event_ms),
    ):
        start = 1_000_000 + window * day
        assert np.all((start <= times) & (times < start + day))
    assert set(np.unique(batch.presence_window)) == set(range(32))
    assert batch.num_presence == 300 * 4 * 32


def test_refused_budget_count_is_exact():
    # Each run costs the recipe's central target (1.0); a budget of 2.5 pays for two of five.
    recipe = load_recipe("image_grid_onehot")
    fleet = DeviceFleet(
        recipe, policy=device_policy_for(recipe, budget_epsilon=2.5), config=FleetConfig(rounds=5)
    )
    n = 700
    batch = fleet.run(np.arange(n), 0, seeded_generator(6))
    assert batch.refusals == 3 * n and batch.device_rounds == 5 * n
    assert set(np.unique(batch.message_window)) == {0, 1}
    assert np.array_equal(np.bincount(batch.presence_window, minlength=5), [4 * n, 4 * n, 0, 0, 0])
    assert batch.truth_count.sum() == 2 * n


def test_default_budget_pays_for_every_round_in_exact_arithmetic():
    # 3 x 0.7 is 2.0999999999999996 in floats: a float budget would refuse the third run.
    recipe = onehot_recipe(epsilon_central_target=0.7)
    fleet = DeviceFleet(
        recipe, policy=device_policy_for(recipe, runs=3), config=FleetConfig(rounds=3)
    )
    assert fleet.run(np.arange(50), 0, seeded_generator(7)).refusals == 0


def test_recipes_outside_the_query_class_or_budget_are_refused_by_every_device():
    recipe = load_recipe("image_grid_onehot")
    outside = DeviceFleet(
        recipe, policy=device_policy_for(recipe, query_class_fields=["app_category"])
    )
    assert [f.reason for f in outside.refusals_for_all()] == ["field_not_in_query_class"]
    batch = outside.run(np.arange(40), 0, seeded_generator(8))
    assert batch.refusals == 40 and batch.num_messages == 0 and batch.num_presence == 0
    poor = DeviceFleet(recipe, policy=device_policy_for(recipe, budget_epsilon=0.5))
    assert [f.reason for f in poor.refusals_for_all()] == ["budget_too_small"]
    unlimited = DeviceFleet(
        recipe,
        policy=device_policy_for(recipe, budget_epsilon=0.5),
        config=FleetConfig(enforce_budget=False),
    )
    assert unlimited.refusals_for_all() == ()
    assert unlimited.run(np.arange(40), 0, seeded_generator(8)).refusals == 0


def test_report_fragments_spread_over_instances_and_the_same_seed_repeats():
    recipe = load_recipe("image_grid_report_fragmented")
    fleet = DeviceFleet(recipe)
    first = fleet.run(np.arange(60), 0, seeded_generator(9))
    again = fleet.run(np.arange(60), 0, seeded_generator(9))
    assert set(np.unique(first.messages.fragment)) == {1, 2, 3, 4}
    for name in ("message_instance", "message_event_ms", "message_origin", "presence_event_ms"):
        assert np.array_equal(getattr(first, name), getattr(again, name))
    assert np.array_equal(first.messages.bucket, again.messages.bucket)
    # Fragments of one device go to several instances (each picked independently).
    per_device = np.unique(np.stack([first.messages.respondent, first.message_instance]), axis=1)
    assert np.bincount(per_device[0]).max() > 1


def test_values_must_have_the_recipe_shape():
    with pytest.raises(ValueError, match="shape"):
        DeviceFleet(load_recipe("longitudinal_boolean")).run(np.arange(3), 0, seeded_generator(0))

"""Monte Carlo check of the longitudinal marginals the analyzer releases (Algorithm 2 and Theorem 6,
amplification-by-shuffling) on the shipped longitudinal recipes, without a pipeline.

One population from the simulator (``simulators.populations``, with its truth ``true_counts``)
is randomized by the recipe's client (Algorithm 1) ``TRIALS`` times with fixed seeds; each trial's
messages go through the analyzer's own :class:`LongitudinalAccumulator` and
:func:`estimate_longitudinal`, every shuffler instance stating every respondent in every period
(as the simulated fleet's presence messages make them). Over the trials, per period t:

(a) unbiased: the mean error lies within ``Z`` of its standard errors (a bias of 0.25 of one
    trial's stderr fails);
(b) calibrated: the mean of (error / stated stderr)^2 lies within ``Z`` of its standard errors of 1
    (a stated stderr off by ~15-20% fails);
(c) Theorem 6: the bound at β = 0.05 fails in at most the (1 - 1e-5) quantile of Bin(TRIALS, β)
    trials (41 of 400; a bound failing in 15% of runs fails the test).

``Z`` = 4.9 is two-sided normal tail ~1e-6 per cell; Bonferroni over the 2 x 20 period cells of
(a) and (b) and the two binomial checks, a correct implementation fails the module with
probability ~1e-4 for a fresh seed. Population sizes (2,000 and 1,000) only need the normal
approximation; the checks are relative to one trial's stderr, which n does not change.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privacy.rng import seeded_generator
from schemas.recipes import load_recipe
from simulators.populations import PopulationContext, build_population, true_counts
from transforms.analyzer.arithmetic import (
    LONGITUDINAL,
    LongitudinalAccumulator,
    estimate_longitudinal,
)

TRIALS = 400
Z = 4.9
BETA = 0.05
DAY = 86_400_000
ROUND_START = 1_704_067_200_000


def _binomial_upper_quantile(trials: int, p: float, tail: float) -> int:
    """Smallest m with P(Bin(trials, p) > m) <= tail."""
    cumulative = 0.0
    for m in range(trials + 1):
        cumulative += math.comb(trials, m) * p**m * (1 - p) ** (trials - m)
        if 1 - cumulative <= tail:
            return m
    return trials


def _trials(recipe_name: str, respondents: int, seed: int):
    """(estimates, stderrs, bounds, truth) of ``TRIALS`` independent randomizations."""
    recipe = load_recipe(recipe_name)
    client = recipe.build_randomizer()
    context = PopulationContext(
        domain_size=client.domain_size, periods=client.periods, max_changes=client.max_changes
    )
    population = build_population("longitudinal", context, respondents, seed)
    states = population.values(0, respondents)
    periods, buckets, counts = true_counts(states, client.domain_size)
    truth = np.bincount(
        periods[buckets == 1], weights=counts[buckets == 1], minlength=client.periods
    )
    rng = seeded_generator(seed)
    batch = client.randomize(np.tile(states, (TRIALS, 1)), rng)  # respondents tiled: one call
    trial = batch.respondent // respondents
    order = np.argsort(trial, kind="stable")
    ends = np.searchsorted(trial[order], np.arange(TRIALS + 1))
    key = (LONGITUDINAL, 0, DAY, recipe.channel, recipe.id, None)
    estimates, stderrs, bounds = [], [], []
    for index in range(TRIALS):
        rows = order[ends[index] : ends[index + 1]]
        accumulator = LongitudinalAccumulator(client.message_domain_size, DAY)
        accumulator.add_messages(ROUND_START, batch.bucket[rows], batch.sign[rows])
        for period in range(client.periods):
            for instance in range(recipe.shuffler_instances):
                accumulator.set_respondents(ROUND_START + period * DAY, instance, respondents)
        [result] = estimate_longitudinal(recipe, key, accumulator, failure_probability=BETA)
        estimates.append(result.estimate)
        stderrs.append(result.stderr)
        bounds.append(result.bound)
    return np.array(estimates), np.array(stderrs), np.array(bounds), truth


@pytest.fixture(scope="module")
def trials():
    return {
        "small_longitudinal": _trials("small_longitudinal", 2000, seed=601),
        "longitudinal_boolean": _trials("longitudinal_boolean", 1000, seed=602),
    }


@pytest.mark.parametrize("recipe_name", ["small_longitudinal", "longitudinal_boolean"])
def test_marginals_are_unbiased(trials, recipe_name):
    estimates, _, _, truth = trials[recipe_name]
    error = estimates - truth
    mean_stderr = error.std(axis=0, ddof=1) / math.sqrt(TRIALS)
    assert np.all(np.abs(error.mean(axis=0)) <= Z * mean_stderr), error.mean(axis=0) / mean_stderr


@pytest.mark.parametrize("recipe_name", ["small_longitudinal", "longitudinal_boolean"])
def test_stated_stderr_matches_the_spread(trials, recipe_name):
    estimates, stderrs, _, truth = trials[recipe_name]
    z_squared = ((estimates - truth) / stderrs) ** 2
    spread = z_squared.std(axis=0, ddof=1) / math.sqrt(TRIALS)
    deviation = np.abs(z_squared.mean(axis=0) - 1)
    assert np.all(deviation <= Z * spread), z_squared.mean(axis=0)


@pytest.mark.parametrize("recipe_name", ["small_longitudinal", "longitudinal_boolean"])
def test_theorem_6_bound_holds_with_probability_1_minus_beta(trials, recipe_name):
    estimates, _, bounds, truth = trials[recipe_name]
    failures = int(np.count_nonzero(np.abs(estimates - truth).max(axis=1) > bounds))
    assert failures <= _binomial_upper_quantile(TRIALS, BETA, 1e-5)

"""Release decisions (transforms/shuffler/decide.py): pure, seeded, checked against their laws.

Statistical tests use fixed seeds; each chi-square or rank test rejects at p < 1e-5, so a correct
implementation fails one check with probability about 1e-5 (stated per test where it differs).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from privacy.noise import seeded_random_source
from privacy.randomizers import (
    BinaryRandomizedResponse,
    LongitudinalClient,
    OneHotRappor,
    ReportFragmented,
)
from schemas.recipes import shipped_recipes
from transforms.shuffler import decide
from transforms.shuffler import params as shuffle_params

P_FAIL = 1e-5


def test_crowd_threshold_is_the_largest_demand() -> None:
    assert decide.crowd_threshold(100, 0, 20) == 100
    assert decide.crowd_threshold(10, 50, 20) == 50
    assert decide.crowd_threshold(10, 5, 500) == 500
    assert decide.crowd_threshold(0, 0, 0) == 1


def test_split_bits_follow_crowd_size() -> None:
    assert decide.split_bits(0, 100) == 0
    assert decide.split_bits(100, 100) == 0
    assert decide.split_bits(101, 100) == 1
    assert decide.split_bits(1000, 100) == 4
    assert decide.split_bits(10**12, 1, max_bits=16) == 16


def test_origin_shards_reach_every_worker_within_the_size_target() -> None:
    # The measured case: 1,922,707 messages in ~200 spill pieces of 16 workers' ranges.
    messages, pieces = 1_922_707, 200
    assert decide.origin_shard_bits(messages, pieces, 16_384, 1024) == 3  # reads bound: 8
    assert decide.origin_shard_bits(messages, pieces, 16_384, 1024, workers=16) == 4
    assert decide.origin_shard_bits(messages, pieces, 16_384, 1024, workers=13) == 4
    assert decide.origin_shard_bits(messages, pieces, 16_384, 1024, workers=2) == 3
    # Never more shards than the size target asks for: a small bucket stays whole...
    assert decide.origin_shard_bits(10_000, 1, 16_384, 1024, workers=16) == 0
    # ...and a mid-sized one gets what its size needs, not one per worker.
    assert decide.origin_shard_bits(40_000, 100, 16_384, 1024, workers=16) == 2
    # Few pieces: the size target decides alone, workers or not.
    assert decide.origin_shard_bits(messages, 1, 16_384, 1024) == 7
    assert decide.origin_shard_bits(0, 1, 16_384, 1024, workers=16) == 0
    with pytest.raises(ValueError):
        decide.origin_shard_bits(messages, 0, 16_384, 1024)
    with pytest.raises(ValueError):
        decide.origin_shard_bits(messages, pieces, 16_384, 1024, workers=0)


# ---------------------------------------------------------------------------------------------
# Threshold and Algorithm 3
# ---------------------------------------------------------------------------------------------


def test_below_threshold_is_withheld_without_noise() -> None:
    decision = decide.decide_crowd(
        9, 10, shuffle_params.DeletionParameters(1.0, 1e-6), seeded_random_source(5)
    )
    assert decision.status == decide.WITHHELD and decision.withheld_reason == decide.BELOW_THRESHOLD
    assert decision.respondents_kept == 0 and decision.respondents_deleted == 0


def test_without_deletion_every_respondent_is_kept() -> None:
    decision = decide.decide_crowd(10, 10, None, seeded_random_source(5))
    assert decision.status == decide.RELEASED and decision.respondents_kept == 10


@pytest.mark.parametrize(
    ("respondents", "threshold", "epsilon", "delta"),
    [(40, 30, 1.0, 0.5), (200, 10, 0.5, 1e-3)],
)
def test_released_respondents_follow_algorithm_3(
    respondents: int, threshold: int, epsilon: float, delta: float
) -> None:
    """The released count's distribution equals the exact pmf of Algorithm 3 with discrete
    Laplace noise (withheld = aborted or below the threshold after deletion)."""
    params = shuffle_params.DeletionParameters(epsilon, delta)
    source = seeded_random_source(6)
    draws = 20_000
    kept = np.array(
        [
            (d.respondents_kept if d.status == decide.RELEASED else -1)
            for d in (
                decide.decide_crowd(respondents, threshold, params, source) for _ in range(draws)
            )
        ]
    )
    pmf, withheld = decide.released_respondents_pmf(respondents, threshold, params)
    assert math.isclose(pmf.sum() + withheld, 1.0)
    # Cells: withheld, then released counts, pooled so every expected count is >= 5.
    values = np.arange(respondents + 1)
    expected_cells, observed_cells = [withheld * draws], [np.sum(kept == -1)]
    pending_expected, pending_observed = 0.0, 0
    for value in values:
        pending_expected += pmf[value] * draws
        pending_observed += int(np.sum(kept == value))
        if pending_expected >= 5:
            expected_cells.append(pending_expected)
            observed_cells.append(pending_observed)
            pending_expected, pending_observed = 0.0, 0
    expected_cells[-1] += pending_expected
    observed_cells[-1] += pending_observed
    assert np.sum(kept >= 0) > 0 and set(kept[kept >= 0].tolist()) <= set(
        range(threshold, respondents + 1)
    )
    result = stats.chisquare(observed_cells, expected_cells)
    assert result.pvalue > P_FAIL, (observed_cells, expected_cells)


def test_deletion_aborts_with_probability_below_half_delta() -> None:
    params = shuffle_params.DeletionParameters(1.0, 0.2)
    pmf, withheld = decide.released_respondents_pmf(1000, 1, params)
    assert withheld <= 0.2 / 2  # Theorem V.1: abort probability <= delta_cr / 2


def test_uniform_subset_is_uniform() -> None:
    source = seeded_random_source(7)
    for population, size in ((6, 2), (6, 4)):  # the second draws the complement
        subsets = list(itertools.combinations(range(population), size))
        index = {subset: position for position, subset in enumerate(subsets)}
        counts = np.zeros(len(subsets))
        for _ in range(6000):
            chosen = decide.uniform_subset(population, size, source)
            assert len(set(chosen.tolist())) == size and list(chosen) == sorted(chosen)
            counts[index[tuple(chosen.tolist())]] += 1
        assert stats.chisquare(counts).pvalue > P_FAIL
    assert decide.uniform_subset(10, 0, source).size == 0
    assert decide.uniform_subset(10, 10, source).tolist() == list(range(10))
    with pytest.raises(ValueError):
        decide.uniform_subset(3, 4, source)


def test_split_deletions_is_multivariate_hypergeometric() -> None:
    source = seeded_random_source(8)
    shards = np.array([3, 5, 2])
    deleted = 4
    draws = 6000
    outcomes: dict[tuple[int, ...], int] = {}
    for _ in range(draws):
        split = decide.split_deletions(shards, deleted, source)
        assert split.sum() == deleted and np.all(split <= shards)
        outcomes[tuple(split.tolist())] = outcomes.get(tuple(split.tolist()), 0) + 1
    total = math.comb(int(shards.sum()), deleted)
    support = [
        split
        for split in itertools.product(*(range(s + 1) for s in shards))
        if sum(split) == deleted
    ]
    expected = [
        draws * math.prod(math.comb(s, k) for s, k in zip(shards, split, strict=True)) / total
        for split in support
    ]
    observed = [outcomes.get(split, 0) for split in support]
    assert sum(observed) == draws
    assert stats.chisquare(observed, expected).pvalue > P_FAIL


def test_kept_rows_remove_whole_respondents() -> None:
    source = seeded_random_source(9)
    codes = np.array([0, 1, 1, 2, 2, 2, 3, 0, 4])
    kept = decide.kept_rows(codes, distinct=5, deleted=2, source=source)
    removed = set(codes[~kept].tolist())
    assert len(removed) == 2
    assert not set(codes[kept].tolist()) & removed


def test_merged_buckets_are_uniform_groups() -> None:
    source = seeded_random_source(11)
    buckets = decide.assign_groups(40_000, 16, source)
    groups = decide.group_of_bucket(buckets, bucket_bits=4, group_bits=2)
    assert set(groups.tolist()) == {0, 1, 2, 3}
    assert np.array_equal(groups, buckets // 4)
    assert stats.chisquare(np.bincount(groups, minlength=4)).pvalue > P_FAIL
    with pytest.raises(ValueError):
        decide.group_of_bucket(buckets, bucket_bits=2, group_bits=3)


def test_groups_and_order_are_uniform() -> None:
    source = seeded_random_source(10)
    groups = decide.assign_groups(40_000, 8, source)
    assert stats.chisquare(np.bincount(groups, minlength=8)).pvalue > P_FAIL
    # Position of element 0 under the release order is uniform over 10 slots.
    positions = np.array(
        [np.flatnonzero(decide.release_order(10, source) == 0)[0] for _ in range(5000)]
    )
    assert stats.chisquare(np.bincount(positions, minlength=10)).pvalue > P_FAIL
    # No rank correlation between arrival order and release order.
    order = decide.release_order(5000, source)
    rho = stats.spearmanr(np.arange(5000), order).statistic
    assert abs(rho) < 4.5 / math.sqrt(5000 - 1)  # 4.5 sigma: ~7e-6 per check


def test_complete_groups_merges_buckets_by_released_count() -> None:
    # 8 buckets; 30 released messages at 10 per file -> 4 groups of 2 contiguous buckets each.
    groups = decide.complete_groups([0, 1, 2, 3, 5, 6, 7], 3, 30, 10)
    assert groups == {0: [0, 1], 1: [2, 3], 2: [4], 3: [5, 6]}
    assert decide.complete_groups([0, 7], 3, 5, 10) == {0: [0, 1]}  # few messages: one group
    assert decide.complete_groups([], 3, 0, 10) == {}


def test_deleted_respondents_are_uniform_over_the_crowd() -> None:
    """Scatter over shards (hypergeometric) then uniform choice inside each shard: every one of
    the n respondents is deleted with probability k/n, whatever shard it is in."""
    source = seeded_random_source(12)
    shards = np.array([2, 5, 1, 4])
    starts = np.concatenate(([0], np.cumsum(shards)[:-1]))
    deleted, draws = 3, 8000
    hits = np.zeros(int(shards.sum()))
    for _ in range(draws):
        per_shard = decide.split_deletions(shards, deleted, source)
        for shard, (size, count) in enumerate(zip(shards, per_shard, strict=True)):
            kept = decide.kept_rows(np.arange(size), int(size), int(count), source)
            hits[starts[shard] + np.flatnonzero(~kept)] += 1
    assert hits.sum() == deleted * draws
    assert stats.chisquare(hits).pvalue > P_FAIL


def test_release_order_is_a_uniform_permutation() -> None:
    source = seeded_random_source(13)
    counts = dict.fromkeys(itertools.permutations(range(4)), 0)
    for _ in range(12_000):
        counts[tuple(decide.release_order(4, source).tolist())] += 1
    assert stats.chisquare(list(counts.values())).pvalue > P_FAIL


# ---------------------------------------------------------------------------------------------
# Per-origin screening and caps
# ---------------------------------------------------------------------------------------------


def test_screening_counts_one_presence_and_caps_data_per_origin() -> None:
    hashes = np.array([7, 7, 7, 7, 7, 3, 3, 9], dtype=np.uint64)
    presence = np.array([True, False, True, False, False, False, True, True])
    codes = decide.screen_origin_messages(hashes, presence, cap=2)
    assert codes.tolist() == [
        decide.PRESENCE,
        decide.DATA,
        decide.DUPLICATE_PRESENCE,
        decide.DATA,
        decide.OVER_ORIGIN_CAP,  # origin 7's third data message
        decide.DATA,
        decide.PRESENCE,
        decide.PRESENCE,
    ]
    uncapped = decide.screen_origin_messages(hashes, presence, cap=None)
    assert np.count_nonzero(uncapped == decide.OVER_ORIGIN_CAP) == 0
    # Deterministic: the same rows screen the same way (a shard is read twice).
    assert np.array_equal(codes, decide.screen_origin_messages(hashes, presence, cap=2))


def test_one_origin_flooding_keeps_at_most_one_presence_and_cap_data() -> None:
    rng = np.random.default_rng(14)
    hashes = np.concatenate((np.full(10_000, 1, np.uint64), np.arange(2, 22, dtype=np.uint64)))
    presence = np.concatenate((rng.random(10_000) < 0.5, np.zeros(20, bool)))
    codes = decide.screen_origin_messages(hashes, presence, cap=3)
    flooder = codes[:10_000]
    assert np.count_nonzero(flooder == decide.PRESENCE) == 1
    assert np.count_nonzero(flooder == decide.DATA) == 3
    assert np.all(codes[10_000:] == decide.DATA)


def _screened_by_definition(crowds, hashes, presence, caps, count):
    """Screening codes, distinct origins per crowd and origin codes straight from their
    definitions, one message at a time (a reference for small inputs)."""
    seen: dict[tuple, int] = {}
    codes = []
    for crowd, origin, is_presence, cap in zip(crowds, hashes, presence, caps, strict=True):
        key = (int(crowd), int(origin), bool(is_presence))
        earlier = seen.get(key, 0)
        seen[key] = earlier + 1
        if is_presence:
            codes.append(decide.DUPLICATE_PRESENCE if earlier else decide.PRESENCE)
        else:
            codes.append(decide.OVER_ORIGIN_CAP if 0 <= cap <= earlier else decide.DATA)
    pairs = list(zip(crowds.tolist(), hashes.tolist(), strict=True))
    origins_of = [sorted({h for c, h in pairs if c == k}) for k in range(count)]
    origins = [origins_of[c].index(h) for c, h in pairs]
    return codes, [len(o) for o in origins_of], origins


def test_screening_and_origin_codes_of_many_crowds_match_their_definitions() -> None:
    rng = np.random.default_rng(15)
    for _ in range(60):
        rows = int(rng.integers(1, 300))
        count = int(rng.integers(1, 5))
        crowds = rng.integers(0, count, rows)
        # Few distinct origins, so that origins repeat within and across crowds.
        hashes = rng.integers(0, int(rng.integers(1, 40)), rows).astype(np.uint64) * np.uint64(
            0x9E3779B97F4A7C15
        )
        presence = rng.random(rows) < 0.3
        caps = rng.integers(-1, 4, count)[crowds]
        screened = decide.screen_crowd_messages_and_origins(crowds, hashes, presence, caps, count)
        codes, distinct, origins = _screened_by_definition(crowds, hashes, presence, caps, count)
        assert screened.codes.tolist() == codes
        assert screened.distinct.tolist() == distinct
        assert screened.origins.tolist() == origins
        assert decide.screen_crowd_messages(crowds, hashes, presence, caps).tolist() == codes


def _tail(m: int, n1: int, p1: float, n2: int, p2: float) -> float:
    """P(X1 + X2 > m) by direct convolution of the two pmfs (a reference for small n)."""
    pmf = np.convolve(
        stats.binom.pmf(np.arange(n1 + 1), n1, p1), stats.binom.pmf(np.arange(n2 + 1), n2, p2)
    )
    return float(pmf[m + 1 :].sum())


@pytest.mark.parametrize(
    ("n1", "p1", "n2", "p2"), [(1, 0.9, 60, 0.05), (3, 0.5, 200, 0.2), (1, 0.3, 0, 0.0)]
)
def test_cap_is_the_smallest_count_with_tail_below_the_bound(n1, p1, n2, p2) -> None:
    tail = 1e-9
    m = decide._two_binomial_quantile(n1, p1, n2, p2, tail)
    assert _tail(m, n1, p1, n2, p2) <= tail * (1 + 1e-6)
    if m > 0:
        assert _tail(m - 1, n1, p1, n2, p2) > tail


def test_caps_of_each_randomizer_family() -> None:
    # Binary randomized response and the longitudinal client send at most one message per report.
    assert decide.max_messages_per_respondent(BinaryRandomizedResponse(1.0), 1.0) == 1
    assert decide.max_messages_per_respondent(LongitudinalClient(16, 2, 2.0), 0.25, reports=3) == 3
    # k-RAPPOR over 4,096 cells at eps 4.45, a quarter of the messages to this instance: about
    # 0.25 * 4095 / (1 + e^4.45) = 11.9 expected; the 1e-12 cap sits well above it.
    rappor = OneHotRappor(4096, 4.45)
    cap = decide.max_messages_per_respondent(rappor, 0.25)
    mean = 0.25 * rappor.expected_messages_per_respondent()
    assert mean + 5 * math.sqrt(mean) < cap < mean + 15 * math.sqrt(mean)
    assert decide.max_messages_per_respondent(rappor, 1.0) > cap
    # Report fragmentation sends tau re-randomized fragments of every set bit.
    fragmented = ReportFragmented(6.0, 1.5, 4, 4096)
    per_instance = 0.25 * fragmented.expected_messages_per_respondent()
    fragmented_cap = decide.max_messages_per_respondent(fragmented, 0.25)
    assert per_instance < fragmented_cap < 1.5 * per_instance
    with pytest.raises(ValueError):
        decide.max_messages_per_respondent(rappor, 1.5)


def test_every_shipped_recipe_has_caps_for_its_instances() -> None:
    for recipe in shipped_recipes().values():
        caps = decide.recipe_origin_caps(recipe)
        assert len(caps) == recipe.shuffler_instances and all(cap >= 1 for cap in caps)
        route = shuffle_params.routes_from_recipes({recipe.id: recipe})[recipe.id]
        assert (
            route.origin_cap(0) == caps[0] and route.origin_cap(recipe.shuffler_instances) is None
        )
    # A shuffler window of 7 daily recipe windows lets a device report 7 times into one crowd.
    recipe = shipped_recipes()["image_grid_onehot@1"]
    assert (
        decide.recipe_origin_caps(recipe, 7 * 86_400_000)[0] > decide.recipe_origin_caps(recipe)[0]
    )
    assert decide.reports_per_crowd(7 * 86_400_000, 86_400_000) == 7
    assert decide.reports_per_crowd(86_400_000, 86_400_000) == 1
    assert decide.reports_per_crowd(3_600_000, 86_400_000) == 1
    assert decide.reports_per_crowd(int(1.5 * 86_400_000), 86_400_000) == 3


def test_a_prio3_device_may_put_one_report_per_recipe_window_into_a_crowd() -> None:
    """Every report of the aggregate model is a whole valid vector: a device that sent two would
    count twice, so the shuffler keeps one per recipe window and origin (over_origin_cap)."""
    recipe = shipped_recipes()["image_grid_prio3@1"]
    assert decide.recipe_origin_caps(recipe) == (1,) * recipe.shuffler_instances
    assert decide.recipe_origin_caps(recipe, 7 * 86_400_000) == (7,) * recipe.shuffler_instances
    hashes = np.array([5, 5, 5, 9], dtype=np.uint64)
    codes = decide.screen_origin_messages(hashes, np.zeros(4, dtype=bool), 1)
    assert codes.tolist() == [
        decide.DATA,
        decide.OVER_ORIGIN_CAP,
        decide.OVER_ORIGIN_CAP,
        decide.DATA,
    ]

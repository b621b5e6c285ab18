"""The exact aggregate simulator: same distribution as messages, paper scale in seconds."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from privacy.randomizers import build_randomizer
from privacy.rng import seeded_generator
from schemas.recipes import load_recipe, recipe_from_dict
from simulators.exact import PAPER_DATASETS, exact_bucket_sums, paper_counts, simulate_exact
from simulators.fleet import DeviceFleet

DOMAIN = 8
COUNTS = np.array([0, 5, 40, 120, 3, 0, 30, 2], dtype=np.int64)
REPLICATES = 400


def small_recipe(name: str):
    """A shipped recipe shrunk to an 8-bucket domain (same randomizer and epsilons)."""
    data = load_recipe(name).to_dict()
    data["randomizer_params"] = {**data["randomizer_params"], "domain_size": DOMAIN}
    return recipe_from_dict(data)


def message_level_sums(recipe, seed: int) -> np.ndarray:
    """Bucket sums of REPLICATES independent crowds, each holding COUNTS, from real messages."""
    crowd = np.repeat(np.arange(DOMAIN), COUNTS)
    values = np.tile(crowd, REPLICATES)
    batch = DeviceFleet(recipe).run(values, 0, seeded_generator(seed))
    replicate = batch.messages.respondent // crowd.size
    flat = replicate * DOMAIN + batch.messages.bucket
    return np.bincount(flat, minlength=REPLICATES * DOMAIN).reshape(REPLICATES, DOMAIN)


@pytest.mark.parametrize("name", ["image_grid_onehot", "image_grid_report_fragmented"])
def test_exact_draw_agrees_in_distribution_with_the_message_level_path(name):
    recipe = small_recipe(name)
    randomizer = recipe.build_randomizer()
    messages = message_level_sums(recipe, seed=11).astype(np.float64)
    rng = seeded_generator(12)
    exact = np.stack([exact_bucket_sums(randomizer, COUNTS, rng) for _ in range(REPLICATES)])
    # Per bucket, Welch's z of the two means: |z| < 5 fails falsely with ~6e-7 per bucket.
    spread = np.sqrt(
        messages.var(axis=0, ddof=1) / REPLICATES + exact.var(axis=0, ddof=1) / REPLICATES
    )
    assert np.all(np.abs(messages.mean(axis=0) - exact.mean(axis=0)) < 5 * spread)
    # Whole distributions, pooled over buckets after standardizing with the exact sample's
    # moments (exchangeable under the null): two-sample KS, false-failure rate 1e-6.
    centre, scale = exact.mean(axis=0), exact.std(axis=0, ddof=1)
    pvalue = stats.ks_2samp(
        ((messages - centre) / scale).ravel(), ((exact - centre) / scale).ravel()
    ).pvalue
    assert pvalue > 1e-6
    # Variances agree as well (F test per bucket, two-sided 1e-6 each).
    ratio = messages.var(axis=0, ddof=1) / exact.var(axis=0, ddof=1)
    low, high = stats.f.ppf([5e-7, 1 - 5e-7], REPLICATES - 1, REPLICATES - 1)
    assert np.all((low < ratio) & (ratio < high))


def test_paper_datasets_have_table_ii_sizes():
    for name, dataset in PAPER_DATASETS.items():
        counts = paper_counts(name)
        assert counts.size == dataset.domain_size and counts.sum() == dataset.respondents
    with pytest.raises(ValueError, match="unknown paper dataset"):
        paper_counts("zebra")


def test_paper_scale_map_setting():
    # The largest setting of esa-privacy-revisited Table II: 236,559,063 respondents, 2,795,520
    # buckets. Message-level simulation would make ~10^9-10^11 messages; the exact draw none.
    # (Its speed: benchmarks/bench_simulators.py.)
    counts = paper_counts("map")
    randomizer = build_randomizer("one_hot_rappor", {"domain_size": counts.size, "epsilon": 8.0})
    result = simulate_exact(randomizer, counts, seeded_generator(3))
    assert result.respondents == 236_559_063 and result.bucket_sums.size == 2_795_520
    p1, p0 = randomizer.p_one, randomizer.p_zero
    n = result.respondents
    mean = counts * p1 + (n - counts) * p0
    variance = counts * p1 * (1 - p1) + (n - counts) * p0 * (1 - p0)
    z = (result.bucket_sums - mean) / np.sqrt(variance)
    # Over 2.8 M independent buckets: mean of z within 5 standard errors, variance of z near 1
    # (each bound ~6e-7 false failure under a normal approximation of the binomial sums).
    assert abs(z.mean()) < 5 / np.sqrt(z.size)
    assert abs(z.var() - 1) < 5 * np.sqrt(3 / z.size)
    estimate = result.estimate(randomizer)
    assert np.asarray(estimate.estimate).size == counts.size


def test_exact_draw_refuses_what_it_cannot_do():
    sketch = load_recipe("heavy_hitters_cms").build_randomizer()
    with pytest.raises(ValueError, match="no exact aggregate draw"):
        exact_bucket_sums(sketch, np.zeros(sketch.domain_size, dtype=np.int64), seeded_generator(0))
    onehot = build_randomizer("one_hot_rappor", {"domain_size": 4, "epsilon": 1.0})
    with pytest.raises(ValueError, match="buckets"):
        exact_bucket_sums(onehot, np.ones(5, dtype=np.int64), seeded_generator(0))
    with pytest.raises(ValueError, match="non-negative integers"):
        exact_bucket_sums(onehot, np.array([1.5, 0, 0, 0]), seeded_generator(0))

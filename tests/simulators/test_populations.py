"""Populations: spec strings, range determinism, count histograms, sampled laws, longitudinal users."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from simulators import images
from simulators.populations import (
    SAMPLING_BLOCK,
    CountsPopulation,
    PopulationContext,
    apportion,
    build_population,
    heavy_hitter_counts,
    image_counts,
    parse_population_spec,
    true_counts,
)

# Chi-square checks use this false-failure rate each.
FALSE_FAILURE = 1e-6


def chi_square_ok(observed: np.ndarray, probabilities: np.ndarray) -> bool:
    expected = probabilities * observed.sum()
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    return statistic < stats.chi2.ppf(1 - FALSE_FAILURE, observed.size - 1)


def test_spec_parsing_round_trips_and_names_bad_parts():
    spec = parse_population_spec("image:horse,size=64x48")
    assert (spec.kind, spec.variant, spec.get("size")) == ("image", "horse", "64x48")
    assert str(parse_population_spec(" zipf , exponent=1.2 ")) == "zipf,exponent=1.2"
    for bad, words in [
        ("gaussian", "unknown population"),
        ("zipf,domain", "KEY=VALUE"),
        ("zipf,color=red", "does not take color"),
        ("image", "needs a name"),
        ("uniform:big", "takes no"),
        ("zipf,exponent=1,exponent=2", "repeats"),
        ("", "empty"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_population_spec(bad)


@pytest.mark.parametrize("spec", ["uniform", "zipf,exponent=1.3", "heavy-hitters", "image:disc"])
def test_any_sharding_gives_the_same_values(spec):
    population = build_population(spec, PopulationContext(1024), 3 * SAMPLING_BLOCK // 2, seed=4)
    whole = population.values(0, population.size)
    cuts = [0, 1, 999, SAMPLING_BLOCK - 1, SAMPLING_BLOCK + 7, population.size]
    pieces = [population.values(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    assert np.array_equal(np.concatenate(pieces), whole)
    assert whole.min() >= 0 and whole.max() < 1024
    again = build_population(spec, PopulationContext(1024), 3 * SAMPLING_BLOCK // 2, seed=4)
    assert np.array_equal(again.values(5, 500), whole[5:500])
    other = build_population(spec, PopulationContext(1024), 3 * SAMPLING_BLOCK // 2, seed=5)
    assert not np.array_equal(other.values(0, 1000), whole[:1000])


def test_count_population_hands_out_exactly_its_counts_in_scrambled_order():
    counts = np.array([5, 0, 3, 1, 0, 11], dtype=np.int64)
    population = CountsPopulation(counts, seed=9)
    values = population.values(0, population.size)
    assert np.array_equal(np.bincount(values, minlength=counts.size), counts)
    assert not np.all(np.diff(values) >= 0)  # respondent order is not value order
    with pytest.raises(ValueError, match="outside"):
        population.values(0, population.size + 1)


def test_apportion_sums_exactly_and_stays_within_one_of_proportional():
    rng = np.random.default_rng(3)
    weights = rng.random(10_000) ** 3
    counts = apportion(weights, 1_234_567)
    assert counts.sum() == 1_234_567
    assert np.all(np.abs(counts - weights / weights.sum() * 1_234_567) < 1)
    with pytest.raises(ValueError, match="not all zero"):
        apportion(np.zeros(3), 5)


def test_heavy_hitter_shape_at_paper_scale():
    # esa-privacy-revisited VII-A / Table II: 203,950,512 respondents over 1,778,120 values.
    # (Its speed: benchmarks/bench_simulators.py.)
    counts = heavy_hitter_counts(1_778_120, 203_950_512, seed=1)
    assert counts.size == 1_778_120 and counts.sum() == 203_950_512
    ranked = np.sort(counts)[::-1].astype(np.float64)
    # Beyond the 100 heavy hitters the tail follows p(x) ∝ x^-1.35 (log-log slope).
    ranks = np.arange(1000, 100_000)
    slope = np.polyfit(np.log(ranks + 1), np.log(ranked[ranks]), 1)[0]
    assert slope == pytest.approx(-1.35, abs=0.02)
    population = build_population("heavy-hitters", PopulationContext(5000), 100_000, seed=2)
    assert np.array_equal(
        np.bincount(population.values(0, 100_000), minlength=5000), population.exact_counts()
    )


def test_sampled_populations_follow_their_laws():
    domain, n = 50, 200_000
    uniform = build_population("uniform", PopulationContext(domain), n, seed=1)
    assert chi_square_ok(
        np.bincount(uniform.values(0, n), minlength=domain), np.full(domain, 1 / domain)
    )
    zipf = build_population("zipf,exponent=1.4", PopulationContext(domain), n, seed=1)
    law = np.arange(1, domain + 1) ** -1.4
    assert chi_square_ok(np.bincount(zipf.values(0, n), minlength=domain), law / law.sum())


def test_population_domain_must_match_the_recipe():
    with pytest.raises(ValueError, match="does not match"):
        build_population("uniform,domain=10", PopulationContext(11), 5, seed=0)
    with pytest.raises(ValueError, match="needs a number of respondents"):
        build_population("zipf", PopulationContext(11), None, seed=0)
    with pytest.raises(ValueError, match="respondents"):
        build_population("uniform", PopulationContext(11), 0, seed=0)


def test_longitudinal_users_change_at_most_k_times_uniformly():
    periods, changes, n = 8, 3, 40_000
    population = build_population(
        "longitudinal", PopulationContext(periods, periods=periods, max_changes=changes), n, seed=6
    )
    states = population.values(0, n)
    assert states.shape == (n, periods) and states.dtype == bool
    # The state before period 1 is False (amplification-by-shuffling Algorithm 1).
    flips = np.count_nonzero(np.diff(states.astype(int), axis=1, prepend=0), axis=1)
    assert flips.max() <= changes
    assert chi_square_ok(np.bincount(flips, minlength=changes + 1), np.full(changes + 1, 0.25))
    with pytest.raises(ValueError, match="exceeds"):
        build_population(
            "longitudinal,changes=4", PopulationContext(8, periods=8, max_changes=3), 10, seed=0
        )
    with pytest.raises(ValueError, match="periods"):
        build_population("longitudinal,changes=1", PopulationContext(8), 10, seed=0)


def test_true_counts_of_categories_and_of_boolean_periods():
    period, bucket, count = true_counts(np.array([3, 1, 3, 3]), 5)
    assert period.tolist() == [0, 0] and bucket.tolist() == [1, 3] and count.tolist() == [1, 3]
    states = np.array([[True, False], [True, True], [False, False]])
    period, bucket, count = true_counts(states, 2)
    assert list(zip(period.tolist(), bucket.tolist(), count.tolist(), strict=True)) == [
        (0, 0, 1),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 1),
    ]


def test_generated_images_need_no_optional_package():
    disc = images.load_image("disc", (32, 32))
    assert disc.shape == (32, 32) and disc.dtype == np.uint8
    assert disc[16, 16] == 255 and disc[0, 0] < 60
    gradient = images.generated_image("gradient", (4, 6))
    assert gradient[0, 0] == 0 and gradient[-1, -1] == 255
    population = build_population("image:disc", PopulationContext(32 * 32), None, seed=0)
    assert population.size == int(disc.astype(np.int64).sum())  # one respondent per luminosity
    assert np.array_equal(population.exact_counts(), image_counts(disc))


def test_images_are_scaled_to_respondents_and_checked_against_the_grid():
    scaled = build_population("image:gradient", PopulationContext(64 * 64), 10_000, seed=0)
    assert scaled.size == 10_000
    with pytest.raises(ValueError, match="has 100 pixels"):
        build_population("image:disc,size=10x10", PopulationContext(4096), None, seed=0)
    with pytest.raises(ValueError, match="not a square grid"):
        build_population("image:disc", PopulationContext(4095), None, seed=0)
    with pytest.raises(ValueError, match="ROWSxCOLS"):
        build_population("image:disc,size=big", PopulationContext(4096), None, seed=0)


def test_an_image_that_cannot_be_read_is_a_clear_error(tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    with pytest.raises(ValueError, match="cannot read image"):
        build_population(f"image:{broken}", PopulationContext(4096), None, seed=0)
    with pytest.raises(ValueError, match="cannot read image"):
        images.load_image(str(tmp_path / "missing.png"))
    with pytest.raises(ValueError, match="unknown image"):
        images.load_image("zebra")


def test_an_image_file_is_resized_to_the_recipe_grid(tmp_path):
    from PIL import Image

    path = tmp_path / "picture.png"
    Image.fromarray(images.generated_image("disc", (100, 80))).save(path)
    population = build_population(f"image:{path}", PopulationContext(64 * 64), None, seed=0)
    assert population.domain_size == 4096 and population.size > 0


def test_bundled_images_resize_to_the_recipe_grid():
    pytest.importorskip("skimage")
    for name in images.BUNDLED_IMAGES:
        population = build_population(f"image:{name}", PopulationContext(64 * 64), None, seed=0)
        assert population.domain_size == 4096 and population.size > 0
    horse = images.bundled_image("horse")
    assert horse.mean() < 128  # the horse is bright on a mostly black background

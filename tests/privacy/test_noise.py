"""Exact samplers of privacy.noise: uniform integers, Bernoulli(exp(-gamma)), discrete Laplace,
secure permutations. Statistical checks use fixed seeds; each states its false-failure rate for a
correct sampler (the probability that a fresh seed would fail it)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from privacy import noise

# Tolerances: 5 sigma two-sided (~5.7e-7 per check); chi-square p-value floor 1e-6 (1e-6 per check).
SIGMAS = 5.0
P_FLOOR = 1e-6


class ScriptedSource:
    """A source that returns prescribed bytes, to check how samplers consume randomness."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.consumed = 0

    def random_bytes(self, n: int) -> bytes:
        if self.consumed + n > len(self._data):
            raise AssertionError("sampler asked for more bytes than scripted")
        chunk = self._data[self.consumed : self.consumed + n]
        self.consumed += n
        return chunk


def assert_frequency(successes: int, trials: int, p: float) -> None:
    sigma = math.sqrt(p * (1 - p) / trials)
    assert abs(successes / trials - p) <= SIGMAS * sigma + 1e-12, (successes / trials, p)


def chi_square_against_pmf(samples: np.ndarray, pmf: np.ndarray, support: np.ndarray) -> float:
    """p-value of a chi-square goodness-of-fit test. ``support`` must carry all but a negligible
    part of the mass; bins with expected count < 5 are merged into a lower and an upper tail."""
    n = samples.size
    expected = pmf * n
    inner = support[expected >= 5]
    low, high = inner.min(), inner.max()
    observed = np.concatenate(
        [
            [np.sum(samples < low)],
            np.bincount(
                samples[(samples >= low) & (samples <= high)] - low, minlength=high - low + 1
            ),
            [np.sum(samples > high)],
        ]
    )
    expected_bins = np.concatenate(
        [
            [expected[support < low].sum()],
            expected[(support >= low) & (support <= high)],
            [expected[support > high].sum()],
        ]
    )
    return stats.chisquare(observed, expected_bins * n / expected_bins.sum()).pvalue


def test_scalar_uniform_below_maps_every_byte_exactly_uniformly() -> None:
    # n = 5 needs 3 bits: of the 256 possible bytes, the accepted ones hit each value 32 times.
    outputs = []
    for byte in range(256):
        source = ScriptedSource(bytes([byte, 0]))  # a rejected byte is followed by 0 -> value 0
        value = noise.uniform_below(5, source)
        if source.consumed == 1:
            outputs.append(value)
    assert np.bincount(outputs, minlength=5).tolist() == [32] * 5
    assert len(outputs) == 160


def test_vector_uniform_below_accepts_exactly_up_to_the_last_full_multiple() -> None:
    d = 3  # 2**64 mod 3 == 1: the largest accepted word is 2**64 - 2
    largest = 2**64 - 2
    words = [largest, largest + 1, 7]  # accepted, rejected (then 7 is drawn)
    data = b"".join(w.to_bytes(8, "little") for w in words)
    source = ScriptedSource(data)
    values = noise.uniform_below(d, source, size=2)
    assert values.tolist() == [largest % d, 7 % d]
    assert source.consumed == 24


def test_vector_uniform_below_is_uniform() -> None:
    source = noise.seeded_random_source(11)
    values = noise.uniform_below(7, source, size=70_000)
    assert values.min() >= 0 and values.max() < 7
    assert stats.chisquare(np.bincount(values, minlength=7)).pvalue > P_FLOOR


@pytest.mark.parametrize("n, width", [(2, 1), (16, 1), (256, 1), (512, 2), (1 << 16, 2)])
def test_vector_uniform_below_a_power_of_two_keeps_the_low_bits_of_every_byte(
    n: int, width: int
) -> None:
    # Every possible value of the 1 or 2 bytes read per draw is kept (no rejection) and its low
    # log2(n) bits are the value: each output is hit by the same number of byte values.
    words = np.arange(1 << (8 * width), dtype=np.uint64)
    data = words.astype(np.uint8 if width == 1 else "<u2").tobytes()
    source = ScriptedSource(data)
    values = noise.uniform_below(n, source, size=words.size)
    assert source.consumed == len(data)
    assert values.tolist() == (words % n).tolist()
    assert np.bincount(values, minlength=n).tolist() == [words.size // n] * n


def test_vector_uniform_below_a_power_of_two_is_uniform() -> None:
    source = noise.seeded_random_source(12)
    for n in (8, 1024):
        values = noise.uniform_below(n, source, size=40 * n)
        assert values.min() >= 0 and values.max() < n
        assert stats.chisquare(np.bincount(values, minlength=n)).pvalue > P_FLOOR
    assert noise.uniform_below(1, ScriptedSource(b""), size=5).tolist() == [0] * 5


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2), 0.3])
def test_bernoulli_exp_vectorized_matches_exp_minus_gamma(gamma: Fraction | float) -> None:
    source = noise.seeded_random_source(21)
    trials = 200_000
    draws = noise.bernoulli_exp(gamma, source, size=trials)
    assert_frequency(int(draws.sum()), trials, math.exp(-float(gamma)))


def test_bernoulli_exp_scalar_matches_exp_minus_gamma() -> None:
    source = noise.seeded_random_source(22)
    trials = 20_000
    successes = sum(noise.bernoulli_exp(Fraction(3, 4), source) for _ in range(trials))
    assert_frequency(successes, trials, math.exp(-0.75))


def test_bernoulli_exp_continues_exactly_past_the_uint64_range() -> None:
    # Denominator 2**62 + 1 allows only K = 1 in uint64; K >= 2 continues in Python integers.
    gamma = Fraction(2**62, 2**62 + 1)
    source = noise.seeded_random_source(23)
    trials = 20_000
    draws = noise.bernoulli_exp(gamma, source, size=trials)
    assert_frequency(int(draws.sum()), trials, math.exp(-float(gamma)))


def test_bernoulli_is_exact_rational() -> None:
    source = noise.seeded_random_source(24)
    trials = 100_000
    assert_frequency(int(noise.bernoulli("2/7", source, size=trials).sum()), trials, 2 / 7)
    assert noise.bernoulli(0, source) is False and noise.bernoulli(1, source) is True


@pytest.mark.parametrize("scale", [Fraction(5, 2), Fraction(1, 3), 2 / 0.3, Fraction(40)], ids=str)
def test_discrete_laplace_matches_exact_pmf(scale: Fraction | float) -> None:
    source = noise.seeded_random_source(31)
    samples = noise.sample_discrete_laplace(scale, source, size=100_000)
    assert samples.dtype == np.int64
    support = np.arange(-2000, 2001)
    pmf = noise.discrete_laplace_pmf(support, scale)
    assert chi_square_against_pmf(samples, pmf, support) > P_FLOOR
    b = float(Fraction(scale))
    q = math.exp(-1 / b)
    variance = 2 * q / (1 - q) ** 2
    assert abs(samples.mean()) <= SIGMAS * math.sqrt(variance / samples.size)


def test_discrete_laplace_scalar_path_matches_exact_pmf() -> None:
    source = noise.seeded_random_source(32)
    samples = np.array([noise.sample_discrete_laplace("3/2", source) for _ in range(20_000)])
    support = np.arange(-200, 201)
    pmf = noise.discrete_laplace_pmf(support, Fraction(3, 2))
    assert chi_square_against_pmf(samples, pmf, support) > P_FLOOR


def test_discrete_laplace_is_symmetric() -> None:
    source = noise.seeded_random_source(33)
    samples = noise.sample_discrete_laplace(Fraction(7, 3), source, size=200_000)
    positive, negative = int(np.sum(samples > 0)), int(np.sum(samples < 0))
    # Given the sign is nonzero, it is + or - with probability 1/2 each.
    assert_frequency(positive, positive + negative, 0.5)
    magnitudes = np.arange(1, 6)
    pos = np.array([np.sum(samples == m) for m in magnitudes])
    neg = np.array([np.sum(samples == -m) for m in magnitudes])
    # Chi-square test of "pos[m] and neg[m] are the two halves of the same count", all m at once.
    statistic = float(np.sum((pos - neg) ** 2 / (pos + neg)))
    assert stats.chi2.sf(statistic, df=magnitudes.size) > P_FLOOR


def test_discrete_laplace_scale_is_sensitivity_over_epsilon() -> None:
    assert noise.discrete_laplace_scale("0.3", sensitivity=2) == Fraction(20, 3)
    assert noise.discrete_laplace_scale(Fraction(1, 2)) == 2
    with pytest.raises(ValueError, match="epsilon"):
        noise.discrete_laplace_scale(0)


def test_invalid_parameters_are_refused() -> None:
    source = noise.seeded_random_source(0)
    for bad in (0, -1, float("inf"), float("nan"), "x"):
        with pytest.raises(ValueError, match="scale"):
            noise.sample_discrete_laplace(bad, source)
    with pytest.raises(ValueError, match="gamma"):
        noise.bernoulli_exp(-1, source)
    with pytest.raises(ValueError, match="probability"):
        noise.bernoulli(Fraction(3, 2), source)
    with pytest.raises(ValueError, match="n must"):
        noise.uniform_below(0, source)


def test_float_scales_are_converted_exactly() -> None:
    assert noise.as_fraction(0.1) == Fraction(3602879701896397, 36028797018963968)
    assert noise.as_fraction("20/3") == Fraction(20, 3)


def test_secure_permutation_is_a_permutation_and_uniform() -> None:
    source = noise.seeded_random_source(41)
    assert np.array_equal(np.sort(noise.secure_permutation(1000, source)), np.arange(1000))
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.zeros(24, dtype=np.int64)
    for _ in range(12_000):
        counts[index[tuple(noise.secure_permutation(4, source).tolist())]] += 1
    assert stats.chisquare(counts).pvalue > P_FLOOR


def test_secure_permutation_redraws_tied_keys() -> None:
    tied = (5).to_bytes(8, "little") * 2
    distinct = (9).to_bytes(8, "little") + (3).to_bytes(8, "little")
    source = ScriptedSource(tied + distinct)
    assert noise.secure_permutation(2, source).tolist() == [1, 0]
    assert source.consumed == 32


def test_secure_sample_without_replacement_includes_each_element_equally() -> None:
    source = noise.seeded_random_source(42)
    n, m, draws = 10, 3, 10_000
    counts = np.zeros(n, dtype=np.int64)
    for _ in range(draws):
        chosen = noise.secure_sample_without_replacement(n, m, source)
        assert chosen.size == m and np.unique(chosen).size == m
        counts[chosen] += 1
    assert stats.chisquare(counts).pvalue > P_FLOOR
    assert noise.secure_sample_without_replacement(5, 0, source).size == 0
    assert noise.secure_sample_without_replacement(5, 5, source).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="m must"):
        noise.secure_sample_without_replacement(5, 6, source)


def test_sources() -> None:
    assert len(noise.os_random_source().random_bytes(33)) == 33
    a, b = noise.seeded_random_source(5), noise.seeded_random_source(5)
    draws = [a.random_bytes(n) for n in (10, 100_000, 3)]
    assert draws == [b.random_bytes(n) for n in (10, 100_000, 3)]
    assert [len(d) for d in draws] == [10, 100_000, 3]
    assert draws[0] != noise.seeded_random_source(6).random_bytes(10)
    with pytest.raises(ValueError, match="seed"):
        noise.seeded_random_source(-1)

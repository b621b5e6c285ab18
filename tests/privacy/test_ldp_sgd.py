"""Tests of LDP-SGD's client randomizer and server step (esa-privacy-revisited, Section VI).

The exact-epsilon test computes, for a grid of directions (regenerated from seeds, as the server
does) and gradients, the probability of each reported sign from Algorithm 4's two coins, written
out here independently of the implementation; the seed itself is independent of the data, so
these sign probabilities are the whole likelihood ratio. Randomized tests use fixed seeds and
sit at 4.5 standard deviations (two-sided normal tail ~6.8e-6 per check); with at most ~20 checks
per test a correct implementation fails a test with probability below ~1.4e-4 for a fresh seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privacy.ldp_sgd import (
    SEED_BYTES,
    LdpSgdRandomizer,
    clip_gradients,
    directions_from_seeds,
    learning_rate,
    paper_scale,
    project_to_ball,
    server_step,
    sign_probability,
    unbiased_scale,
)
from privacy.rng import secure_generator, seeded_generator

Z = 4.5


def _seeds(rng: np.random.Generator, count: int) -> np.ndarray:
    return np.frombuffer(rng.bytes(SEED_BYTES * count), dtype=np.uint8).reshape(count, SEED_BYTES)


def _two_coin_probability(x: np.ndarray, v: np.ndarray, epsilon: float, clip: float) -> float:
    """P(sign = +1) from Algorithm 4 step by step: z = +-L x/|x| w.p. q, 1-q; keep sgn(<z,v>)
    w.p. p = e^eps/(1+e^eps)."""
    norm = float(np.linalg.norm(x))
    keep = math.exp(epsilon) / (1.0 + math.exp(epsilon))
    if norm == 0.0:
        return 0.5  # z = +-L u for any u, each with probability 1/2
    q = 0.5 + norm / (2.0 * clip)
    positive_if_plus_z = 1.0 if float(x @ v) > 0 else 0.0
    p_plus_given_z = positive_if_plus_z * keep + (1 - positive_if_plus_z) * (1 - keep)
    p_plus_given_minus_z = (1 - positive_if_plus_z) * keep + positive_if_plus_z * (1 - keep)
    return q * p_plus_given_z + (1 - q) * p_plus_given_minus_z


@pytest.mark.parametrize("epsilon", [0.3, 1.9, 6.0])
def test_seed_and_sign_report_epsilon_is_exact(epsilon):
    clip, d = 1.0, 6
    rng = seeded_generator(11)
    directions = directions_from_seeds(_seeds(rng, 40), d).astype(np.float64)
    raw = rng.normal(size=(30, d))
    raw /= np.linalg.norm(raw, axis=1, keepdims=True)
    norms = np.array([0.0, 0.25, 0.5, 1.0, 3.0])  # 3.0 is clipped to 1.0
    gradients = clip_gradients(
        np.concatenate([raw * n for n in norms] + [directions[:5], -directions[:5]]), clip
    )
    for v in directions:
        plus = np.array([_two_coin_probability(x, v, epsilon, clip) for x in gradients])
        np.testing.assert_allclose(
            sign_probability(gradients, np.tile(v, (len(gradients), 1)), epsilon, clip),
            plus,
            rtol=0,
            atol=1e-15,
        )
        # The output (seed, sign): P(seed) is the same for every input, so the ratio is the sign's.
        for outcome in (np.log(plus), np.log1p(-plus)):
            largest = float(outcome.max() - outcome.min())
            assert largest <= epsilon + 1e-9
            assert largest == pytest.approx(epsilon, abs=1e-9)  # attained: |x| = L, both sides


def test_randomize_draws_from_the_sign_probability():
    """Signs follow sign_probability given the directions regenerated from the sent seeds."""
    d, epsilon, n = 12, 1.5, 60_000
    randomizer = LdpSgdRandomizer(epsilon, 1.0, d)
    rng = seeded_generator(5)
    base = rng.normal(size=(6, d))
    gradients = np.repeat(base * np.array([0, 0.1, 0.3, 0.5, 1, 4])[:, None], n // 6, axis=0)
    reports = randomizer.randomize(gradients, rng)
    v = directions_from_seeds(reports.seeds, d)
    p = sign_probability(clip_gradients(gradients, 1.0), v, epsilon, 1.0)
    plus = reports.signs == 1
    assert set(np.unique(reports.signs)) <= {-1, 1}
    for group in np.split(np.arange(n), 6):  # one check per gradient norm
        excess = plus[group].sum() - p[group].sum()
        assert abs(excess) <= Z * math.sqrt(np.sum(p[group] * (1 - p[group])))


def test_directions_are_deterministic_unit_and_uniform():
    d, n = 10, 50_000
    rng = seeded_generator(7)
    seeds = _seeds(rng, n)
    v = directions_from_seeds(seeds, d)
    np.testing.assert_array_equal(v, directions_from_seeds(seeds.copy(), d))  # server == device
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    assert not np.array_equal(v[0], directions_from_seeds(seeds[:1], d + 1)[0, :d])
    # Uniform on S^{d-1}: E[v] = 0 and E[v v^T] = I/d. Var(v_j) = 1/d; Var(v_j^2) <= 3/d^2 - ...
    assert np.all(np.abs(v.mean(axis=0)) <= Z * math.sqrt(1.0 / d / n))
    second = (v.astype(np.float64) ** 2).mean(axis=0)
    variance = (3.0 / (d * (d + 2)) - 1.0 / d**2) / n  # Var(v_j^2) on the sphere
    assert np.all(np.abs(second - 1.0 / d) <= Z * math.sqrt(variance))


@pytest.mark.parametrize("norm", [0.4, 2.5])
def test_mean_of_randomized_gradients_is_unbiased_for_the_clipped_gradient(norm):
    """E[B sign v] = clip(x). Each coordinate of B sign v has variance <= B^2/d (E v_j^2 = 1/d);
    8 coordinate checks at 4.5 sd per case."""
    d, epsilon, clip, n = 8, 1.2, 1.0, 300_000
    randomizer = LdpSgdRandomizer(epsilon, clip, d)
    rng = seeded_generator(13)
    x = rng.normal(size=d)
    x *= norm / np.linalg.norm(x)
    reports = randomizer.randomize(np.tile(x, (n, 1)), rng)
    mean = randomizer.scale * randomizer.decode_sum(reports.seeds, reports.signs) / n
    target = clip_gradients(x, clip)[0]
    sd = randomizer.scale / math.sqrt(d * n)
    assert np.all(np.abs(mean - target) <= Z * sd), (mean, target, sd)


def test_scale_constants():
    """d = 2: E|v_1| = 2/pi; d = 3: E|v_1| = 1/2 (Archimedes). Algorithm 5's printed constant is
    1/d of the unbiased one."""
    eps, clip = 1.9, 0.7
    coth = 1.0 / math.tanh(eps / 2.0)
    assert unbiased_scale(eps, clip, 2) == pytest.approx(clip * math.pi / 2.0 * coth, rel=1e-12)
    assert unbiased_scale(eps, clip, 3) == pytest.approx(2.0 * clip * coth, rel=1e-12)
    for d in (5, 650, 7850):
        printed = (
            clip
            * math.sqrt(math.pi)
            / 2.0
            * math.exp(math.lgamma((d - 1) / 2 + 1) - math.lgamma(d / 2 + 1))
            * (math.exp(eps) + 1)
            / (math.exp(eps) - 1)
        )
        assert paper_scale(eps, clip, d) == pytest.approx(printed, rel=1e-12)
        assert unbiased_scale(eps, clip, d) == pytest.approx(d * printed, rel=1e-12)


def test_server_step_learning_rate_and_projection():
    randomizer = LdpSgdRandomizer(2.0, 1.0, 4)
    theta = np.array([0.5, 0.0, 0.0, 0.0])
    total = np.array([40.0, -20.0, 0.0, 8.0])
    radius = 0.5
    eta = learning_rate(3, 2 * radius, 100, 2.0, 1.0, 4)
    assert eta == pytest.approx(2 * radius / (randomizer.scale / 10.0) / math.sqrt(3))
    step, got_eta, norm = server_step(theta, total, 100, 3, randomizer, radius=radius)
    expected = theta - eta * randomizer.scale * total / 100
    assert got_eta == eta
    assert norm == pytest.approx(np.linalg.norm(randomizer.scale * total / 100))
    assert np.linalg.norm(expected) > radius
    np.testing.assert_allclose(step, radius * expected / np.linalg.norm(expected))  # Pi_C
    np.testing.assert_array_equal(project_to_ball(theta, 1.0), theta)
    with pytest.raises(ValueError, match="step"):
        learning_rate(0, 2.0, 100, 2.0, 1.0, 4)


def test_clip_and_validation():
    clipped = clip_gradients(np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]]), 1.0)
    np.testing.assert_allclose(clipped, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])
    with pytest.raises(ValueError, match="epsilon"):
        LdpSgdRandomizer(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="columns"):
        LdpSgdRandomizer(1.0, 1.0, 3).randomize(np.zeros((2, 4)), seeded_generator(1))
    with pytest.raises(ValueError, match="seeds"):
        directions_from_seeds(np.zeros((2, 8), dtype=np.uint8), 3)


def test_system_random_source_drives_the_randomizer():
    source = secure_generator()
    uniforms = source.random(1000)
    assert uniforms.min() >= 0.0 and uniforms.max() < 1.0
    reports = LdpSgdRandomizer(1.0, 1.0, 5).randomize(np.ones((50, 5)), source)
    assert reports.seeds.shape == (50, SEED_BYTES) and len(np.unique(reports.seeds, axis=0)) == 50

"""Tests of the tight shuffle accountant (variation-ratio reduction) against computations that
share no code with it: exact enumeration of shuffled outputs for small crowds, mpmath sums for the
binomial tails, the FMT numerical bound, monotonicity, and the reference values of the issue."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from privacy import accounting as acc
from privacy.accounting.variation_ratio import hockey_stick_shifted_binomial


def divergence(first: np.ndarray, second: np.ndarray, epsilon: float) -> float:
    """max of both hockey-stick divergences of two distributions on the same outcomes."""
    factor = math.exp(epsilon)
    return float(
        max(
            np.maximum(first - factor * second, 0).sum(),
            np.maximum(second - factor * first, 0).sum(),
        )
    )


def shuffled_binary_rr(respondents: int, ones: int, epsilon_local: float) -> tuple:
    """Exact law of the count of ones of shuffled binary RR: the victim holds 1 or 0, ``ones`` of
    the other respondents hold 1 and the rest 0 (sums of binomials, by convolution)."""
    q = 1.0 / (1.0 + math.exp(epsilon_local))
    others = np.convolve(
        stats.binom.pmf(np.arange(respondents - ones), respondents - 1 - ones, q),
        stats.binom.pmf(np.arange(ones + 1), ones, 1 - q),
    )
    victim_one, victim_zero = np.zeros(respondents + 1), np.zeros(respondents + 1)
    victim_one[1:] += (1 - q) * others
    victim_one[:-1] += q * others
    victim_zero[1:] += q * others
    victim_zero[:-1] += (1 - q) * others
    return victim_one, victim_zero


def worst_binary_rr_delta(respondents: int, epsilon_local: float, epsilon: float) -> float:
    """The true delta(eps) of shuffled binary RR: every dataset pair (the others' values matter
    only through how many hold 1), enumerated."""
    return max(
        divergence(*shuffled_binary_rr(respondents, ones, epsilon_local), epsilon)
        for ones in range(respondents)
    )


def reduced_pair_by_enumeration(parameters: acc.VariationRatio, n: int) -> tuple:
    """The reduction's pair of count laws on (a, b), enumerated over the 2-D grid (multinomial
    of the other n-1 respondents convolved with the victim's three-point law)."""
    a0, a1, w = parameters.victim_masses()
    r0, r1 = parameters.clone_rates()
    grid = np.zeros((n, n))
    for a in range(n):  # multinomial(n-1; r0, r1, rest) at (a, b)
        b = np.arange(n - a)
        log = (
            math.lgamma(n)
            - math.lgamma(a + 1)
            - np.array([math.lgamma(x + 1) for x in b])
            - np.array([math.lgamma(n - a - x) for x in b])
            + a * math.log(r0)
            + b * math.log(r1)
            + (n - 1 - a - b) * math.log1p(-r0 - r1)
        )
        grid[a, : n - a] = np.exp(log)
    first, second = np.zeros((n + 1, n + 1)), np.zeros((n + 1, n + 1))
    for out, (zero, one) in ((first, (a0, a1)), (second, (a1, a0))):
        out[1:, :n] += zero * grid
        out[:n, 1:] += one * grid
        out[:n, :n] += w * grid
    return first, second


def epsilon_of(delta_of, delta: float, high: float) -> float:
    """Smallest eps with delta_of(eps) <= delta, by bisection (to 1e-9)."""
    low = 0.0
    if delta_of(0.0) <= delta:
        return 0.0
    while high - low > 1e-9:
        middle = (low + high) / 2
        low, high = (low, middle) if delta_of(middle) <= delta else (middle, high)
    return high


@pytest.mark.parametrize(("respondents", "epsilon_local"), [(40, 1.0), (120, 3.0), (300, 4.0)])
@pytest.mark.parametrize("delta", [1e-3, 1e-6])
def test_binary_rr_lower_exact_upper_by_enumeration(respondents, epsilon_local, delta):
    bound = acc.tight_bound("binary_rr", epsilon_local, respondents, delta)
    exact = epsilon_of(
        lambda eps: worst_binary_rr_delta(respondents, epsilon_local, eps), delta, epsilon_local
    )
    assert bound.lower <= exact + 1e-8
    assert exact <= bound.upper + 1e-8  # the upper bound holds for every dataset pair
    assert bound.reduction_lower <= bound.upper


@pytest.mark.parametrize(
    "parameters",
    [
        acc.variation_ratio_parameters("generic", 1.5),
        acc.variation_ratio_parameters("k_rr", 2.0, categories=5),
        acc.variation_ratio_parameters("cheu", 1.0, flip=0.2),
        acc.variation_ratio_parameters("balls_into_bins", 1.0, bins=8, special_bins=2),
        acc.VariationRatio(math.exp(2.0), 0.5, math.exp(2.0), 3.0, "asymmetric"),
    ],
    ids=["generic", "k_rr", "cheu", "balls_into_bins", "asymmetric"],
)
@pytest.mark.parametrize("epsilon", [0.05, 0.3, 0.8])
def test_reduction_bracket_holds_the_enumerated_divergence(parameters, epsilon):
    n = 60
    first, second = reduced_pair_by_enumeration(parameters, n)
    exact = divergence(first.ravel(), second.ravel(), epsilon)
    lower, upper = acc.variation_ratio_delta(parameters, n, epsilon)
    assert lower <= exact * (1 + 1e-9) + 1e-15
    assert exact <= upper
    assert upper <= exact * (1 + 1e-8) + 1e-11  # window mass 1e-16 plus rounding allowance


def test_k_rr_with_others_on_a_third_value_is_exactly_the_reduction():
    # Shuffled 3-RR, victim x0 vs x1, the others hold z: the histogram (n_x0, n_x1, n_z).
    n, eps0, epsilon = 50, 1.0, 0.4
    e = math.exp(eps0)
    high, low = e / (e + 2), 1 / (e + 2)
    others = np.zeros((n, n))  # others' counts of x0 and x1 (n_z is what is left)
    for a in range(n):
        for b in range(n - a):
            others[a, b] = math.exp(
                math.lgamma(n) - math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(n - a - b)
                + (a + b) * math.log(low) + (n - 1 - a - b) * math.log(high)
            )  # fmt: skip
    first, second = np.zeros((n + 1, n + 1)), np.zeros((n + 1, n + 1))
    for out, (zero, one) in ((first, (high, low)), (second, (low, high))):
        out[1:, :n] += zero * others
        out[:n, 1:] += one * others
        out[:n, :n] += low * others  # the victim reports z
    exact = divergence(first.ravel(), second.ravel(), epsilon)
    lower, upper = acc.variation_ratio_delta(
        acc.variation_ratio_parameters("k_rr", eps0, categories=3), n, epsilon
    )
    assert lower <= exact * (1 + 1e-9) and exact <= upper <= exact * (1 + 1e-8) + 1e-11


@pytest.mark.parametrize(
    ("clones", "rho", "high", "low", "epsilon"),
    [(2000, 0.5, 0.9, 0.1, 0.05), (500, 0.3, 0.7, 0.2, 0.2), (3000, 0.5, 0.98, 0.02, 0.02)],
)
def test_conditional_divergence_matches_mpmath(clones, rho, high, low, epsilon):
    mpmath.mp.dps = 40
    factor = mpmath.e ** mpmath.mpf(epsilon)
    rho_m = mpmath.mpf(rho)

    def mass(x: int) -> mpmath.mpf:
        if x < 0 or x > clones:
            return mpmath.mpf(0)
        return mpmath.binomial(clones, x) * rho_m**x * (1 - rho_m) ** (clones - x)

    total = mpmath.mpf(0)
    for x in range(clones + 2):
        p = high * mass(x - 1) + (1 - high) * mass(x)
        q = low * mass(x - 1) + (1 - low) * mass(x)
        total += max(p - factor * q, 0)
    value, _ = hockey_stick_shifted_binomial(
        np.array([float(clones)]), rho, np.array([high]), np.array([low]), epsilon
    )
    assert value[0] == pytest.approx(float(total), rel=1e-9)


def test_divergences_side_by_side_are_each_the_divergence_alone():
    """hockey_stick_shifted_binomial is elementwise: several pairs in one call give bit for bit
    what a call per pair gives (binary_rr_pair_delta asks both directions at once)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        clones = np.floor(10 ** rng.uniform(0, 6, size=3))
        rho, high = rng.uniform(0.01, 0.99, size=3), rng.uniform(0.5, 0.99, size=3)
        low, epsilon = high * rng.uniform(0.0, 1.0, size=3), float(rng.uniform(0, 5))
        together = hockey_stick_shifted_binomial(clones, rho, high, low, epsilon)
        for index in range(3):
            alone = hockey_stick_shifted_binomial(
                clones[index : index + 1], rho[index], high[index : index + 1],
                low[index : index + 1], epsilon,
            )  # fmt: skip
            assert together[0][index] == alone[0][0] and together[1][index] == alone[1][0]


def test_reference_values():
    assert acc.tight_bound("binary_rr", 4.0, 100_000, 1e-8).upper == pytest.approx(0.151, abs=5e-4)
    assert acc.tight_bound("binary_rr", 4.45, 120_000, 5e-8).upper == pytest.approx(0.163, abs=5e-4)
    horse = acc.solve_epsilon_local(
        1.0, 1_914_589, 5e-8, acc.ONE_HOT_RAPPOR, bound=acc.VARIATION_RATIO
    )
    assert 10.4 < horse.epsilon_local < 10.5  # 9.76 with the FMT numerical bound
    # amplify rounds its eps up by at most its relative tolerance (1e-7)
    assert acc.amplify(horse.epsilon_local, 1_914_589, 5e-8, acc.ONE_HOT_RAPPOR).epsilon <= 1 + 1e-6


@pytest.mark.parametrize("epsilon_local", [0.5, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("respondents", [10**3, 10**5, 10**7])
@pytest.mark.parametrize("delta", [1e-6, 1e-10])
def test_never_looser_than_fmt_numerical_and_brackets_are_tight(epsilon_local, respondents, delta):
    bound = acc.tight_bound("generic", epsilon_local, respondents, delta)
    assert bound.upper <= acc.fmt_numerical_epsilon(epsilon_local, respondents, delta)
    assert bound.lower <= bound.upper and bound.reduction_lower <= bound.upper
    assert bound.upper <= bound.reduction_lower * 1.005 + 1e-9  # within 0.5 % of the reduction


def test_monotone_in_respondents_epsilon_local_and_delta():
    by_n = [acc.tight_bound("binary_rr", 3.0, n, 1e-8).upper for n in (10**3, 10**4, 10**6, 10**8)]
    assert by_n == sorted(by_n, reverse=True)
    by_eps0 = [acc.tight_bound("binary_rr", e, 10**5, 1e-8).upper for e in (0.5, 1, 2, 4, 8)]
    assert by_eps0 == sorted(by_eps0)
    by_delta = [acc.tight_bound("binary_rr", 3.0, 10**5, d).upper for d in (1e-4, 1e-8, 1e-12)]
    assert by_delta == sorted(by_delta)
    lowers = [acc.binary_rr_pair_epsilon(3.0, n, 1e-8) for n in (10**3, 10**4, 10**6)]
    assert lowers == sorted(lowers, reverse=True)


def test_an_upper_bound_below_the_lower_bound_is_refused(monkeypatch):
    import privacy.accounting.tight as tight

    monkeypatch.setattr(tight, "binary_rr_pair_epsilon", lambda *args, **kwargs: 1.0)
    with pytest.raises(acc.BoundOutOfRange, match="below the lower bound"):
        tight.tight_bound("binary_rr", 4.0, 10**5, 1e-8)


def test_absurd_crowds_are_refused_before_any_work():
    with pytest.raises(ValueError, match="respondents"):
        acc.amplify(1.0, 2**63, 1e-8, acc.GENERIC)
    with pytest.raises(ValueError, match="respondents"):
        acc.solve_epsilon_local(1.0, 10**11, 1e-8, acc.GENERIC, bound=acc.VARIATION_RATIO)


def test_privacy_report_names_the_tight_bound():
    report = acc.privacy_report(8.0, 1_914_589, 5e-8)
    assert report.central.bound == acc.VARIATION_RATIO
    assert report.central.details["tight"]["lower"] <= report.central.epsilon


def test_composition_uses_privacy_loss_distributions_where_they_win():
    curve = acc.tight_curve("binary_rr", 4.0, 100_000, 1e-12)
    one = acc.compose([curve], 1e-8)
    assert one.epsilon == pytest.approx(0.1507, abs=5e-4)
    many = acc.compose([curve] * 16, 1e-8)
    assert many.method == acc.PLD_COMPOSITION
    assert many.epsilon < 0.5 * many.details["candidates"][acc.BASIC_COMPOSITION]
    plain = [acc.PrivacyLoss(0.1, 1e-9, "x")] * 50
    composed = acc.compose(plain, 1e-6)
    assert composed.method == acc.PLD_COMPOSITION
    assert composed.epsilon < composed.details["candidates"][acc.ADVANCED_COMPOSITION] < 5.0
    # PLD composition of k copies of (eps, 0) cannot beat the optimal composition theorem's
    # value at k = 2: (2 eps, 0) with delta 0 is exact for two RR steps, so eps <= 2 * 0.1.
    assert acc.compose([acc.PrivacyLoss(0.1, 0.0, "x")] * 2, 1e-9).epsilon <= 0.2 + 1e-3


def test_generic_lower_bound_from_three_value_rr_nearly_matches():
    bound = acc.tight_bound("generic", 4.0, 100_000, 1e-8)
    assert "3-RR" in bound.lower_pair
    assert bound.upper * 0.99 < bound.lower <= bound.upper  # 0.1493 against 0.1507
    binary = acc.tight_bound("binary_rr", 4.0, 100_000, 1e-8)
    assert binary.lower == pytest.approx(0.1097, abs=5e-4) and binary.upper == bound.upper


@pytest.mark.parametrize(
    "parameters",
    [
        acc.variation_ratio_parameters("binary_rr", 3.0),
        acc.variation_ratio_parameters("k_rr", 1.0, categories=6),
        acc.VariationRatio(math.exp(1.0), 0.3, math.exp(1.0), 2.0, "asymmetric"),
    ],
    ids=["binary_rr", "k_rr", "asymmetric"],
)
def test_blocks_bracket_the_every_clone_count_sum(parameters):
    # Blocks rest on two monotonicity claims (fewer clones and a larger chance that the victim
    # is informative never lower the conditional divergence); every t evaluated is the check.
    n, tail = 300_000, 1e-14
    blocks = acc.ReducedPair(parameters, n, tail, resolution=64)
    every = acc.ReducedPair(parameters, n, tail, resolution=10**6)
    assert every.exact and not blocks.exact
    for epsilon in (0.002, 0.01, 0.03):
        exact_low, exact_up = every.delta(epsilon)
        low, up = blocks.delta(epsilon)
        assert low <= exact_low * (1 + 1e-9) and exact_up <= up * (1 + 1e-9)
        assert up - low <= 0.05 * up + 2 * tail  # the dropped mass is charged in full


def test_searches_end_on_functions_rounding_fools():
    from privacy.accounting.core import first_nonpositive, last_positive

    calls = []

    def stubborn(x: float) -> float:  # negative only at the very end: Brent's answer fails
        calls.append(x)
        return -1.0 if x >= 1.0 else 1e-300

    assert first_nonpositive(stubborn, 0.0, 1.0, 1e-9) == 1.0
    assert len(calls) < 300
    assert last_positive(lambda x: 1.0 if x <= 0.0 else -1.0, 0.0, 1.0, 1e-9) < 1e-6


@pytest.mark.parametrize(
    "call",
    [
        lambda: acc.deletion_bounds(1e-300, 1e-300, 1),
        lambda: acc.variation_ratio_parameters("cheu", 1.0, flip=1e-300),
        lambda: acc.tight_bound("generic", 1.0, 10**11, 1e-8),
    ],
)
def test_unrepresentable_parameters_are_refused(call):
    with pytest.raises(ValueError):
        call()


def test_extreme_but_valid_parameters_give_numbers():
    assert acc.amplify(1e-300, 10**10, 1e-8, acc.GENERIC).epsilon <= 1e-300
    assert acc.amplify(1e300, 100, 1e-8, acc.GENERIC).epsilon == 1e300  # nothing amplifies
    solved = acc.solve_epsilon_local(1e6, 5, 0.9, acc.ONE_HOT_RAPPOR, bound=acc.VARIATION_RATIO)
    assert solved.details["limited_by_validity_range"]


def test_composed_curve_is_never_below_the_exact_composition():
    # Two releases of the reduced pair (generic eps_0 = 1, n = 30), enumerated outright: the
    # PLD of the connect-the-dots curve must give at least the exact delta of the product pair.
    n, eps0 = 30, 1.0
    parameters = acc.variation_ratio_parameters("generic", eps0)
    first, second = (x.ravel() for x in reduced_pair_by_enumeration(parameters, n))
    keep = (first > 0) | (second > 0)
    first, second = first[keep], second[keep]
    both_first, both_second = np.outer(first, first).ravel(), np.outer(second, second).ravel()
    curve = acc.tight_curve("generic", eps0, n, 1e-12)
    for delta in (1e-2, 1e-4):
        composed = acc.compose([curve, curve], delta)
        assert divergence(both_first, both_second, composed.epsilon) <= delta * (1 + 1e-9)
        assert composed.epsilon <= 2 * curve.epsilon_for(delta / 2) + 1e-9  # never worse

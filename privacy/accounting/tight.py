"""The tight amplification bound: an upper bound from the variation-ratio reduction (Wang et al.,
VLDB 2024) and a lower bound from an explicit pair of neighbouring datasets.

* Upper bound: :class:`~privacy.accounting.variation_ratio.ReducedPair`, the smallest eps whose
  certified delta (window, blocks, dropped mass and rounding allowance included) is <= delta.
* Lower bound (``lower``): the exact hockey-stick divergence of the shuffled outputs of two
  neighbouring datasets, so the true central eps of the randomizer is at least this:

  - binary randomized response (and the generic and LDP-SGD randomizers, whose worst case is at
    least that of binary RR, which is eps_0-LDP and is Duchi et al.'s randomizer for d = 1): the
    victim holds 0 or 1 and every other respondent holds 0; the shuffled output is the count of
    ones, Bin(n-1, 1/(1+e^eps_0)) plus the victim's bit. For the generic randomizer also 3-RR's
    pair below (3-RR is eps_0-LDP), whichever is larger: within 1 % of the upper bound at
    eps_0 >= 4 (0.1493 against 0.1507 at eps_0 = 4, n = 1e5, delta = 1e-8).
  - k-RR with k >= 3: the victim holds x0 or x1 and every other respondent a third value. The
    shuffled histogram is then exactly the reduction's pair (the likelihood ratio depends only on
    the counts of x0 and x1, distributed as the reduction's counts), so the lower end of the
    reduction's numerical bracket is a lower bound on the true eps.

  For binary RR the two ends are far apart (e.g. 0.151 against 0.110 at eps_0 = 4, n = 1e5,
  delta = 1e-8): the reduction lets the adversary see the clones' total, which the count of ones
  hides. ``reduction_lower`` is the lower end of the numerical bracket of the reduction itself
  (how precisely the upper bound is computed; the published code's "lower bound").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from privacy.accounting.core import (
    BoundOutOfRange,
    check_count,
    check_delta,
    check_epsilon,
    first_nonpositive,
    last_positive,
)
from privacy.accounting.variation_ratio import (
    LARGEST_EPSILON,
    ReducedPair,
    ShiftedBinomialPair,
    VariationRatio,
    variation_ratio_parameters,
)

__all__ = [
    "TightBound",
    "RANDOMIZERS",
    "tight_bound",
    "variation_ratio_epsilon",
    "variation_ratio_delta",
    "binary_rr_pair_delta",
    "binary_rr_pair_epsilon",
]

RANDOMIZERS = ("generic", "binary_rr", "k_rr", "ldp_sgd", "cheu", "balls_into_bins")

# Share of delta given to the binomial mass left outside the evaluated window.
WINDOW_SHARE = 1e-4
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class TightBound:
    """Central eps of n shuffled reports: ``upper`` holds, the true value is >= ``lower``."""

    upper: float
    lower: float | None
    reduction_lower: float
    delta: float
    respondents: int
    parameters: VariationRatio
    lower_pair: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "upper": self.upper,
            "lower": self.lower,
            "reduction_lower": self.reduction_lower,
            "lower_pair": self.lower_pair,
            "delta": self.delta,
            "respondents": self.respondents,
            "parameters": {
                "randomizer": self.parameters.name,
                "p": self.parameters.p,
                "beta": self.parameters.beta,
                "q0": self.parameters.q0,
                "q1": self.parameters.q1,
            },
        }


def _pair(parameters: VariationRatio, n: int, d: float) -> ReducedPair:
    return ReducedPair(parameters, n, WINDOW_SHARE * d)


def variation_ratio_delta(
    parameters: VariationRatio, respondents: int, epsilon: float, delta_scale: float = 1e-12
) -> tuple[float, float]:
    """(lower, upper) bracket on the reduction's delta(eps); the window drops mass
    ``WINDOW_SHARE * delta_scale`` (added to ``upper``)."""
    eps = check_epsilon(epsilon, "epsilon", allow_zero=True)
    return ReducedPair(parameters, respondents, WINDOW_SHARE * delta_scale).delta(eps)


def _largest_epsilon(parameters: VariationRatio) -> float:
    return min(math.log(parameters.p), LARGEST_EPSILON)


def variation_ratio_epsilon(
    parameters: VariationRatio, respondents: int, delta: float, tolerance: float = _TOLERANCE
) -> tuple[float, float]:
    """(reduction_lower, upper): ``upper`` is the smallest eps (to relative ``tolerance``,
    rounded up) whose certified delta is <= delta; the reduction's own eps is >= the lower end."""
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    pair = _pair(parameters, n, d)
    cache: dict[float, tuple[float, float]] = {}

    def bracket(eps: float) -> tuple[float, float]:
        if eps not in cache:
            cache[eps] = pair.delta(eps)
        return cache[eps]

    def upper_excess(eps: float) -> float:
        return math.log(max(bracket(eps)[1], 1e-300)) - math.log(d)

    high = _largest_epsilon(parameters)
    if math.isinf(parameters.p):
        high = 1.0
        while upper_excess(high) > 0.0 and high < LARGEST_EPSILON:
            high = min(2.0 * high, LARGEST_EPSILON)
    if upper_excess(high) > 0.0:
        return high, high  # delta below the rounding allowance: no amplification certified
    upper = first_nonpositive(upper_excess, 0.0, high, tolerance)

    return _reduction_lower(bracket, d, upper, tolerance), upper


def _reduction_lower(bracket, d: float, upper: float, tolerance: float) -> float:
    """Largest eps (rounded down) whose certain delta, bracket(eps)[0], exceeds d, searched below
    ``upper`` (where it does not); 0 if none."""

    def lower_excess(eps: float) -> float:  # > 0 where the reduction is certainly not (eps, d)
        return math.log(max(bracket(eps)[0], 1e-300)) - math.log(d)

    if upper == 0.0 or lower_excess(upper) > 0.0:
        return 0.0 if upper == 0.0 else upper
    for shrink in (1e-4, 1e-3, 1e-2, 0.1, 1.0):
        start = upper * (1.0 - shrink)
        if lower_excess(start) > 0.0:
            return last_positive(lower_excess, start, upper, tolerance)
    return 0.0


def binary_rr_pair_delta(epsilon_local: float, respondents: int, epsilon: float) -> float:
    """Exact delta(eps) of two neighbouring datasets under shuffled binary randomized response:
    the victim holds 0 or 1, the other n-1 respondents hold 0 (the larger of both directions)."""
    eps0 = check_epsilon(epsilon_local, "epsilon_local")
    n = check_count(respondents, "respondents")
    eps = check_epsilon(epsilon, "epsilon", allow_zero=True)
    return _larger_direction(_binary_rr_pair(eps0, n), eps)


def _binary_rr_pair(eps0: float, n: int) -> ShiftedBinomialPair:
    """Both directions of :func:`binary_rr_pair_delta`'s pair, as one pair of two elements."""
    import numpy as np

    flip = 1.0 / (1.0 + math.exp(eps0))
    keep = 1.0 - flip
    # Count of ones K = Bin(n-1, flip) + victim bit (Bern(keep) for 1, Bern(flip) for 0). D(1||0)
    # directly; D(0||1) by x -> n - x, which maps K to Bin(n-1, keep) + the complement bit. Both
    # in one call (elementwise, so each is what a call of its own gives; half the time).
    return ShiftedBinomialPair(
        np.full(2, float(n - 1)), np.array([flip, keep]), np.full(2, keep), np.full(2, flip)
    )


def _larger_direction(pair: ShiftedBinomialPair, eps: float) -> float:
    one_zero, _ = pair.divergence(eps)
    return float(max(one_zero[0], one_zero[1]))


def binary_rr_pair_epsilon(
    epsilon_local: float, respondents: int, delta: float, tolerance: float = _TOLERANCE
) -> float:
    """Largest eps (rounded down) at which the binary-RR pair of :func:`binary_rr_pair_delta`
    still has delta(eps) > delta: the true central eps is at least this (0 if none)."""
    eps0 = check_epsilon(epsilon_local, "epsilon_local")
    d = check_delta(delta)
    pair = _binary_rr_pair(eps0, check_count(respondents, "respondents"))  # made once

    def excess(eps: float) -> float:
        # 1e-9 relative headroom covers the rounding of scipy's binomial functions.
        eps = check_epsilon(eps, "epsilon", allow_zero=True)
        value = _larger_direction(pair, eps) * (1.0 - 1e-9)
        return math.log(max(value, 1e-300)) - math.log(d)

    if excess(0.0) <= 0.0:
        return 0.0
    top = min(eps0, LARGEST_EPSILON)
    if excess(top) > 0.0:
        return top
    return last_positive(excess, 0.0, top, tolerance)


def tight_bound(
    randomizer: str,
    epsilon_local: float,
    respondents: int,
    delta: float,
    *,
    categories: int = 2,
    flip: float | None = None,
    bins: int | None = None,
    special_bins: int = 1,
    with_lower: bool = True,
) -> TightBound:
    """Upper and lower bounds on the central eps of n shuffled reports of ``randomizer`` (one of
    ``RANDOMIZERS``; see :func:`variation_ratio_parameters` for its parameters)."""
    if randomizer not in RANDOMIZERS:
        raise ValueError(f"randomizer must be one of {', '.join(RANDOMIZERS)}; got {randomizer!r}")
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    parameters = variation_ratio_parameters(
        randomizer,
        epsilon_local if randomizer not in ("cheu", "balls_into_bins") else 1.0,
        categories=categories,
        flip=flip,
        bins=bins,
        special_bins=special_bins,
    )
    reduction_lower, upper = variation_ratio_epsilon(parameters, n, d)
    lower: float | None = None
    pair = "no explicit pair for this randomizer"
    binary = randomizer in ("generic", "binary_rr", "ldp_sgd") or (
        randomizer == "k_rr" and categories == 2
    )
    if with_lower and binary:
        lower = binary_rr_pair_epsilon(epsilon_local, n, d)
        pair = "binary RR: victim 0 vs 1, every other respondent 0"
        if randomizer == "generic":  # 3-RR is eps_0-LDP too, and its pair is the reduction's
            three = _pair(variation_ratio_parameters("k_rr", epsilon_local, categories=3), n, d)
            # 3-RR's reduction is dominated by the generic one: its eps is at most ``upper``.
            three_lower = _reduction_lower(three.delta, d, upper, _TOLERANCE)
            if three_lower > lower:
                lower = three_lower
                pair = "3-RR: victim x0 vs x1, every other respondent a third value"
    elif with_lower and randomizer == "k_rr" and categories >= 3:
        lower = reduction_lower
        pair = "k-RR: victim x0 vs x1, every other respondent a third value (reduction exact)"
    if lower is not None and lower > upper:
        raise BoundOutOfRange(  # a bug, never a result: the upper bound must hold
            f"variation-ratio upper bound {upper:.9g} is below the lower bound {lower:.9g}"
        )
    return TightBound(
        upper=upper,
        lower=lower,
        reduction_lower=reduction_lower,
        delta=d,
        respondents=n,
        parameters=parameters,
        lower_pair=pair,
    )

"""Amplification by shuffling: central epsilon of n shuffled epsilon_l-DP reports.

* Lemma II.6 (esa-privacy-revisited): shuffled binary randomized response.
* Theorem III.1 (esa-privacy-revisited): attribute-fragmented k-RAPPOR, in its exact form (Lemma
  II.6 per attribute with lambda = 2n/(1+e^eps_l)) and its simplified form.
* Feldman, McMillan and Talwar, "Hiding among the clones" (FMT): the closed form as stated in
  samplable-anonymous-aggregation Theorem 3.1 (the Lemma II.5 slot of esa-privacy-revisited) and
  the numerical bound, which is tighter.

Every function raises :class:`BoundOutOfRange` outside its bound's conditions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privacy.accounting import binomial
from privacy.accounting.core import (
    BoundOutOfRange,
    brent_root,
    check_count,
    check_delta,
    check_epsilon,
)
from privacy.accounting.special_functions import ufuncs

__all__ = [
    "DeltaBracket",
    "binary_rr_lambda",
    "lemma_ii6_epsilon",
    "theorem_iii1_epsilon",
    "theorem_iii1_range",
    "fmt_closed_form_epsilon",
    "fmt_closed_form_max_epsilon_local",
    "fmt_numerical_delta",
    "fmt_numerical_epsilon",
]

EXACT = "exact"
SIMPLIFIED = "simplified"


def binary_rr_lambda(epsilon_local: float, respondents: int) -> float:
    """Lemma II.6's lambda for eps_l binary randomized response: flip probability
    lambda/(2n) = 1/(1+e^eps_l), so lambda = 2n/(1+e^eps_l) (proof of Theorem III.1)."""
    special = ufuncs()

    eps = check_epsilon(epsilon_local, "epsilon_local", allow_zero=True)
    n = check_count(respondents, "respondents")
    return 2.0 * n * float(special.expit(-eps))


def lemma_ii6_epsilon(lam: float, respondents: int, delta: float) -> float:
    """Lemma II.6 (esa-privacy-revisited): central epsilon of the shuffled sum of n bits, each
    flipped with probability lambda/(2n), for lambda in [14 log(4/delta), n]::

        eps = sqrt(32 log(4/delta) / (lambda - sqrt(2 lambda log(2/delta))))
              * (1 - (lambda - sqrt(2 lambda log(2/delta))) / n)
    """
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    lam = check_epsilon(lam, "lambda")
    lowest = 14.0 * math.log(4.0 / d)
    if lam < lowest:
        raise BoundOutOfRange(
            f"Lemma II.6 needs lambda >= 14 log(4/delta) = {lowest:.6g}; got lambda = {lam:.6g}"
        )
    if lam > n:
        raise BoundOutOfRange(f"Lemma II.6 needs lambda <= n = {n}; got lambda = {lam:.6g}")
    shrunk = lam - math.sqrt(2.0 * lam * math.log(2.0 / d))
    return math.sqrt(32.0 * math.log(4.0 / d) / shrunk) * (1.0 - shrunk / n)


def theorem_iii1_range(respondents: int, delta: float, form: str = EXACT) -> tuple[float, float]:
    """The eps_l interval on which Theorem III.1 (esa-privacy-revisited) holds.

    ``simplified``: the theorem's own conditions, eps_l in [1, log n - log(14 log(4/delta))] and
    delta >= n^(-log n). ``exact``: the conditions of Lemma II.6 with lambda = 2n/(1+e^eps_l),
    i.e. eps_l in [0, log(2n / (14 log(4/delta)) - 1)] (the proof needs nothing else).
    Raises BoundOutOfRange when the interval is empty.
    """
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    floor_lambda = 14.0 * math.log(4.0 / d)
    if form == SIMPLIFIED:
        log_n = math.log(n)
        if math.log(d) < -log_n * log_n:
            raise BoundOutOfRange(
                f"Theorem III.1 needs delta >= n^(-log n) = exp({-log_n * log_n:.6g}); "
                f"got delta = {d:.6g}"
            )
        low, high = 1.0, log_n - math.log(floor_lambda)
        if high < low:
            raise BoundOutOfRange(
                f"Theorem III.1 needs log n - log(14 log(4/delta)) >= 1 (n >= "
                f"{math.ceil(math.e * floor_lambda)} for delta = {d:.6g}); got n = {n}"
            )
        return low, high
    if form != EXACT:
        raise ValueError(f"form must be {EXACT!r} or {SIMPLIFIED!r}, got {form!r}")
    ratio = 2.0 * n / floor_lambda
    if ratio < 2.0:
        raise BoundOutOfRange(
            f"Theorem III.1 (exact, via Lemma II.6) needs n >= 14 log(4/delta) = "
            f"{floor_lambda:.6g}; got n = {n}"
        )
    return 0.0, math.log(ratio - 1.0)


def theorem_iii1_epsilon(
    epsilon_local: float, respondents: int, delta: float, form: str = EXACT
) -> float:
    """Theorem III.1 (esa-privacy-revisited): removal central epsilon of attribute-fragmented
    k-RAPPOR (per-bit randomized response with eps_l, one shuffler per attribute).

    ``exact``: Lemma II.6 with lambda = 2n/(1+e^eps_l), the expression the proof starts from (this
    is what reproduces the paper's tables). ``simplified``: sqrt(64 e^eps_l log(4/delta) / n),
    the theorem's statement, an upper bound on the exact form. Each form is checked against its
    validity range (see :func:`theorem_iii1_range`).
    """
    eps = check_epsilon(epsilon_local, "epsilon_local", allow_zero=form == EXACT)
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    low, high = theorem_iii1_range(n, d, form)
    if not low <= eps <= high:
        which = "simplified" if form == SIMPLIFIED else "exact, lambda >= 14 log(4/delta)"
        raise BoundOutOfRange(
            f"Theorem III.1 ({which}) needs epsilon_local in [{low:.6g}, {high:.6g}] for "
            f"n = {n}, delta = {d:.6g}; got {eps:.6g}"
        )
    if form == SIMPLIFIED:
        return math.sqrt(64.0 * math.exp(eps) * math.log(4.0 / d) / n)
    lam = binary_rr_lambda(eps, n)
    # The range check above is the lambda condition; clamp against rounding at the endpoints.
    lam = min(max(lam, 14.0 * math.log(4.0 / d)), float(n))
    return lemma_ii6_epsilon(lam, n, d)


def fmt_closed_form_max_epsilon_local(respondents: int, delta: float) -> float:
    """The largest eps_0 for which the closed form holds: ln(n / (8 ln(2/delta)) - 1)
    (samplable-anonymous-aggregation Theorem 3.1). Raises BoundOutOfRange if none does."""
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    ratio = n / (8.0 * math.log(2.0 / d))
    if ratio <= 2.0:
        raise BoundOutOfRange(
            f"FMT closed form needs n / (8 ln(2/delta)) - 1 > 1, i.e. n > "
            f"{16.0 * math.log(2.0 / d):.6g} for delta = {d:.6g}; got n = {n}"
        )
    return math.log(ratio - 1.0)


def fmt_closed_form_epsilon(epsilon_local: float, respondents: int, delta: float) -> float:
    """Closed-form amplification of Feldman-McMillan-Talwar, as stated in
    samplable-anonymous-aggregation Theorem 3.1: for a replacement eps_0-DP local randomizer and
    eps_0 <= ln(n / (8 ln(2/delta)) - 1)::

        eps <= log(1 + (e^eps_0 - 1) (4 sqrt(2 log(4/delta)) / sqrt((e^eps_0 + 1) n) + 4/n))

    For a removal eps_l-DP randomizer pass eps_0 = 2 eps_l (same source, after Theorem 3.1).
    """
    eps0 = check_epsilon(epsilon_local, "epsilon_local")
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    highest = fmt_closed_form_max_epsilon_local(n, d)
    if eps0 > highest:
        raise BoundOutOfRange(
            f"FMT closed form needs epsilon_local <= ln(n / (8 ln(2/delta)) - 1) = {highest:.6g}; "
            f"got {eps0:.6g}"
        )
    scale = 4.0 * math.sqrt(2.0 * math.log(4.0 / d)) / math.sqrt((math.exp(eps0) + 1.0) * n)
    return math.log1p(math.expm1(eps0) * (scale + 4.0 / n))


# ---------------------------------------------------------------------------------------------
# FMT numerical bound
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeltaBracket:
    """lower <= delta(eps) of the FMT clone reduction <= upper (``upper`` is a valid delta)."""

    lower: float
    upper: float


# Relative allowance for floating-point error in the binomial terms (scipy's binomial pmf and
# survival function are accurate to a few ulps; 1e-12 is thousands of ulps).
_ROUNDING = 1e-12


def _conditional_deltas(
    clones: np.ndarray, epsilon: float, epsilon_local: float
) -> tuple[np.ndarray, np.ndarray]:
    """Hockey-stick divergence D_{e^eps}(P_c || Q_c) for each clone count c, and the size of the
    two terms it is the difference of (for the rounding allowance).

    Given C = c clones, A ~ Bin(c, 1/2) and alpha = e^eps0/(1+e^eps0), the FMT pair is
    P_c = A + Bern(alpha), Q_c = A + Bern(1-alpha). Its likelihood ratio grows with the outcome x,
    so the divergence is P_c(X >= k) - e^eps Q_c(X >= k) for the first x = k where the ratio
    exceeds e^eps, which simplifies to u Pr[A = k-1] - (e^eps - 1) Pr[A >= k] with
    u = alpha - e^eps (1 - alpha). By the symmetry x -> c+1-x, D(Q_c||P_c) is the same number.
    """
    special = ufuncs()

    if epsilon >= epsilon_local:
        zeros = np.zeros(clones.shape, dtype=np.float64)
        return zeros, zeros
    alpha = float(special.expit(epsilon_local))
    u = -alpha * math.expm1(epsilon - epsilon_local)
    # The ratio exceeds e^eps iff x / (c+1-x) > r = (e^eps - e^-eps0) / (1 - e^(eps-eps0)), i.e.
    # iff j = c+1-x < m = (c+1) gamma with gamma = 1/(1+r); so the first such x is
    # k = c + 2 - ceil(m). gamma is computed from both parts of r, which keeps its digits when r
    # is huge (a large eps0 makes 1 - gamma round to 1).
    numerator = math.exp(epsilon) - math.exp(-epsilon_local)
    denominator = -math.expm1(epsilon - epsilon_local)
    gamma = denominator / (numerator + denominator)
    first = (clones + 2.0 - np.ceil((clones + 1.0) * gamma)).astype(np.int64)
    (point,), above = binomial.around(first - 1, clones, 0.5, (0.0,))
    positive = u * point
    negative = math.expm1(epsilon) * above
    return np.maximum(positive - negative, 0.0), positive + negative


class _CloneWindow:
    """The clone count C ~ Bin(n-1, e^-eps0) restricted to the window holding all but
    ``tail_mass`` of its probability, split into at most ``resolution`` blocks."""

    def __init__(self, respondents: int, epsilon_local: float, tail_mass: float, resolution: int):
        self.epsilon_local = epsilon_local
        trials, p = respondents - 1, math.exp(-epsilon_local)
        clones = binomial.Binomial(trials, p)
        low = int(clones.ppf(tail_mass / 2.0)) if trials > 0 else 0
        high = int(clones.isf(tail_mass / 2.0)) if trials > 0 else 0
        low, high = max(low, 0), min(max(high, low), trials)
        # Mass left out of the window: counted in full (delta_c <= 1) in the upper bound.
        self.tail = float(clones.cdf(low - 1) + clones.sf(high)) if trials > 0 else 0.0
        count = high - low + 1
        self.exact = count <= resolution
        if self.exact:
            self.points = np.arange(low, high + 1, dtype=np.int64)
            self.masses = clones.pmf(self.points) if trials > 0 else np.ones(1)
        else:
            edges = np.unique(np.linspace(low, high + 1, resolution + 1).round().astype(np.int64))
            starts, ends = edges[:-1], edges[1:] - 1
            mean = trials * p
            # Block masses from whichever tail function is small there (keeps relative accuracy).
            from_below = clones.cdf(ends) - clones.cdf(starts - 1)
            from_above = clones.sf(starts - 1) - clones.sf(ends)
            self.masses = np.where(ends <= mean, from_below, from_above)
            self.points = edges  # delta_c at every block start and at the end of the last block

    def bracket(self, epsilon: float) -> DeltaBracket:
        deltas, magnitudes = _conditional_deltas(
            self.points.astype(np.float64), epsilon, self.epsilon_local
        )
        if self.exact:
            lower = float(self.masses @ deltas)
            upper = lower
            magnitude = float(self.masses @ magnitudes)
        else:
            # delta_c does not increase with c: Bin(c+1, 1/2) = Bin(c, 1/2) + Bern(1/2), so
            # (P_{c+1}, Q_{c+1}) is a post-processing of (P_c, Q_c). A block [a, b] therefore
            # contributes between mass * delta_{b+1} and mass * delta_a.
            upper = float(self.masses @ deltas[:-1])
            lower = float(self.masses @ deltas[1:])
            magnitude = float(self.masses @ magnitudes[:-1])
        upper += self.tail + _ROUNDING * (magnitude + upper)
        return DeltaBracket(lower=max(lower - _ROUNDING * magnitude, 0.0), upper=min(upper, 1.0))


# e^eps must stay finite in double precision (it overflows past 709.78).
_LARGEST_NUMERICAL_EPSILON = 700.0


def _numerical_epsilon_local(epsilon_local: float) -> float:
    eps0 = check_epsilon(epsilon_local, "epsilon_local")
    if eps0 > _LARGEST_NUMERICAL_EPSILON:
        raise BoundOutOfRange(
            f"FMT numerical bound is evaluated for epsilon_local <= {_LARGEST_NUMERICAL_EPSILON:g} "
            f"(e^epsilon overflows a double); got {eps0:.6g}"
        )
    return eps0


def fmt_numerical_delta(
    epsilon_local: float,
    respondents: int,
    epsilon: float,
    *,
    tail_mass: float = 1e-15,
    resolution: int = 4096,
) -> DeltaBracket:
    """Bracket on the smallest delta for which n shuffled eps_0-DP reports are (eps, delta)-DP
    according to the FMT clone reduction ("Hiding among the clones", Theorem 3.2; the procedure
    samplable-anonymous-aggregation Section 3 proposes).

    With C ~ Bin(n-1, e^-eps0) clones, delta(eps) = E_C[D_{e^eps}(P_C || Q_C)]. Only clone counts
    in a window holding all but ``tail_mass`` of C's probability are evaluated; the dropped mass is
    added to the upper bound whole. A window wider than ``resolution`` is cut into blocks and each
    block bounded through the monotonicity of D in c. ``upper`` is a valid delta; ``lower`` is a
    lower bound on the reduction's exact value.
    """
    eps0 = _numerical_epsilon_local(epsilon_local)
    n = check_count(respondents, "respondents")
    eps = check_epsilon(epsilon, "epsilon", allow_zero=True)
    tail = check_delta(tail_mass, "tail_mass")
    blocks = check_count(resolution, "resolution", minimum=2)
    return _CloneWindow(n, eps0, tail, blocks).bracket(eps)


def fmt_numerical_epsilon(
    epsilon_local: float,
    respondents: int,
    delta: float,
    *,
    resolution: int = 4096,
    tolerance: float = 1e-8,
) -> float:
    """The FMT numerical bound: the smallest eps (to within relative ``tolerance``, rounded up) with
    :func:`fmt_numerical_delta` upper bound <= delta, for n shuffled replacement eps_0-DP reports.

    Tighter than the closed form and valid for every n and eps_0 (it never exceeds eps_0). The
    window keeps all but 1e-4 delta of the clone distribution's mass, so the result lies within a
    hair of the reduction's exact value and below the block-walking reference implementation's
    upper bound; at n = 1e8 it takes well under a second (see benchmarks/bench_accounting.py).
    For a removal eps_l-DP randomizer pass eps_0 = 2 eps_l.
    """
    eps0 = _numerical_epsilon_local(epsilon_local)
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    blocks = check_count(resolution, "resolution", minimum=2)
    tolerance = check_delta(tolerance, "tolerance")
    window = _CloneWindow(n, eps0, 1e-4 * d, blocks)

    def excess(eps: float) -> float:
        return math.log(max(window.bracket(eps).upper, 1e-300)) - math.log(d)

    if excess(0.0) <= 0.0:
        return 0.0
    if excess(eps0) > 0.0:  # only for deltas near the rounding allowance: no amplification
        return eps0
    root, converged = brent_root(excess, 0.0, eps0, xtol=1e-12, rtol=tolerance, maxiter=100)
    if not converged:
        raise RuntimeError(f"FMT numerical bound: no root after 100 iterations, value is {root:g}")
    # brentq's answer may sit on either side of the root: move up until delta(eps) <= delta holds.
    step = tolerance * root + 1e-12
    answer = min(root + step, eps0)
    while excess(answer) > 0.0 and answer < eps0:
        answer = min(answer + step, eps0)
    return answer

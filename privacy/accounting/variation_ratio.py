"""Amplification by shuffling through the variation-ratio reduction (Wang et al., "Privacy
Amplification via Shuffling: Unified, Simplified, and Tightened", VLDB 2024).

A local randomizer has the (p, beta, q) variation-ratio property for a victim's pair of inputs
x0, x1 when R(x0)/R(x1) <= p pointwise, TV(R(x0), R(x1)) <= beta, and R(x0)/R(x) <= q and
R(x1)/R(x) <= q for every other input x (the paper's Definition of the property; q0 and q1 when
the two ratios differ). With alpha = beta/(p-1), the victim's report is dominated by a three-point
distribution putting p alpha on "0", alpha on "1" and the rest w = 1 - alpha - p alpha on a
non-informative "2" (the roles of 0 and 1 swapped for x1), and every other respondent's report
is, independently, a "0" with probability r0 = p alpha/q0, a "1" with probability
r1 = p alpha/q1 and something the adversary may know otherwise. The shuffled reports of n
respondents are a post-processing of the counts of 0s and 1s; the paper's numerical bound is the
hockey-stick divergence of that pair of count distributions.

How it is computed here (no per-term loops). T, the number of 0s and 1s, has the same law under
both inputs: T = C + 1[victim not "2"], C ~ Bin(n-1, r0+r1). Given T = t the count of 0s is
A + Y with A ~ Bin(t-1, rho), rho = r0/(r0+r1), and Y ~ Bern(pi_b) where
pi_b = lam_t a_b/(1-w) + (1-lam_t) rho, lam_t = Pr[victim not "2" | T = t] and a_0 = p alpha,
a_1 = alpha. So delta(eps) = sum_t Pr[T=t] D_t(eps) exactly, D_t being the hockey-stick
divergence of A + Bern(pi_0) against A + Bern(pi_1) (its likelihood ratio is monotone, so D_t is
one binomial point mass and one binomial tail). D_t does not increase with the number of clones
(an extra clone is a post-processing) and does not decrease with lam_t (mixing Y with a fresh
Bern(rho) is a post-processing), and lam_t increases with t; so a block of t values is bounded
above by D at its first clone count and last lam, and below by D at its last clone count and
first lam. Only t in a window holding all but ``tail`` of T's mass are evaluated; the dropped
mass is added to the upper bound whole. The result is a bracket lower <= delta(eps) <= upper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privacy.accounting import binomial
from privacy.accounting.core import BoundOutOfRange, check_count, check_epsilon

__all__ = [
    "VariationRatio",
    "variation_ratio_parameters",
    "ReducedPair",
    "hockey_stick_shifted_binomial",
    "ShiftedBinomialPair",
    "MAX_RESPONDENTS",
]

# Crowds larger than this are refused: the bound is validated up to 1e9 and evaluated in bounded
# time (a fixed number of binomial evaluations) up to here.
MAX_RESPONDENTS = 10**10

# Relative allowance for floating-point error in scipy's binomial point masses and tails (both
# measured accurate to ~3e-12 relative at n = 1e9 against exact sums; 1e-10 leaves a margin).
ROUNDING = 1e-10


@dataclass(frozen=True)
class VariationRatio:
    """Variation-ratio parameters (p, beta, q0, q1) of a local randomizer; ``p`` may be inf
    (multi-message randomizers whose messages can be impossible under one input)."""

    p: float
    beta: float
    q0: float
    q1: float
    name: str = "generic"

    def __post_init__(self) -> None:
        if not (self.p > 1.0):  # also refuses NaN
            raise ValueError(f"variation ratio p must be > 1, got {self.p!r}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"variation ratio beta must be in [0, 1], got {self.beta!r}")
        for label, value in (("q0", self.q0), ("q1", self.q1)):
            if not (1.0 <= value < math.inf):
                raise ValueError(f"variation ratio {label} must be in [1, inf), got {value!r}")
        if self.victim_masses()[2] < -1e-12:
            raise ValueError("variation ratio needs beta (p+1)/(p-1) <= 1")
        r0, r1 = self.clone_rates()
        if r0 + r1 >= 1.0:
            raise ValueError(f"variation ratio needs r0 + r1 < 1, got {r0 + r1:.6g}")

    def victim_masses(self) -> tuple[float, float, float]:
        """(p alpha, alpha, w): the victim's mass on "0", on "1" and on "2" under x0."""
        if math.isinf(self.p):
            a0, a1 = self.beta, 0.0
        else:
            a1 = self.beta / (self.p - 1.0)
            a0 = self.p * a1
        return a0, a1, max(1.0 - a0 - a1, 0.0)

    def clone_rates(self) -> tuple[float, float]:
        """(r0, r1) = (p alpha / q0, p alpha / q1): another respondent's chance of a "0", a "1"."""
        a0 = self.victim_masses()[0]
        return a0 / self.q0, a0 / self.q1


def variation_ratio_parameters(
    randomizer: str, epsilon_local: float, *, categories: int = 2, flip: float | None = None,
    bins: int | None = None, special_bins: int = 1,
) -> VariationRatio:  # fmt: skip
    """The paper's parameters (its Tables of amplification parameters) for the randomizers the
    pipeline ships or will ship.

    * ``generic``: any eps_0-LDP randomizer: p = q = e^eps_0, beta = (e^eps_0-1)/(e^eps_0+1).
    * ``binary_rr``: randomized response on {0,1} (one attribute of attribute-fragmented
      k-RAPPOR, Theorem III.1's setting): the generic parameters.
    * ``k_rr``: randomized response on ``categories`` values: beta = (e^eps_0-1)/(e^eps_0+k-1).
    * ``ldp_sgd``: Duchi et al.'s vector randomizer for [-1,1]^d (LDP-SGD): generic parameters.
    * ``cheu``: Cheu et al.'s multi-message binary sum with flip probability ``flip`` = f:
      p = (1-f)^2/f^2, beta = 1-2f, q = (1-f)/f (``epsilon_local`` unused).
    * ``balls_into_bins``: Luo et al.'s balls-into-bins with ``bins`` = d bins of which
      ``special_bins`` = s special: p = inf, beta = 1, q = d/s (``epsilon_local`` unused).
    """
    if randomizer == "cheu":
        f = float(flip) if flip is not None else math.nan
        if not 1e-12 <= f < 0.5:
            raise ValueError(f"cheu needs a flip probability in [1e-12, 0.5), got {flip!r}")
        return VariationRatio((1 - f) ** 2 / f**2, 1 - 2 * f, (1 - f) / f, (1 - f) / f, "cheu")
    if randomizer == "balls_into_bins":
        d = check_count(bins, "bins", minimum=2)
        s = check_count(special_bins, "special_bins")
        if 2 * s >= d:
            raise ValueError(f"balls_into_bins needs 2 special_bins < bins, got {s} of {d}")
        return VariationRatio(math.inf, 1.0, d / s, d / s, "balls_into_bins")
    eps = check_epsilon(epsilon_local, "epsilon_local")
    if eps > LARGEST_EPSILON:
        raise BoundOutOfRange(
            f"the variation-ratio bound is evaluated for epsilon_local <= {LARGEST_EPSILON:g}; "
            f"got {eps:.6g}"
        )
    p = math.exp(eps)
    if p <= 1.0 + 1e-12:
        raise BoundOutOfRange(
            f"the variation-ratio bound needs epsilon_local >= 1e-12; got {eps:.6g} (the local "
            "guarantee itself is the better statement there)"
        )
    if randomizer in ("generic", "binary_rr", "ldp_sgd"):
        return VariationRatio(p, math.tanh(eps / 2.0), p, p, randomizer)
    if randomizer == "k_rr":
        k = check_count(categories, "categories", minimum=2)
        return VariationRatio(p, math.expm1(eps) / (p + k - 1.0), p, p, f"k_rr(k={k})")
    raise ValueError(f"unknown randomizer {randomizer!r}")


# Beyond this the clone rate 2/(1+e^eps_0) is below 1e-130 and no crowd we accept amplifies;
# keeping it far from underflow keeps scipy's binomial functions in range.
LARGEST_EPSILON = 300.0


def hockey_stick_shifted_binomial(
    clones: np.ndarray, rho: float | np.ndarray, high: np.ndarray, low: np.ndarray, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """D_{e^eps}(A + Bern(high) || A + Bern(low)) for A ~ Bin(clones, rho), high >= low
    (elementwise), and the size of the terms it is a difference of (for rounding allowances).

    The likelihood ratio of x = A + Y grows with x, so the divergence is the sum of
    P(x) - e^eps Q(x) over x >= k for the first x with ratio > e^eps, which equals
    (high - e^eps low) Pr[A = k-1] - (e^eps - 1) Pr[A >= k]. The neighbours k-1 and k+1 of the
    computed k are tried as well (the divergence is the maximum over such sets), so rounding in
    k cannot make the value fall below the true divergence.
    """
    return ShiftedBinomialPair(clones, rho, high, low).divergence(epsilon)


class ShiftedBinomialPair:
    """:func:`hockey_stick_shifted_binomial` of fixed (clones, rho, high, low) at any epsilon,
    what does not depend on epsilon made once (a root search evaluates one pair tens of times):
    the same floats, operation for operation."""

    def __init__(
        self, clones: np.ndarray, rho: float | np.ndarray, high: np.ndarray, low: np.ndarray
    ) -> None:
        c = np.asarray(clones, dtype=np.float64)
        self.rho = np.broadcast_to(np.asarray(rho, dtype=np.float64), c.shape)
        self.high, self.low = high, low
        self.high_complement, self.low_complement = 1.0 - high, 1.0 - low
        self.rho_complement = 1.0 - self.rho
        self.slots = c + 1.0  # values A + Y may take
        self.counted = c >= 0.0
        self.trials = np.maximum(c, 0.0)
        self.laws_valid = binomial.valid_laws(self.trials, self.rho)
        self.columns = np.arange(c.size) if c.ndim == 1 else None  # of each point's options

    def divergence(self, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        high, low = self.high, self.low
        e = math.exp(epsilon)
        num = e * self.low_complement - self.high_complement
        den = high - e * low
        live = (den > 0.0) & self.counted
        num_l, den_l = np.where(live, num, 1.0), np.where(live, den, 1.0)
        weighted = self.rho * num_l
        gamma = weighted / (weighted + self.rho_complement * den_l)
        first = np.floor(self.slots * gamma) + 1.0
        first = np.clip(first, 0.0, self.slots)
        # Pr[A = first-1] and Pr[A >= first]; for the neighbouring thresholds (term(x) = P(x) -
        # e^eps Q(x) at x = first-1 and x = first) also Pr[A = first-2] and Pr[A = first].
        (below, point, here), tail = binomial.around(
            first - 1.0, self.trials, self.rho, laws_valid=self.laws_valid
        )
        grows = math.expm1(epsilon)
        value = den_l * point - grows * tail
        before_p = high * below + self.high_complement * point
        before_q = e * (low * below + self.low_complement * point)
        at_p = high * point + self.high_complement * here
        at_q = e * (low * point + self.low_complement * here)
        base = np.abs(den_l) * point + grows * tail
        options = np.array([value, value + before_p - before_q, value - at_p + at_q])
        sizes = np.array([base, base + before_p + before_q, base + at_p + at_q])
        best = np.argmax(options, axis=0)
        if self.columns is None:
            value, magnitude = np.choose(best, options), np.choose(best, sizes)
        else:
            value, magnitude = options[best, self.columns], sizes[best, self.columns]
        return np.where(live, np.maximum(value, 0.0), 0.0), np.where(live, magnitude, 0.0)


class ReducedPair:
    """The variation-ratio reduction of n shuffled reports, ready to evaluate delta(eps).

    The law of T (see the module docstring) is restricted to a window holding all but ``tail``
    of its mass and cut into at most ``resolution`` blocks (every t evaluated when the window
    is no wider).
    """

    def __init__(
        self, parameters: VariationRatio, respondents: int, tail: float, resolution: int = 1024
    ):
        n = check_count(respondents, "respondents")
        if n > MAX_RESPONDENTS:
            raise BoundOutOfRange(
                f"the variation-ratio bound is evaluated for up to {MAX_RESPONDENTS:.0e} "
                f"respondents; got {n}"
            )
        self.parameters = parameters
        self.n = n
        a0, a1, w = parameters.victim_masses()
        r0, r1 = parameters.clone_rates()
        self.a0, self.a1, self.w = a0, a1, w
        self.rate, self.rho = r0 + r1, r0 / (r0 + r1)
        self.symmetric = parameters.q0 == parameters.q1
        trials = n - 1
        clones = binomial.Binomial(trials, self.rate)
        if trials > 0:
            low = max(int(clones.ppf(tail / 2.0)), 0)
            # isf(q) = ppf(1 - q) loses q below 1e-16; the mirror binomial's ppf keeps it.
            mirror = int(binomial.Binomial(trials, 1.0 - self.rate).ppf(tail / 2.0))
            high = min(max(trials - mirror, low), trials)
        else:
            low = high = 0
        # T's window is [low, high + 1]; T outside it needs C outside [low, high].
        t_low, t_high = max(low, 0), high + 1
        self.tail = self._t_tail(t_low, t_high, clones) if trials > 0 else 0.0
        count = t_high - t_low + 1
        self.exact = count <= resolution
        if self.exact:
            starts = np.arange(t_low, t_high + 1, dtype=np.float64)
            ends = starts
        else:
            edges = np.unique(
                np.linspace(t_low, t_high + 1, resolution + 1).round().astype(np.int64)
            ).astype(np.float64)
            starts, ends = edges[:-1], edges[1:] - 1.0
        self.starts, self.ends = starts, ends
        self.masses = self._t_mass(starts, ends, clones)
        lam_start, lam_end = self._lam(starts), self._lam(ends)
        # Upper: fewest clones and largest lam of the block; lower: most clones, smallest lam.
        self.upper_args = (starts - 1.0, lam_end)
        self.lower_args = (ends - 1.0, lam_start)
        self._upper_pairs = self._directions(self.upper_args)
        self._lower_pairs = [] if self.exact else self._directions(self.lower_args)

    def _c_cdf(self, x: np.ndarray, clones) -> np.ndarray:
        return clones.cdf(x) if self.n > 1 else (np.asarray(x) >= 0).astype(np.float64)

    def _t_mass(self, starts: np.ndarray, ends: np.ndarray, clones) -> np.ndarray:
        """Pr[T in [start, end]] = (1-w) Pr[C in [start-1, end-1]] + w Pr[C in [start, end]]."""

        def c_mass(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            if self.n == 1:
                return ((a <= 0) & (b >= 0)).astype(np.float64)
            below = clones.cdf(b) - clones.cdf(a - 1)
            above = clones.sf(a - 1) - clones.sf(b)
            mean = (self.n - 1) * self.rate
            return np.maximum(np.where(b <= mean, below, above), 0.0)

        return (1.0 - self.w) * c_mass(starts - 1, ends - 1) + self.w * c_mass(starts, ends)

    def _t_tail(self, t_low: int, t_high: int, clones) -> float:
        left = (1.0 - self.w) * clones.cdf(t_low - 2) + self.w * clones.cdf(t_low - 1)
        right = (1.0 - self.w) * clones.sf(t_high - 1) + self.w * clones.sf(t_high)
        return float(left + right)

    def _lam(self, t: np.ndarray) -> np.ndarray:
        """Pr[victim not "2" | T = t]: 1/(1 + w (n-t) r / ((1-w) t (1-r)))."""
        if self.w == 0.0:
            return np.ones_like(t)
        with np.errstate(divide="ignore", invalid="ignore"):
            odds = self.w * (self.n - t) * self.rate / ((1.0 - self.w) * t * (1.0 - self.rate))
        lam = 1.0 / (1.0 + odds)
        return np.where(t <= 0, 0.0, np.where(t >= self.n, 1.0, lam))

    def _directions(self, args: tuple[np.ndarray, np.ndarray]) -> list[ShiftedBinomialPair]:
        """Per direction (x0 vs x1, and x1 vs x0 when q0 != q1): the pair whose divergences
        are the conditional D_t (:meth:`_sum` of an epsilon)."""
        clones, lam = args
        informative = 1.0 - self.w if self.w < 1.0 else 1.0
        pi0 = lam * self.a0 / informative + (1.0 - lam) * self.rho
        pi1 = lam * self.a1 / informative + (1.0 - lam) * self.rho
        found = [ShiftedBinomialPair(clones, self.rho, pi0, pi1)]
        if not self.symmetric:  # the other direction: x -> t - x swaps the roles
            found.append(ShiftedBinomialPair(clones, 1.0 - self.rho, 1.0 - pi1, 1.0 - pi0))
        return found

    def _sum(self, pairs: list[ShiftedBinomialPair], epsilon: float) -> tuple[float, float]:
        """The larger direction's sum over t of Pr[T in block] D, and its term size."""
        sums = []
        for pair in pairs:
            value, size = pair.divergence(epsilon)
            sums.append((float(self.masses @ value), float(self.masses @ size)))
        return max(sums)

    def delta(self, epsilon: float) -> tuple[float, float]:
        """(lower, upper) bracket on the reduction's delta(eps) (the larger of both directions:
        the hockey-stick divergence of a mixture over T, which both inputs share, is the sum of
        the conditional ones, per direction). Above eps = 700 (e^eps overflows) the curve's value
        at 700 is returned as the upper end (delta(eps) does not increase) and 0 as the lower."""
        if epsilon > 700.0:
            return 0.0, self.delta(700.0)[1]
        upper, magnitude = self._sum(self._upper_pairs, epsilon)
        if self.exact:
            lower, low_mag = upper, magnitude
        else:
            lower, low_mag = self._sum(self._lower_pairs, epsilon)
        upper += self.tail + ROUNDING * (magnitude + upper) + 1e-300
        lower -= ROUNDING * (low_mag + lower)
        return max(lower, 0.0), min(upper, 1.0)


def log_ratio(value: float, delta: float) -> float:
    """log(value/delta), with value clamped away from 0 (for root finding on log scale)."""
    return math.log(max(value, 1e-300)) - math.log(delta)

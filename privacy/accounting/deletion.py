"""Randomized report deletion, Algorithm 3 of esa-privacy-revisited (Section V).

For each crowd of n_i reports the shuffler draws n^_i = max(n_i + Laplace(b) - o, 0) with scale
b = 2/eps_cr and offset o = (2/eps_cr) log(2/delta_cr), aborts if n^_i > n_i, and otherwise deletes
n_i - n^_i uniformly chosen reports. Theorem V.1: (eps_cr, delta_cr)-DP on the crowd counts.

The shuffler samples a *discrete* Laplace of the same scale b (P[K = k] proportional to
exp(-|k|/b), from ``privacy.noise`` with ``discrete_laplace_scale(eps_cr / 2)``), because a
floating-point Laplace leaks through its gaps, and subtracts the offset rounded up, m = ceil(o).
The guarantee carries over unchanged: on integer counts (sensitivity 1) the pmf ratio of K at
neighbouring integers is exactly e^(1/b) = e^(eps_cr/2), as in the proof of Theorem V.1; and the
abort probability is P[K > m] = q^(m+1)/(1+q) <= e^(-o/b) = delta_cr/2 with q = e^(-1/b), the
same delta_cr/2 per crowd the proof uses. Rounding the offset up only lowers the abort
probability and adds less than one deletion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from privacy.accounting.core import check_count, check_delta, check_epsilon

__all__ = ["DeletionNoise", "DeletionBounds", "deletion_noise", "deletion_bounds"]


@dataclass(frozen=True)
class DeletionNoise:
    """Noise parameters of Algorithm 3 for (eps_cr, delta_cr): Laplace ``scale`` b = 2/eps_cr,
    ``offset`` o = b log(2/delta_cr), and ``offset_records`` = ceil(o), the integer offset to use
    with discrete Laplace noise of the same scale (see the module docstring)."""

    epsilon: float
    delta: float
    scale: float
    offset: float
    offset_records: int

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon, "epsilon")
        check_delta(self.delta)
        check_epsilon(self.scale, "scale")
        check_epsilon(self.offset, "offset")
        check_count(self.offset_records, "offset_records", minimum=0)
        if self.offset_records < self.offset:
            raise ValueError("offset_records must be >= offset")


def deletion_noise(epsilon_deletion: float, delta_deletion: float) -> DeletionNoise:
    """Algorithm 3, step 3 (esa-privacy-revisited): b = 2/eps_cr and o = (2/eps_cr) log(2/delta_cr)."""
    eps = check_epsilon(epsilon_deletion, "epsilon_deletion")
    d = check_delta(delta_deletion, "delta_deletion")
    scale = 2.0 / eps
    offset = scale * math.log(2.0 / d)
    if not math.isfinite(offset):  # a subnormal eps_cr or delta_cr: no offset a count can hold
        raise ValueError(
            f"deletion (eps {epsilon_deletion!r}, delta {delta_deletion!r}) gives an offset "
            "(2/eps) log(2/delta) beyond floating point"
        )
    return DeletionNoise(
        epsilon=eps, delta=d, scale=scale, offset=offset, offset_records=math.ceil(offset)
    )


@dataclass(frozen=True)
class DeletionBounds:
    """How many reports Algorithm 3 deletes per crowd (crowds larger than that; the max(., 0)
    of step 3 can only lower the count).

    * ``expected``: mean deletions given no abort, continuous Laplace as written:
      o + (o + b)(delta/4) / (1 - delta/4).
    * ``high_probability``: Theorem V.2, (4/eps_cr) log(2P/delta_cr), for all P crowds at once
      with probability >= 1 - delta_cr.
    * ``high_probability_tail``: the same event bounded directly, o + b log(P/(2 delta_cr))
      (never above Theorem V.2).
    * ``*_discrete``: the same quantities for discrete Laplace noise with offset m = ceil(o);
      ``high_probability_discrete`` is the smallest integer D with P P[m - K > D] <= delta_cr,
      at most Theorem V.2's bound plus one (the rounding of o).
    * ``abort_probability``: per crowd, delta_cr/4 (continuous), q^(m+1)/(1+q) (discrete).
    """

    crowds: int
    expected: float
    high_probability: float
    high_probability_tail: float
    abort_probability: float
    expected_discrete: float
    high_probability_discrete: int
    abort_probability_discrete: float


def deletion_bounds(epsilon_deletion: float, delta_deletion: float, crowds: int) -> DeletionBounds:
    """Expected and high-probability deletions of Algorithm 3 over ``crowds`` = P crowds
    (Theorem V.2, esa-privacy-revisited)."""
    noise = deletion_noise(epsilon_deletion, delta_deletion)
    count = check_count(crowds, "crowds")
    b, o, d = noise.scale, noise.offset, noise.delta
    # Continuous Laplace: P[L > o] = exp(-o/b)/2 = delta/4 and E[L; L > o] = (o + b) delta/4.
    abort = d / 4.0
    expected = o + (o + b) * abort / (1.0 - abort)
    theorem = 4.0 / noise.epsilon * math.log(2.0 * count / d)
    tail = o + b * max(math.log(count / (2.0 * d)), 0.0)
    # Discrete Laplace with q = exp(-1/b): P[K > s] = q^(s+1)/(1+q),
    # E[K; K > m] = q^(m+1) ((m+1) - m q) / ((1+q)(1-q)).
    m = noise.offset_records
    q = math.exp(-1.0 / b)
    one_minus_q = -math.expm1(-1.0 / b)
    if one_minus_q <= 1e-12:  # the discrete noise would be flat over 1e12 records
        raise ValueError(
            f"epsilon_deletion must be >= 1e-12 (a Laplace scale below 1e12), got {noise.epsilon!r}"
        )
    abort_discrete = q ** (m + 1) / (1.0 + q)
    excess = q ** (m + 1) * ((m + 1) - m * q) / ((1.0 + q) * one_minus_q)
    expected_discrete = m + excess / (1.0 - abort_discrete)
    # Deletions m - K exceed m + s when K < -s, probability q^(s+1)/(1+q) per crowd.
    needed = b * math.log(count / (d * (1.0 + q))) - 1.0
    extra = max(math.ceil(needed - 1e-12), 0)
    for _ in range(1000):  # guard the rounding in `needed` (a step or two at most)
        if count * q ** (extra + 1) / (1.0 + q) <= d:
            break
        extra += 1
    return DeletionBounds(
        crowds=count,
        expected=expected,
        high_probability=theorem,
        high_probability_tail=tail,
        abort_probability=abort,
        expected_discrete=expected_discrete,
        high_probability_discrete=m + extra,
        abort_probability_discrete=abort_discrete,
    )

"""Report fragmentation with a privacy backstop (Section IV, esa-privacy-revisited).

A respondent randomizes once with the backstop eps_b (Algorithm 2, step 1) and sends tau
fragments, each re-randomized from the backstop report with eps_f. Theorem IV.1 bounds what t of
the tau fragments reveal; Theorem IV.2 bounds the central epsilon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privacy.accounting.core import (
    THEOREM_III1_SIMPLIFIED,
    BoundOutOfRange,
    check_count,
    check_delta,
    check_epsilon,
)
from privacy.accounting.shuffle import theorem_iii1_range

__all__ = [
    "LocalGuarantee",
    "report_fragment_epsilon",
    "equal_variance_fragment_epsilon",
    "report_fragment_local_guarantee",
    "theorem_iv2_epsilon",
]


def report_fragment_epsilon(epsilon_backstop: float, epsilon_fragment: float, seen: int) -> float:
    """Theorem IV.1 (esa-privacy-revisited): the local epsilon of t = ``seen`` fragments::

        ln((e^(eps_b + t eps_f) + 1) / (e^eps_b + e^(t eps_f)))  <=  min(eps_b, t eps_f)

    evaluated with log-sum-exp (e^(eps_b + t eps_f) overflows for many fragments).
    """
    from scipy.special import logsumexp

    eps_b = check_epsilon(epsilon_backstop, "epsilon_backstop")
    eps_f = check_epsilon(epsilon_fragment, "epsilon_fragment")
    t = check_count(seen, "seen")
    combined = t * eps_f
    value = float(logsumexp([eps_b + combined, 0.0]) - logsumexp([eps_b, combined]))
    # Exact value is <= min(eps_b, t eps_f); clip the last-ulp rounding so the bound stays true.
    return min(max(value, 0.0), eps_b, combined)


def equal_variance_fragment_epsilon(epsilon_backstop: float, fragments: int) -> float:
    """The fragment epsilon the paper's tables use: sinh(eps_f) = sinh(eps_b) / tau.

    Section VII-A picks eps_f so that "the variance introduced in the report fragmenting step is
    roughly the same as that of the backstop step"; this rule reproduces the eps_l_inf and eps_l1
    columns of Tables I, IV, VIII and IX (with eps_b the Theorem III.1 solution) to about 0.01.
    """
    eps_b = check_epsilon(epsilon_backstop, "epsilon_backstop")
    tau = check_count(fragments, "fragments")
    # sinh(eps_b) overflows past eps_b ~ 710; use asinh(y) = log(y + sqrt(y^2 + 1)) in logs.
    if eps_b < 300.0:
        return float(np.arcsinh(np.sinh(eps_b) / tau))
    log_y = eps_b - math.log(2.0) - math.log(tau)
    return log_y + math.log(2.0)  # asinh(y) = log(2y) + O(1/y^2) for huge y


@dataclass(frozen=True)
class LocalGuarantee:
    """Local epsilons of a report-fragmented respondent (Theorem IV.1, Section VII-A).

    ``epsilon_all`` (eps_l_inf): an adversary sees all tau fragments (t = tau);
    ``epsilon_one`` (eps_l1): it sees a single fragment (t = 1). ``epsilon_fragment`` is None when
    the backstop report itself is sent (no report fragmentation).
    """

    epsilon_backstop: float
    epsilon_fragment: float | None
    fragments: int
    epsilon_all: float
    epsilon_one: float

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon_backstop, "epsilon_backstop")
        if self.epsilon_fragment is not None:
            check_epsilon(self.epsilon_fragment, "epsilon_fragment")
        check_count(self.fragments, "fragments")
        check_epsilon(self.epsilon_all, "epsilon_all", allow_zero=True)
        check_epsilon(self.epsilon_one, "epsilon_one", allow_zero=True)
        if self.epsilon_one > self.epsilon_all:
            raise ValueError("epsilon_one must be <= epsilon_all")


def report_fragment_local_guarantee(
    epsilon_backstop: float, fragments: int, epsilon_fragment: float | None = None
) -> LocalGuarantee:
    """eps_l_inf and eps_l1 of tau fragments of an eps_b backstop (Theorem IV.1 with t = tau and
    t = 1). Without ``epsilon_fragment`` the paper's equal-variance rule picks it, except for
    tau = 1, which means the backstop report is sent as it is: both epsilons are eps_b."""
    eps_b = check_epsilon(epsilon_backstop, "epsilon_backstop")
    tau = check_count(fragments, "fragments")
    if epsilon_fragment is None:
        if tau == 1:
            return LocalGuarantee(eps_b, None, 1, eps_b, eps_b)
        eps_f = equal_variance_fragment_epsilon(eps_b, tau)
    else:
        eps_f = check_epsilon(epsilon_fragment, "epsilon_fragment")
    return LocalGuarantee(
        epsilon_backstop=eps_b,
        epsilon_fragment=eps_f,
        fragments=tau,
        epsilon_all=report_fragment_epsilon(eps_b, eps_f, tau),
        epsilon_one=report_fragment_epsilon(eps_b, eps_f, 1),
    )


def theorem_iv2_epsilon(
    epsilon_backstop: float,
    epsilon_fragment: float,
    fragments: int,
    respondents: int,
    delta: float,
) -> tuple[float, dict[str, object]]:
    """Theorem IV.2 (esa-privacy-revisited): central epsilon of r-frag(att-frag(k-RAPPOR), tau),
    as printed::

        eps_c = min( sqrt(8 tau eps_f log^2(tau eps_f / delta) / n),      (fragments term)
                     sqrt(64 e^eps_b log(4/delta) / n) )                   (backstop term)

    under its conditions eps_f > 1 and delta < 1/2 (BoundOutOfRange otherwise).

    Only the backstop term is returned as the bound; the fragments term is reported in the
    details (``fragments_term_as_printed``) but not used, because as printed it does not hold:
    it lacks the e^eps_f its own proof (Lemma II.6 per row) produces. With tau = 1, eps_b = eps_f
    = 20, n = 1e4, delta = 1e-6 it gives 2.13, while the shuffled bits (flip probability ~4e-9)
    reveal the respondent's bit with probability ~1 (tests/privacy/test_accounting_composition.py
    checks this against the exact shuffled randomized response). The backstop term is Theorem
    III.1's simplified form for eps_b (the fragments are a post-processing of the shuffled backstop
    reports), held to Theorem III.1's range. Returns (eps_c, details).
    """
    eps_b = check_epsilon(epsilon_backstop, "epsilon_backstop")
    eps_f = check_epsilon(epsilon_fragment, "epsilon_fragment")
    tau = check_count(fragments, "fragments")
    n = check_count(respondents, "respondents")
    d = check_delta(delta)
    if eps_f <= 1.0:
        raise BoundOutOfRange(f"Theorem IV.2 needs epsilon_fragment > 1; got {eps_f:.6g}")
    if d >= 0.5:
        raise BoundOutOfRange(f"Theorem IV.2 needs delta < 1/2; got {d:.6g}")
    low, high = theorem_iii1_range(n, d, "simplified")
    if not low <= eps_b <= high:
        raise BoundOutOfRange(
            f"Theorem IV.2 (backstop term, Theorem III.1) needs epsilon_backstop in "
            f"[{low:.6g}, {high:.6g}] for n = {n}, delta = {d:.6g}; got {eps_b:.6g}"
        )
    backstop = math.sqrt(64.0 * math.exp(eps_b) * math.log(4.0 / d) / n)
    details: dict[str, object] = {
        "backstop_term": backstop,
        "backstop_form": THEOREM_III1_SIMPLIFIED,
        "fragments_term_as_printed": math.sqrt(
            8.0 * tau * eps_f * math.log(tau * eps_f / d) ** 2 / n
        ),
        "fragments_term_used": False,
    }
    return backstop, details

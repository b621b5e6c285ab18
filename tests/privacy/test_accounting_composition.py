"""Tests of report fragments (Theorems IV.1 and IV.2, esa-privacy-revisited) and of basic and
advanced composition."""

from __future__ import annotations

import math

import pytest

from privacy import accounting as acc
from tests.privacy.accounting_references import DATASETS, shuffled_rr_delta

# ---------------------------------------------------------------------------------------------
# Report fragments
# ---------------------------------------------------------------------------------------------


def composed_rr_epsilon(eps_b: float, eps_f: float, seen: int) -> float:
    """Largest likelihood ratio of t fragments of binary randomized response computed from the
    channel probabilities (Algorithm 2 on one bit): attained when every fragment reads 1."""
    pb = math.exp(eps_b) / (1 + math.exp(eps_b))
    pf = math.exp(eps_f) / (1 + math.exp(eps_f))
    given_one = pb * pf**seen + (1 - pb) * (1 - pf) ** seen
    given_zero = (1 - pb) * pf**seen + pb * (1 - pf) ** seen
    return math.log(given_one / given_zero)


def test_theorem_iv1_matches_the_channel_and_its_bounds():
    for eps_b, eps_f, seen in [(2.0, 0.5, 1), (2.0, 0.5, 4), (8.0, 3.0, 2), (1.0, 2.0, 3)]:
        value = acc.report_fragment_epsilon(eps_b, eps_f, seen)
        assert value == pytest.approx(composed_rr_epsilon(eps_b, eps_f, seen), rel=1e-12)
        assert value <= min(eps_b, seen * eps_f)
    seen_counts = [acc.report_fragment_epsilon(5.0, 0.3, t) for t in range(1, 50)]
    assert seen_counts == sorted(seen_counts)


def test_theorem_iv1_does_not_overflow():
    value = acc.report_fragment_epsilon(600.0, 5.0, 1000)  # e^(600 + 5000) overflows a float
    assert value == pytest.approx(600.0, abs=1e-9)
    assert acc.equal_variance_fragment_epsilon(800.0, 4) == pytest.approx(800.0 - math.log(4))


def test_theorem_iv2_conditions_and_the_printed_fragments_term():
    n, delta = DATASETS["horse"]
    with pytest.raises(acc.BoundOutOfRange, match="epsilon_fragment > 1"):
        acc.theorem_iv2_epsilon(8.0, 0.5, 4, n, delta)
    with pytest.raises(acc.BoundOutOfRange, match="delta < 1/2"):
        acc.theorem_iv2_epsilon(8.0, 2.0, 4, n, 0.6)
    value, details = acc.theorem_iv2_epsilon(8.0, 2.0, 4, n, delta)
    assert value == pytest.approx(acc.theorem_iii1_epsilon(8.0, n, delta, "simplified"))
    assert details["fragments_term_used"] is False
    # The printed fragments term does not hold: tau = 1, eps_b = eps_f = 20, n = 1e4.
    printed = math.sqrt(8 * 1 * 20 * math.log(20 / 1e-6) ** 2 / 1e4)
    effective = acc.report_fragment_epsilon(20.0, 20.0, 1)  # one fragment: randomized response
    assert shuffled_rr_delta(10_000, effective, printed) > 0.5


# ---------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------


def test_basic_composition_adds_up():
    total = acc.compose_basic([acc.PrivacyLoss(0.1, 1e-7, "a"), acc.PrivacyLoss(0.4, 2e-7, "b")])
    assert total.epsilon == pytest.approx(0.5) and total.delta == pytest.approx(3e-7)
    assert total.bound == acc.BASIC_COMPOSITION
    with pytest.raises(ValueError, match="empty"):
        acc.compose_basic([])


def test_advanced_composition():
    # By hand: 100 * 0.01 / 2 + 10 * 0.1 * sqrt(2 ln(sqrt(50 pi) * 0.1 / 1e-6)) = 5.7985
    result = acc.compose_advanced(0.1, 1e-8, 100, 1e-6)
    assert result.epsilon == pytest.approx(5.7985, abs=1e-3)
    assert result.delta == pytest.approx(1e-6 + 100 * 1e-8)
    assert result.epsilon < 100 * 0.1  # beats basic composition here
    looser = acc.compose_advanced(0.1, 1e-8, 100, 1e-9)
    assert looser.epsilon > result.epsilon
    grows = [acc.compose_advanced(0.01, 0, k, 1e-6).epsilon for k in (100, 400, 1600)]
    assert grows == sorted(grows) and grows[2] / grows[1] < 2.2  # ~ sqrt(k), not k
    with pytest.raises(acc.BoundOutOfRange, match="non-negative logarithm"):
        acc.compose_advanced(1e-9, 0, 1, 0.5)
    assert acc.compose_repeated(0.1, 1e-8, 100, 1e-6).bound == acc.ADVANCED_COMPOSITION
    assert acc.compose_repeated(2.0, 1e-8, 2, 1e-6).bound == acc.BASIC_COMPOSITION

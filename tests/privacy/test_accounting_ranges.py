"""Tests of the amplification bounds' validity ranges: each bound refuses parameters outside its
condition, and where it answers, shuffled randomized response confirms the bound holds; bad input
raises a ValueError naming the field."""

from __future__ import annotations

import math

import pytest

from privacy import accounting as acc
from tests.privacy.accounting_references import DATASETS, shuffled_rr_delta


def printed_fmt_closed_form(eps0: float, n: int, delta: float) -> float:
    """samplable-anonymous-aggregation eq. (1), without its condition."""
    return math.log1p(
        math.expm1(eps0)
        * (4 * math.sqrt(2 * math.log(4 / delta)) / math.sqrt((math.exp(eps0) + 1) * n) + 4 / n)
    )


def test_fmt_closed_form_refuses_outside_its_condition():
    with pytest.raises(acc.BoundOutOfRange, match=r"ln\(n / \(8 ln\(2/delta\)\) - 1\)"):
        acc.fmt_closed_form_epsilon(4.0, 1000, 1e-6)
    # There the printed formula says 1.83, while the numerical bound (valid everywhere) needs 3.99.
    assert printed_fmt_closed_form(4.0, 1000, 1e-6) < acc.fmt_numerical_epsilon(4.0, 1000, 1e-6) - 2
    # And at eps0 = 5 the formula's value is provably below the true epsilon: shuffled binary
    # randomized response, an eps0-DP randomizer, has delta 1e-3 >> 1e-6 at that epsilon.
    wrong = printed_fmt_closed_form(5.0, 1000, 1e-6)
    assert shuffled_rr_delta(1000, 5.0, wrong) > 1e-4
    with pytest.raises(acc.BoundOutOfRange):
        acc.fmt_closed_form_epsilon(5.0, 1000, 1e-6)


def test_fmt_closed_form_inside_its_condition_is_valid_and_above_numerical():
    n, delta = 100_000, 1e-6
    for eps0 in (0.5, 2.0, 4.0):
        closed = acc.fmt_closed_form_epsilon(eps0, n, delta)
        assert acc.fmt_numerical_epsilon(eps0, n, delta) < closed
        assert shuffled_rr_delta(n, eps0, closed) <= delta


def test_lemma_ii6_range():
    with pytest.raises(acc.BoundOutOfRange, match=r"lambda >= 14 log\(4/delta\)"):
        acc.lemma_ii6_epsilon(100.0, 10_000, 1e-6)  # 14 log(4e6) = 213
    with pytest.raises(acc.BoundOutOfRange, match="lambda <= n"):
        acc.lemma_ii6_epsilon(20_000.0, 10_000, 1e-6)
    value = acc.lemma_ii6_epsilon(1000.0, 10_000, 1e-6)
    # It is a valid bound for the randomized response it describes (flip probability lambda/2n).
    eps_rr = math.log(2 * 10_000 / 1000.0 - 1)
    assert shuffled_rr_delta(10_000, eps_rr, value) <= 1e-6


def test_theorem_iii1_ranges():
    n, delta = DATASETS["horse"]
    low, high = acc.theorem_iii1_range(n, delta, "simplified")
    assert low == 1.0 and high == pytest.approx(math.log(n) - math.log(14 * math.log(4 / delta)))
    with pytest.raises(acc.BoundOutOfRange, match=r"epsilon_local in \[1"):
        acc.theorem_iii1_epsilon(0.5, n, delta, "simplified")
    with pytest.raises(acc.BoundOutOfRange):
        acc.theorem_iii1_epsilon(high + 0.01, n, delta, "simplified")
    _, exact_high = acc.theorem_iii1_range(n, delta, "exact")
    assert exact_high > high  # Lemma II.6's lambda condition is slightly wider
    acc.theorem_iii1_epsilon(0.5, n, delta, "exact")  # no lower limit in the exact form
    with pytest.raises(acc.BoundOutOfRange, match=r"14 log\(4/delta\)"):
        acc.theorem_iii1_epsilon(exact_high + 0.01, n, delta, "exact")
    with pytest.raises(acc.BoundOutOfRange, match="needs n >="):
        acc.theorem_iii1_epsilon(1.0, 100, 1e-6, "exact")
    with pytest.raises(acc.BoundOutOfRange, match=r"n\^\(-log n\)"):
        acc.theorem_iii1_epsilon(1.0, 1000, 1e-300, "simplified")


def test_theorem_iii1_simplified_is_above_exact_and_both_hold():
    n, delta = 200_000, 1e-6
    for eps in (1.0, 3.0, 6.0):
        exact = acc.theorem_iii1_epsilon(eps, n, delta, "exact")
        simplified = acc.theorem_iii1_epsilon(eps, n, delta, "simplified")
        assert exact <= simplified
        assert shuffled_rr_delta(n, eps, exact) <= delta


def test_solver_refuses_when_no_epsilon_local_meets_target():
    with pytest.raises(acc.BoundOutOfRange, match="more respondents"):
        acc.solve_epsilon_local(0.0001, 1_000, 1e-6)


def test_solver_reports_when_the_range_caps_epsilon_local():
    n, delta = DATASETS["horse"]
    result = acc.solve_epsilon_local(50.0, n, delta)
    assert result.details["limited_by_validity_range"]
    assert result.epsilon_local == pytest.approx(acc.theorem_iii1_range(n, delta, "exact")[1])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: acc.amplify(4.0, 1000, 0.0), "delta"),
        (lambda: acc.amplify(4.0, 1000, 1.0), "delta"),
        (lambda: acc.amplify(-1.0, 1000, 1e-6), "epsilon_local"),
        (lambda: acc.amplify(float("nan"), 1000, 1e-6), "epsilon_local"),
        (lambda: acc.amplify(4.0, 0, 1e-6), "respondents"),
        (lambda: acc.amplify(4.0, 10.5, 1e-6), "respondents"),
        (lambda: acc.amplify(4.0, True, 1e-6), "respondents"),
        (lambda: acc.amplify(4.0, 1000, 1e-6, "k_rr"), "mechanism"),
        (lambda: acc.amplify(4.0, 1000, 1e-6, local_model="swap"), "local_model"),
        (
            lambda: acc.central_epsilon(acc.LEMMA_II6, 4.0, 1000, 1e-6, acc.GENERIC),
            "does not apply",
        ),
        (lambda: acc.CentralGuarantee(-0.1, 1e-6, "x", 1.0, 10), "epsilon"),
        (lambda: acc.CentralGuarantee(0.1, 1e-6, "", 1.0, 10), "bound"),
    ],
)
def test_bad_input_raises_value_error_naming_the_field(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_central_guarantee_is_frozen_and_serializable():
    guarantee = acc.amplify(4.0, 100_000, 1e-6)
    with pytest.raises(AttributeError):
        guarantee.epsilon = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        guarantee.details["candidates"] = {}  # type: ignore[index]
    plain = guarantee.to_dict()
    assert plain["epsilon_central"] == guarantee.epsilon
    assert set(plain) >= {"epsilon_central", "epsilon_local", "bound", "delta", "respondents"}

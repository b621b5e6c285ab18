"""Tests of privacy.accounting's entry points: amplify, solve_epsilon_local, min_respondents and
privacy_report."""

from __future__ import annotations

import math

import pytest

from privacy import accounting as acc
from tests.privacy.accounting_references import DATASETS, shuffled_rr_delta


def test_amplify_takes_the_smallest_valid_candidate():
    n, delta = DATASETS["horse"]
    result = acc.amplify(8.55, n, delta, acc.ONE_HOT_RAPPOR)
    candidates = result.details["candidates"]
    assert set(candidates) == {*acc.mechanism_bounds(acc.ONE_HOT_RAPPOR), acc.LOCAL}
    numbers = {k: v for k, v in candidates.items() if isinstance(v, float)}
    assert result.epsilon == min(numbers.values()) and candidates[result.bound] == result.epsilon
    assert candidates[acc.THEOREM_III1_EXACT] == pytest.approx(1.0, abs=0.005)
    assert result.bound == acc.VARIATION_RATIO  # the variation-ratio bound is the tightest
    assert candidates[acc.VARIATION_RATIO] < candidates[acc.FMT_NUMERICAL]


def test_amplify_names_inapplicable_bounds_and_falls_back():
    result = acc.amplify(6.0, 1000, 1e-6, acc.BINARY_RR)
    candidates = result.details["candidates"]
    assert candidates[acc.LEMMA_II6].startswith("not applicable:")
    assert candidates[acc.FMT_CLOSED_FORM].startswith("not applicable:")
    assert result.bound == acc.VARIATION_RATIO
    assert candidates[acc.VARIATION_RATIO] < candidates[acc.FMT_NUMERICAL]
    assert shuffled_rr_delta(1000, 6.0, result.epsilon) <= 1e-6


def test_amplify_generic_removal_doubles_epsilon0():
    replacement = acc.amplify(2.0, 100_000, 1e-6, acc.GENERIC)
    removal = acc.amplify(1.0, 100_000, 1e-6, acc.GENERIC, local_model=acc.REMOVAL)
    assert removal.details["fmt_epsilon_0"] == 2.0
    assert removal.epsilon == pytest.approx(replacement.epsilon)
    assert acc.cohort_epsilon(2.0, 100_000, 1e-6) == replacement.epsilon


def test_solve_then_amplify_round_trip():
    n, delta = 1_000_000, 1e-7
    for mechanism in acc.MECHANISMS:
        solved = acc.solve_epsilon_local(0.3, n, delta, mechanism)
        bound = acc.PAPER_BOUNDS[mechanism]
        assert acc.central_epsilon(bound, solved.epsilon_local, n, delta, mechanism) <= 0.3
        if solved.details["limited_by_validity_range"]:
            with pytest.raises(acc.BoundOutOfRange):
                acc.central_epsilon(bound, solved.epsilon_local + 1e-3, n, delta, mechanism)
        else:
            above = acc.central_epsilon(bound, solved.epsilon_local + 1e-3, n, delta, mechanism)
            assert above > 0.3
        tightest = acc.solve_epsilon_local(0.3, n, delta, mechanism, bound=acc.TIGHTEST)
        assert tightest.epsilon_local >= solved.epsilon_local
        assert acc.amplify(tightest.epsilon_local, n, delta, mechanism).epsilon <= 0.3 * (1 + 1e-7)


def test_min_respondents_is_the_smallest_crowd():
    result = acc.min_respondents(1.0, 3.0, 1e-6)  # Check 3 with the numerical bound
    n = result.respondents
    assert acc.fmt_numerical_epsilon(3.0, n, 1e-6) <= 1.0 + 1e-6
    assert acc.fmt_numerical_epsilon(3.0, n - 1, 1e-6) > 1.0 - 1e-6
    closed = acc.min_respondents(1.0, 3.0, 1e-6, bound=acc.FMT_CLOSED_FORM).respondents
    assert n < closed
    rappor = acc.min_respondents(1.0, 8.0, 1e-6, acc.ONE_HOT_RAPPOR)
    assert acc.theorem_iii1_epsilon(8.0, rappor.respondents, 1e-6) <= 1.0
    try:  # one respondent fewer: out of the theorem's range, or above the target
        fewer = acc.theorem_iii1_epsilon(8.0, rappor.respondents - 1, 1e-6)
    except acc.BoundOutOfRange:
        fewer = math.inf
    assert fewer > 1.0
    tightest = acc.min_respondents(1.0, 8.0, 1e-6, acc.ONE_HOT_RAPPOR, bound=acc.TIGHTEST)
    assert tightest.respondents <= rappor.respondents


def test_tightest_names_every_bound_when_none_applies():
    # No crowd up to 2^33 brings epsilon_local = 30 down to epsilon_central = 1e-9 by any bound.
    with pytest.raises(acc.BoundOutOfRange, match="^no bound applies: ") as caught:
        acc.min_respondents(1e-9, 30.0, 1e-6, bound=acc.TIGHTEST)
    for name in acc.mechanism_bounds(acc.GENERIC):
        assert f"{name}: " in str(caught.value)


def test_privacy_report_table_i_row():
    n, delta = DATASETS["heavy_hitter"]
    backstop = acc.solve_epsilon_local(1.0, n, delta).epsilon_local
    report = acc.privacy_report(backstop, n, delta, fragments=16)
    assert report.local.epsilon_all == pytest.approx(12.99, abs=0.01)
    assert report.local.epsilon_one == pytest.approx(10.15, abs=0.01)
    assert report.central.epsilon <= 1.0
    assert report.central.epsilon <= report.central_without_attribute_fragmentation.epsilon
    plain = report.to_dict()
    assert plain["epsilon_local_all"] == report.local.epsilon_all
    assert plain["bound"] == report.central.bound
    unfragmented = acc.privacy_report(2.0, n, delta)
    assert unfragmented.local.epsilon_all == unfragmented.local.epsilon_one == 2.0
    # Table X row 1: without attribute fragmentation eps_c is higher (eps_0 = 2 eps_l for the
    # whole report instead of eps_l per attribute).
    without = unfragmented.central_without_attribute_fragmentation
    assert without.epsilon > unfragmented.central.epsilon
    assert without.details["fmt_epsilon_0"] == 4.0


def test_amplify_keeps_each_evaluation_and_hands_out_copies(monkeypatch):
    import privacy.accounting.solvers as solvers

    monkeypatch.setattr(solvers, "_AMPLIFIED", {})
    first = acc.amplify(2.0, 500, 1e-6, acc.ONE_HOT_RAPPOR)
    evaluations = []
    tight_bound = solvers.tight_bound

    def counted(*args, **kwargs):
        evaluations.append(args)
        return tight_bound(*args, **kwargs)

    monkeypatch.setattr(solvers, "tight_bound", counted)
    again = acc.amplify(2.0, 500, 1e-6, acc.ONE_HOT_RAPPOR)
    assert again == first and again is not first and not evaluations
    again.details["candidates"]["local"] = -1.0  # a caller's copy: the kept one is untouched
    assert acc.amplify(2.0, 500, 1e-6, acc.ONE_HOT_RAPPOR) == first
    # the same arguments as other types (numpy floats, integral floats) are the same evaluation
    import numpy as np

    assert acc.amplify(np.float64(2.0), 500.0, np.float64(1e-6), acc.ONE_HOT_RAPPOR) == first
    assert not evaluations
    acc.amplify(2.0, 501, 1e-6, acc.ONE_HOT_RAPPOR)  # another size is evaluated
    assert len(evaluations) == 1


def test_recorded_amplifications_let_another_process_skip_the_evaluation(monkeypatch):
    import privacy.accounting.solvers as solvers

    monkeypatch.setattr(solvers, "_AMPLIFIED", {})
    monkeypatch.setattr(solvers, "_GIVEN", {})
    report = acc.privacy_report(3.0, 1234, 1e-7)
    entries = acc.recorded_amplifications(lambda: acc.privacy_report(3.0, 1234, 1e-7))
    assert len(entries) == 2  # the one-hot bound and Table X's comparison without fragmentation
    nested = {}

    def outer():
        nested.update(acc.recorded_amplifications(lambda: acc.amplify(1.0, 99, 1e-6)))
        acc.amplify(1.0, 98, 1e-6)

    outside = acc.recorded_amplifications(outer)
    assert set(nested) < set(outside) and len(outside) == 2  # an inner recording counts outside
    # A process that was given the entries answers without evaluating anything.
    monkeypatch.setattr(solvers, "_AMPLIFIED", {})
    acc.remember_amplifications(entries)

    def refuse(*args, **kwargs):
        raise AssertionError("evaluated again")

    monkeypatch.setattr(solvers, "tight_bound", refuse)
    monkeypatch.setattr(solvers, "central_epsilon", refuse)
    assert acc.privacy_report(3.0, 1234, 1e-7) == report
    with pytest.raises(AssertionError, match="evaluated again"):  # a size it was not given
        acc.privacy_report(3.0, 1235, 1e-7)
    acc.remember_amplifications({})  # the next ones replace them
    with pytest.raises(AssertionError, match="evaluated again"):
        acc.privacy_report(3.0, 1234, 1e-7)

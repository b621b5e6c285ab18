"""The on-device budget accountant (Section 4, samplable-anonymous-aggregation)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privacy import budget
from privacy.rng import seeded_generator

KEYBOARD_FIELDS = frozenset({"ngram", "bucketed_age", "model_perplexity"})


def theorem_iii_1(epsilon_local: float, n: int, delta: float) -> float:
    """Theorem III.1 (esa-privacy-revisited), with its validity range, as a stand-in bound."""
    upper = math.log(n) - math.log(14 * math.log(4 / delta))
    if not 1 <= epsilon_local <= upper:
        raise ValueError(f"epsilon_local outside [1, {upper:.3f}]")
    return math.sqrt(64 * math.exp(epsilon_local) * math.log(4 / delta) / n)


def table_1_policy(analysis_reports: int = 1) -> budget.DevicePolicy:
    """Table 1 of samplable-anonymous-aggregation (keyboard analysis)."""
    return budget.DevicePolicy(
        analyses=(
            budget.AnalysisPolicy(
                "keyboard",
                0.5,
                analysis_reports,
                budget.QueryClass("keyboard_queries", KEYBOARD_FIELDS),
            ),
        ),
        data_fields=(
            budget.DataFieldPolicy("ngram", 5, 1, 1),
            budget.DataFieldPolicy("bucketed_age", 2, 0.3, 1),
            budget.DataFieldPolicy("model_perplexity", 8, 1, 1),
            budget.DataFieldPolicy("location", 4, 1, 5),
        ),
    )


def query(
    fields: set[str], epsilon_local: float = 2.0, epsilon_central: float = 0.5, **kw
) -> budget.Query:
    return budget.Query(
        query_id=kw.pop("query_id", "q@1"),
        query_class=kw.pop("query_class", "keyboard_queries"),
        data_fields=frozenset(fields),
        epsilon_local=epsilon_local,
        epsilon_central=epsilon_central,
        delta=kw.pop("delta", 1e-8),
        min_crowd_size=kw.pop("min_crowd_size", 1_000_000),
    )


def test_micro_epsilon_rounds_charges_up_and_allowances_down() -> None:
    assert budget.micro_epsilon_charge(0.1234567) == 123457
    assert budget.micro_epsilon_allowance(0.1234567) == 123456
    assert budget.micro_epsilon_charge(0.1) == budget.micro_epsilon_allowance(0.1) == 100_000
    assert budget.micro_epsilon_charge("1/3") == 333_334
    with pytest.raises(ValueError, match="epsilon"):
        budget.micro_epsilon_charge(-0.1)


def test_a_query_within_every_budget_is_admitted_and_charged() -> None:
    device = budget.DeviceBudget(table_1_policy(), theorem_iii_1)
    decision = device.charge(query({"ngram"}))
    assert decision.accepted and decision.reasons == ()
    used = device.used()
    assert used["analysis_micro_epsilon"]["keyboard"] == 500_000
    assert used["analysis_reports"]["keyboard"] == 1
    assert used["field_micro_epsilon"]["ngram"] == 500_000
    assert used["field_micro_epsilon"]["bucketed_age"] == 0
    assert device.events == (budget.ChargeEvent("q@1", "keyboard", ("ngram",), 500_000),)


def test_check_1_refuses_a_second_report_and_leaves_the_ledger_unchanged() -> None:
    device = budget.DeviceBudget(table_1_policy(), theorem_iii_1)
    assert device.charge(query({"ngram"}, epsilon_central=0.25)).accepted
    before_used, before_events = device.used(), device.events
    decision = device.charge(query({"model_perplexity"}, epsilon_central=0.25))
    assert not decision.accepted
    assert decision.reasons == ("analysis_reports_exhausted",)
    assert device.used() == before_used and device.events == before_events


def test_check_2_uses_the_most_stringent_field() -> None:
    device = budget.DeviceBudget(table_1_policy(), theorem_iii_1)
    # bucketed_age allows eps0 <= 2 and eps <= 0.3: this query breaks both, ngram neither.
    decision = device.check(
        query({"ngram", "bucketed_age"}, epsilon_local=4.0, epsilon_central=0.5)
    )
    assert set(decision.reasons) == {"field_epsilon_local_exceeded", "field_epsilon_exhausted"}
    assert all("bucketed_age" in f.detail for f in decision.failures)


def test_refusal_on_one_field_charges_no_field_and_no_analysis() -> None:
    device = budget.DeviceBudget(table_1_policy(analysis_reports=5), theorem_iii_1)
    before = device.used()
    decision = device.charge(query({"ngram", "bucketed_age"}, epsilon_central=0.4))
    assert decision.reasons == ("field_epsilon_exhausted",)
    assert device.used() == before and device.events == ()


def test_query_class_verification() -> None:
    device = budget.DeviceBudget(table_1_policy(), theorem_iii_1)
    outside = device.charge(query({"ngram", "location"}))
    assert outside.reasons == ("field_not_in_query_class",)
    unknown = device.charge(query({"ngram"}, query_class="camera_queries"))
    assert unknown.reasons == ("unknown_query_class",)
    assert device.events == ()


def test_check_3_needs_the_cohort_guarantee_at_the_minimum_crowd_size() -> None:
    device = budget.DeviceBudget(table_1_policy(analysis_reports=5), theorem_iii_1)
    delta = 1e-8
    # Smallest n with eps_c <= 0.5 at eps0 = 2: n >= 64 e^2 log(4/delta) / 0.25.
    n_needed = math.ceil(64 * math.exp(2) * math.log(4 / delta) / 0.25)
    assert device.check(query({"ngram"}, min_crowd_size=n_needed, delta=delta)).accepted
    too_small = device.check(query({"ngram"}, min_crowd_size=n_needed // 2, delta=delta))
    assert too_small.reasons == ("cohort_guarantee_not_met",)
    invalid = device.check(query({"ngram"}, epsilon_local=0.5, delta=delta))
    assert invalid.reasons == ("cohort_bound_invalid",)


def test_rounding_never_lets_spent_epsilon_exceed_the_allowance() -> None:
    policy = budget.DevicePolicy(
        analyses=(budget.AnalysisPolicy("a", 1.0, 100, budget.QueryClass("c", {"f"})),),
        data_fields=(budget.DataFieldPolicy("f", 10, 1.0, 100),),
    )
    device = budget.DeviceBudget(policy, lambda eps0, n, delta: 0.0)
    tenth = [device.charge(query({"f"}, epsilon_central=0.1, query_class="c")) for _ in range(11)]
    assert [d.accepted for d in tenth] == [True] * 10 + [False]
    device = budget.DeviceBudget(policy, lambda eps0, n, delta: 0.0)
    third = [device.charge(query({"f"}, epsilon_central=1 / 3, query_class="c")) for _ in range(3)]
    # 3 x ceil(333333.33) = 1000002 micro-epsilon > 1000000: the third is refused.
    assert [d.accepted for d in third] == [True, True, False]
    # What is recorded is never less than what was spent (2/3 epsilon).
    assert (
        device.used()["analysis_micro_epsilon"]["a"] == 666_668 >= 2 * budget.MICRO_PER_EPSILON / 3
    )


def test_policy_and_query_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="DataFieldPolicy.reports_allowed"):
        budget.DataFieldPolicy("f", 1, 1, -1)
    with pytest.raises(ValueError, match="AnalysisPolicy.epsilon_allowed"):
        budget.AnalysisPolicy("a", float("nan"), 1, budget.QueryClass("c", {"f"}))
    with pytest.raises(ValueError, match="without a DataFieldPolicy"):
        budget.DevicePolicy(
            (budget.AnalysisPolicy("a", 1, 1, budget.QueryClass("c", {"f", "g"})),),
            (budget.DataFieldPolicy("f", 1, 1, 1),),
        )
    with pytest.raises(ValueError, match="Query.data_fields"):
        query(set())
    with pytest.raises(ValueError, match="Query.min_crowd_size"):
        query({"ngram"}, min_crowd_size=0)
    with pytest.raises(ValueError, match="Query.delta"):
        query({"ngram"}, delta=1.5)


def test_fleet_charges_like_one_device_at_a_time() -> None:
    rng = seeded_generator(7)
    policy = budget.DevicePolicy(
        analyses=(
            budget.AnalysisPolicy("a", 2.0, 6, budget.QueryClass("ca", {"x", "y"})),
            budget.AnalysisPolicy("b", 1.5, 9, budget.QueryClass("cb", {"y", "z"})),
        ),
        data_fields=(
            budget.DataFieldPolicy("x", 8, 1.2, 4),
            budget.DataFieldPolicy("y", 8, 1.7, 5),
            budget.DataFieldPolicy("z", 8, 3.0, 9),
        ),
    )
    bound = lambda eps0, n, delta: 0.1  # noqa: E731 - Check 3 always passes here
    num_devices = 60
    fleet = budget.FleetBudget(policy, num_devices, bound)
    devices = [budget.DeviceBudget(policy, bound) for _ in range(num_devices)]
    classes = {"ca": ["x", "y"], "cb": ["y", "z"]}
    refused_total = 0
    for step in range(25):
        query_class = ["ca", "cb"][step % 2]
        fields = set(
            rng.choice(classes[query_class], size=rng.integers(1, 3), replace=False).tolist()
        )
        q = query(fields, epsilon_central=float(rng.uniform(0.05, 0.6)), query_class=query_class)
        chosen = rng.choice(num_devices, size=int(rng.integers(1, num_devices)), replace=False)
        refused = fleet.charge(q, chosen)
        expected = np.array([not devices[i].charge(q).accepted for i in chosen])
        assert np.array_equal(refused, expected)
        refused_total += int(refused.sum())
    assert refused_total > 0  # the sequence exhausts some budgets, so both branches ran
    remaining = fleet.analysis_micro_remaining("a")
    assert remaining.min() >= 0 and (fleet.field_micro_remaining("y") >= 0).all()
    for i, device in enumerate(devices):
        used = device.used()
        assert (
            remaining[i]
            == policy.analyses[0].micro_epsilon_allowed - used["analysis_micro_epsilon"]["a"]
        )
        assert fleet.analysis_micro_used[0, i] == used["analysis_micro_epsilon"]["a"]
        assert fleet.field_reports_used[1, i] == used["field_reports"]["y"]


def test_a_protocol_without_local_privacy_is_refused_by_check_2() -> None:
    device = budget.DeviceBudget(table_1_policy(), lambda eps0, n, delta: 0.1)
    decision = device.charge(query({"ngram"}, epsilon_local=math.inf))
    assert decision.reasons == ("field_epsilon_local_exceeded",)


def test_fleet_refuses_everywhere_when_the_query_itself_is_refused() -> None:
    fleet = budget.FleetBudget(table_1_policy(), 10, theorem_iii_1)
    refused = fleet.charge(query({"ngram", "location"}))
    assert refused.all() and not fleet.analysis_micro_used.any()
    assert fleet.check_query(query({"ngram", "location"}))[0].reason == "field_not_in_query_class"
    with pytest.raises(ValueError, match="devices must not repeat"):
        fleet.charge(query({"ngram"}), np.array([1, 1]))

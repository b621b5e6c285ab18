"""Theorem VI.1's accounting: per-epoch amplification, composition over T epochs, delta split."""

from __future__ import annotations

import math

import pytest

from privacy.accounting import PLD_COMPOSITION, BoundOutOfRange, amplify, compose_repeated
from privacy.accounting.ldp_sgd import ldp_sgd_guarantee, theorem_vi1_order


def test_guarantee_is_amplification_then_composition():
    g = ldp_sgd_guarantee(1.9, 1438, 20, 1e-5)
    per_epoch = amplify(1.9, 1438, 1e-5 / 40, "generic", local_model="replacement")
    assert g.epoch.epsilon == per_epoch.epsilon and g.epoch.delta == pytest.approx(1e-5 / 40)
    assert g.epoch.epsilon < 1.9  # shuffling amplifies
    composed = compose_repeated(per_epoch.epsilon, per_epoch.delta, 20, 1e-5 / 2)
    assert g.epsilon_central <= composed.epsilon
    assert g.composition_bound == PLD_COMPOSITION  # the epochs' curves composed as PLDs
    # delta' + T delta_e is the total delta.
    assert 1e-5 / 2 + 20 * g.epoch.delta == pytest.approx(1e-5)
    so_far = g.epsilon_central_so_far
    assert len(so_far) == 20 and all(a < b for a, b in zip(so_far, so_far[1:], strict=False))
    assert so_far[0] <= g.epoch.epsilon  # one epoch at the whole delta


def test_report_names_per_epoch_and_total_privacy():
    report = ldp_sgd_guarantee(1.9, 60_000, 100, 1e-5).to_dict()
    for key in ("epsilon_local_epoch", "epsilon_central_epoch", "epsilon_central", "delta",
                "respondents", "epochs", "epoch_bound", "composition_bound"):  # fmt: skip
        assert key in report
    # Many epochs over a large crowd: PLD composition beats adding up and Theorem II.7.
    assert report["composition_bound"] == PLD_COMPOSITION
    assert report["epsilon_central"] < 100 * report["epsilon_central_epoch"]


def test_reports_per_device_are_composed_on_the_device():
    one = ldp_sgd_guarantee(0.5, 5000, 5, 1e-6)
    five = ldp_sgd_guarantee(0.5, 5000, 5, 1e-6, reports_per_device=5)
    assert five.epsilon_local_device == pytest.approx(2.5)
    assert five.epoch.epsilon == amplify(2.5, 5000, 1e-6 / 10, "generic").epsilon
    assert five.epsilon_central > one.epsilon_central


def test_theorem_vi1_order_and_validation():
    value = theorem_vi1_order(1.0, 10_000, 9, 1e-6)
    assert value == pytest.approx(math.expm1(1.0) / 100 * 3 * math.log(9e6))
    with pytest.raises(ValueError, match="epochs"):
        ldp_sgd_guarantee(1.0, 1000, 0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        ldp_sgd_guarantee(1.0, 1000, 3, 1.5)
    assert issubclass(BoundOutOfRange, ValueError)

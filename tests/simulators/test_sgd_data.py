"""Datasets, the softmax-regression model and the devices of LDP-SGD."""

from __future__ import annotations

import numpy as np
import pytest

from simulators.sgd_data import (
    accuracy,
    load_device_data,
    mean_loss,
    per_example_gradients,
    train_reference,
)
from simulators.sgd_devices import EpochPlan, reference_epoch, shard_reports


def test_digits_ship_with_scikit_learn_and_split_stratified():
    data = load_device_data("digits")
    x, y = data.examples(0, data.devices)
    assert data.devices + data.test_y.size == 1797
    assert data.dimension == 650 and x.shape == (data.devices, 64)
    assert 0.0 <= x.min() and x.max() <= 1.0
    test_share = np.bincount(data.test_y, minlength=10) / np.bincount(
        np.concatenate([y, data.test_y]), minlength=10
    )
    assert np.all(np.abs(test_share - 0.2) < 0.01)
    again = load_device_data("digits")
    np.testing.assert_array_equal(again.test_x, data.test_x)


def test_synthetic_devices_are_generated_by_range():
    data = load_device_data("synthetic:10000", seed=4)
    x, y = data.examples(0, 10_000)
    x2, y2 = data.examples(4090, 8200)
    np.testing.assert_array_equal(x[4090:8200], x2)
    np.testing.assert_array_equal(y[4090:8200], y2)
    with pytest.raises(ValueError, match="outside"):
        data.examples(0, 10_001)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_device_data("fashion-mnist")


def test_per_example_gradients_match_finite_differences():
    data = load_device_data("synthetic:50", seed=1)
    x, y = data.examples(0, 3)
    rng = np.random.default_rng(2)
    theta = rng.normal(size=data.dimension) * 0.1
    gradients = per_example_gradients(theta, x, y, data.classes)
    for row in range(3):
        for coordinate in rng.choice(data.dimension, size=5, replace=False):
            step = np.zeros(data.dimension)
            step[coordinate] = 1e-6
            numeric = (
                mean_loss(theta + step, x[row : row + 1], y[row : row + 1], data.classes)
                - mean_loss(theta - step, x[row : row + 1], y[row : row + 1], data.classes)
            ) / 2e-6
            assert gradients[row, coordinate] == pytest.approx(numeric, abs=1e-6)


def test_nonprivate_baseline_learns_digits():
    data = load_device_data("digits")
    final = train_reference(data, 10, radius=5.0)[-1]
    assert accuracy(final, data.test_x, data.test_y, data.classes) > 0.85


def test_device_shards_send_all_reports_to_one_instance_and_reproduce():
    data = load_device_data("synthetic:300", seed=3)
    plan = EpochPlan(1, 1.0, 1.0, data.dimension, instances=3, reports_per_device=2, seed=9,
                     devices_per_shard=128)  # fmt: skip
    shards = plan.shards(data.devices)
    assert [(s.start, s.stop) for s in shards] == [(0, 128), (128, 256), (256, 300)]
    theta = np.zeros(data.dimension)
    batch = shard_reports(data, plan, theta, shards[1])
    assert len(batch) == 256 and set(np.unique(batch.instance)) <= {0, 1, 2}
    assert np.all(batch.instance[0::2] == batch.instance[1::2])  # a device's two reports
    np.testing.assert_array_equal(batch.device[0::2], np.arange(128, 256))
    again = shard_reports(data, plan, theta, shards[1])
    np.testing.assert_array_equal(batch.seeds, again.seeds)
    result = reference_epoch(data, plan, theta, radius=2.0)
    assert result.reports == 600 and np.linalg.norm(result.theta) <= 2.0 + 1e-12


def test_devices_without_a_seed_draw_from_the_system_csprng():
    data = load_device_data("synthetic:50", seed=3)
    plan = EpochPlan(1, 1.0, 1.0, data.dimension, instances=3, seed=None)
    (shard,) = plan.shards(data.devices)
    first = shard_reports(data, plan, np.zeros(data.dimension), shard)
    second = shard_reports(data, plan, np.zeros(data.dimension), shard)
    assert len(first) == 50 and set(np.unique(first.instance)) <= {0, 1, 2}
    assert not np.array_equal(first.seeds, second.seeds)  # 2^-6400 chance of equality

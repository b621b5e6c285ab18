"""LDP-SGD devices: one epoch of Algorithm 4 for a range of devices, and the plain numpy epoch.

Each device holds its training example(s) (``simulators.sgd_data``), computes the gradient at the
model theta_t the server sent, clips it to L and sends ``reports_per_device`` independent
Algorithm 4 reports (seed, sign), all to one shuffler instance drawn uniformly. Devices are cut
into shards; a shard's randomness is a ``SeedSequence([seed, epoch, shard])`` generator when a
seed is given (simulations and tests, reproducible whatever the runner's order), else the
operating system's CSPRNG (``privacy.rng.secure_generator``).

:func:`reference_epoch` runs the same devices and Algorithm 5's step without Beam, files or
shuffler: the baseline the benchmark compares with, the engine of the epsilon grid picture, and
the oracle the pipeline is checked against (shuffling permutes reports, so the sum is the same).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from privacy.ldp_sgd import (
    LdpSgdRandomizer,
    server_step,
)
from privacy.rng import secure_generator
from simulators.sgd_data import DeviceData, per_example_gradients

__all__ = [
    "EpochPlan",
    "DeviceShard",
    "ShardReports",
    "shard_reports",
    "EpochResult",
    "reference_epoch",
    "reference_training",
]

DEFAULT_DEVICES_PER_SHARD = 5_000


@dataclass(frozen=True)
class DeviceShard:
    index: int
    start: int
    stop: int


@dataclass(frozen=True)
class EpochPlan:
    """Everything a device shard needs for one epoch, except theta (small, picklable)."""

    epoch: int  # 1-based
    epsilon: float
    clip_norm: float
    dimension: int
    instances: int = 1
    reports_per_device: int = 1
    seed: int | None = None
    devices_per_shard: int = DEFAULT_DEVICES_PER_SHARD
    rate_scale: float = 1.0  # k of the server's eta_t = k c / sqrt(t) (privacy.ldp_sgd.server_step)

    def __post_init__(self) -> None:
        for name in ("epoch", "instances", "reports_per_device", "devices_per_shard"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def randomizer(self) -> LdpSgdRandomizer:
        return LdpSgdRandomizer(self.epsilon, self.clip_norm, self.dimension)

    def shards(self, devices: int) -> list[DeviceShard]:
        size = self.devices_per_shard
        return [
            DeviceShard(index, start, min(start + size, devices))
            for index, start in enumerate(range(0, devices, size))
        ]

    def source(self, shard: DeviceShard) -> tuple[np.random.Generator, np.random.Generator | None]:
        """The shard's random source and, with a seed, the generator that picks instances."""
        if self.seed is None:
            return secure_generator(), None
        generator = np.random.Generator(
            np.random.PCG64DXSM(np.random.SeedSequence([self.seed, self.epoch, shard.index]))
        )
        return generator, generator


@dataclass(frozen=True)
class ShardReports:
    """Reports of one shard: row r came from ``device[r]`` and goes to ``instance[r]``."""

    device: np.ndarray  # int64
    instance: np.ndarray  # int64
    seeds: np.ndarray  # (m, 16) uint8
    signs: np.ndarray  # (m,) int8

    def __len__(self) -> int:
        return int(self.signs.shape[0])


def shard_reports(
    data: DeviceData, plan: EpochPlan, theta: np.ndarray, shard: DeviceShard
) -> ShardReports:
    """Algorithm 4 on every device of ``shard`` at ``theta``."""
    x, y = data.examples(shard.start, shard.stop)
    gradients = per_example_gradients(theta, x, y, data.classes)
    tau = plan.reports_per_device
    if tau > 1:
        gradients = np.repeat(gradients, tau, axis=0)
    source, generator = plan.source(shard)
    randomized = plan.randomizer.randomize(gradients, source)
    # A device sends all its reports of an epoch to one instance, so an instance's crowd of
    # respondents is its released reports / tau.
    devices = shard.stop - shard.start
    if plan.instances == 1:
        chosen = np.zeros(devices, dtype=np.int64)
    elif generator is not None:
        chosen = generator.integers(0, plan.instances, size=devices)
    else:
        chosen = np.array([secrets.randbelow(plan.instances) for _ in range(devices)])
    device = np.repeat(np.arange(shard.start, shard.stop, dtype=np.int64), tau)
    instance = np.repeat(chosen.astype(np.int64), tau)
    return ShardReports(device, instance, randomized.seeds, randomized.signs)


@dataclass(frozen=True)
class EpochResult:
    theta: np.ndarray
    reports: int
    learning_rate: float
    gradient_norm: float


def reference_epoch(
    data: DeviceData, plan: EpochPlan, theta: np.ndarray, radius: float
) -> EpochResult:
    """One epoch (encode, sum, Algorithm 5 step) in plain numpy, same randomness as the pipeline."""
    randomizer = plan.randomizer
    total = np.zeros(plan.dimension)
    reports = 0
    for shard in plan.shards(data.devices):
        batch = shard_reports(data, plan, theta, shard)
        total += randomizer.decode_sum(batch.seeds, batch.signs)
        reports += len(batch)
    theta_next, eta, norm = server_step(
        theta, total, reports, plan.epoch, randomizer, radius, plan.rate_scale
    )
    return EpochResult(theta_next, reports, eta, norm)


def reference_training(
    data: DeviceData, plan: EpochPlan, epochs: int, radius: float
) -> list[EpochResult]:
    """``epochs`` reference epochs from theta_0 = 0 (Algorithm 5, step 1)."""
    theta = np.zeros(plan.dimension)
    results = []
    for epoch in range(1, epochs + 1):
        step = EpochPlan(**{**plan.__dict__, "epoch": epoch})
        result = reference_epoch(data, step, theta, radius)
        theta = result.theta
        results.append(result)
    return results


def expected_reports(devices: int, plan: EpochPlan) -> int:
    return devices * plan.reports_per_device

"""Simulation plans, shard descriptors and shard summaries (pure: no Beam, no files).

A simulation is a small, picklable :class:`SimulationPlan` (recipe JSON, population spec, seed,
fleet settings) cut into :class:`ShardSpec` descriptors (shard index, respondent range, a
``numpy.random.SeedSequence`` child of the master seed); each shard's counts come back as a
:class:`ShardSummary` (true counts summed sparsely, never held per respondent). The per-shard work
is ``simulators.shards``; the Beam shell is ``transforms.devices.encode``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.avro.container import check_codec
from schemas.recipes import Recipe, recipe_from_dict
from simulators.fleet import DEFAULT_START_MS, FleetBatch, FleetConfig
from simulators.reports import ReportBatch

__all__ = [
    "DEFAULT_MESSAGES_PER_SHARD",
    "DEFAULT_MESSAGES_PER_CHUNK",
    "DEFAULT_CODEC",
    "DEFAULT_COMPRESSION_LEVEL",
    "SimulationPlan",
    "ShardSpec",
    "ShardSummary",
]

DEFAULT_MESSAGES_PER_SHARD = 2_000_000
DEFAULT_MESSAGES_PER_CHUNK = 250_000
DEFAULT_CODEC = "deflate"
DEFAULT_COMPRESSION_LEVEL = 1
_BUCKET_BITS = 40


@dataclass(frozen=True)
class SimulationPlan:
    """Everything a worker needs to simulate any shard: small and picklable.

    ``recipe_json``: the recipe itself (``Recipe.to_json()``), so workers need no recipe files.
    ``respondents``: devices simulated (required except for images, whose natural size is their
    total luminosity). ``device_budget``: cohort epsilon each device allows the recipe's analysis
    (default: exactly enough for every round); ``query_class_fields``: data fields the device's query class allows
    (default the recipe's). ``messages_per_shard``/``messages_per_chunk`` bound the messages per
    output file and in memory at once.
    """

    recipe_json: str
    population: str
    seed: int
    respondents: int | None = None
    rounds: int = 1
    start_ms: int = DEFAULT_START_MS
    window_ms: int | None = None
    device_budget: float | None = None
    query_class_fields: tuple[str, ...] | None = None
    instance_weights: tuple[float, ...] | None = None
    enforce_budget: bool = True
    codec: str = DEFAULT_CODEC
    compression_level: int = DEFAULT_COMPRESSION_LEVEL
    messages_per_shard: int = DEFAULT_MESSAGES_PER_SHARD
    messages_per_chunk: int = DEFAULT_MESSAGES_PER_CHUNK
    # Sealed payloads (simulators/sealing.py): the analyzer's PUBLIC key file's JSON, or None.
    public_key_json: str | None = None
    # Prio3 recipes (simulators/prio3_devices.py): the two aggregators' PUBLIC key files' JSON.
    aggregator_keys_json: tuple[str, ...] | None = None
    # The validated recipe of recipe_json (for_recipe): recipe() returns it, and a pickled plan
    # carries it with its solved epsilon_local (Recipe.__reduce__), so a worker does not solve
    # it again.
    validated_recipe: Recipe | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**128:
            raise ValueError(f"seed must be an integer in [0, 2**128), got {self.seed!r}")
        if self.respondents is not None and (
            not isinstance(self.respondents, int) or self.respondents < 1
        ):
            raise ValueError(f"respondents must be a positive integer, got {self.respondents!r}")
        if self.device_budget is not None and not (
            math.isfinite(self.device_budget) and self.device_budget >= 0
        ):
            raise ValueError(f"device_budget must be finite and >= 0, got {self.device_budget}")
        check_codec(self.codec)
        if not -1 <= self.compression_level <= 9:
            raise ValueError(f"compression_level must be in [-1, 9], got {self.compression_level}")
        for name in ("messages_per_shard", "messages_per_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.query_class_fields is not None:
            object.__setattr__(self, "query_class_fields", tuple(self.query_class_fields))
        if self.instance_weights is not None:
            object.__setattr__(self, "instance_weights", tuple(self.instance_weights))
        if self.aggregator_keys_json is not None:
            object.__setattr__(self, "aggregator_keys_json", tuple(self.aggregator_keys_json))
        if (
            self.validated_recipe is not None
            and self.validated_recipe.to_json() != self.recipe_json
        ):
            raise ValueError("validated_recipe is not the recipe of recipe_json")
        # Validates the rest (rounds, start, window, weights) once, in the driver.
        self.fleet_config()

    @classmethod
    def for_recipe(
        cls, recipe: Recipe, population: str, seed: int, **settings: Any
    ) -> SimulationPlan:
        return cls(
            recipe_json=recipe.to_json(),
            population=population,
            seed=seed,
            validated_recipe=recipe,
            **settings,
        )

    def recipe(self) -> Recipe:
        if self.validated_recipe is not None:
            return self.validated_recipe
        return recipe_from_dict(json.loads(self.recipe_json), source="simulation plan")

    def _seed_sequences(self) -> list[np.random.SeedSequence]:
        """Children of the master seed, in spawn order: population, origin key, shards."""
        return np.random.SeedSequence(self.seed).spawn(3)

    @property
    def population_seed(self) -> int:
        return int(self._seed_sequences()[0].generate_state(1, np.uint64)[0])

    @property
    def origin_key(self) -> int:
        return int(self._seed_sequences()[1].generate_state(1, np.uint64)[0])

    def fleet_config(self) -> FleetConfig:
        return FleetConfig(
            rounds=self.rounds,
            start_ms=self.start_ms,
            window_ms=self.window_ms,
            origin_key=self.origin_key,
            instance_weights=self.instance_weights,
            enforce_budget=self.enforce_budget,
        )

    def shards(self, respondents: int, respondents_per_shard: int) -> list[ShardSpec]:
        """Shard descriptors covering ``[0, respondents)``, each with its own SeedSequence child."""
        if respondents_per_shard < 1:
            raise ValueError(f"respondents_per_shard must be >= 1, got {respondents_per_shard}")
        count = -(-respondents // respondents_per_shard)
        children = self._seed_sequences()[2].spawn(count)
        return [
            ShardSpec(
                index=index,
                start=index * respondents_per_shard,
                stop=min(respondents, (index + 1) * respondents_per_shard),
                entropy=child.entropy,
                spawn_key=tuple(child.spawn_key),
            )
            for index, child in enumerate(children)
        ]


@dataclass(frozen=True)
class ShardSpec:
    """One unit of work: respondents ``[start, stop)`` and the SeedSequence child they draw from."""

    index: int
    start: int
    stop: int
    entropy: int
    spawn_key: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(
                f"shard {self.index}: empty or negative range [{self.start}, {self.stop})"
            )

    @property
    def respondents(self) -> int:
        return self.stop - self.start

    def generator(self, stream: int) -> np.random.Generator:
        """Independent generator ``stream`` of this shard (0: fleet randomness, 1: file sync
        markers, 2: instances and times of prio3 reports)."""
        sequence = np.random.SeedSequence(self.entropy, spawn_key=(*self.spawn_key, stream))
        return np.random.Generator(np.random.PCG64DXSM(sequence))


@dataclass
class ShardSummary:
    """Counts of one or more shards; true counts are sparse ``(window, bucket, count)`` rows."""

    shards: int = 0
    respondents: int = 0
    device_rounds: int = 0
    refusals: int = 0
    messages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    presence: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    chaff: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    truth_window: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    truth_bucket: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    truth_count: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def add_fleet_batch(
        self, batch: FleetBatch, num_instances: int, data_per_instance: np.ndarray | None = None
    ) -> None:
        """``data_per_instance``: data messages sent per instance when they are not the fleet's
        messages (a prio3 device sends one report for all its messages)."""
        self.device_rounds += batch.device_rounds
        self.refusals += batch.refusals
        if data_per_instance is None:
            data_per_instance = np.bincount(batch.message_instance, minlength=num_instances)
        self.messages = _add_padded(self.messages, data_per_instance)
        self.presence = _add_padded(
            self.presence, np.bincount(batch.presence_instance, minlength=num_instances)
        )
        self._add_truth(batch.truth_window, batch.truth_bucket, batch.truth_count)

    def add_chaff(self, reports: list[ReportBatch], batch: FleetBatch, num_instances: int) -> None:
        """Sealed chaff per instance (simulators/sealing.py): each sealed ReportBatch's messages
        beyond the fleet batch's data and presence messages for its instance."""
        planned = np.bincount(batch.message_instance, minlength=num_instances) + np.bincount(
            batch.presence_instance, minlength=num_instances
        )
        sent = np.zeros(num_instances, dtype=np.int64)
        for report in reports:
            sent[report.shuffler_instance] += len(report)
        self.chaff = _add_padded(self.chaff, sent - planned)

    def merge(self, other: ShardSummary) -> ShardSummary:
        self.shards += other.shards
        self.respondents += other.respondents
        self.device_rounds += other.device_rounds
        self.refusals += other.refusals
        self.messages = _add_padded(self.messages, other.messages)
        self.presence = _add_padded(self.presence, other.presence)
        self.chaff = _add_padded(self.chaff, other.chaff)
        self._add_truth(other.truth_window, other.truth_bucket, other.truth_count)
        return self

    def _add_truth(self, window: np.ndarray, bucket: np.ndarray, count: np.ndarray) -> None:
        # One int64 key per (window, bucket): buckets stay below 2^40, windows below 2^23.
        keys = np.concatenate(
            [
                (self.truth_window << _BUCKET_BITS) | self.truth_bucket,
                (np.asarray(window, dtype=np.int64) << _BUCKET_BITS) | bucket,
            ]
        )
        counts = np.concatenate([self.truth_count, count])
        unique, inverse = np.unique(keys, return_inverse=True)
        self.truth_window = unique >> _BUCKET_BITS
        self.truth_bucket = unique & ((1 << _BUCKET_BITS) - 1)
        self.truth_count = np.bincount(inverse, weights=counts, minlength=unique.size).astype(
            np.int64
        )


def _add_padded(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    size = max(first.size, second.size)
    out = np.zeros(size, dtype=np.int64)
    out[: first.size] += first
    out[: second.size] += second
    return out

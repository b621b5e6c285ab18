"""The device side of ESA as Beam transforms: population shards in, batches of Report records out.

A simulation is a small, picklable :class:`SimulationPlan` (recipe JSON, population spec, seed,
fleet settings) cut into :class:`ShardSpec` descriptors (shard index, respondent range, a
``numpy.random.SeedSequence`` child of the master seed). A worker rebuilds recipe, population and
fleet once (:class:`ShardContext`), then per shard generates the population slice chunk by chunk,
runs the device fleet (``simulators.fleet``: verify, charge, randomize, fragment, presence, pick
instances, stamp origin and event time) and turns each chunk into one :class:`ReportBatch` per
shuffler instance (``schemas/report.avsc`` fields as columns). Only descriptors travel through
``beam.Create``; elements are batches, never single messages; no step holds the population.

* :class:`EncodeReports` yields the ``ReportBatch`` elements (and a :class:`ShardSummary` per
  shard on a tagged output) for pipelines that consume reports directly.
* :class:`WriteReportShards` writes them instead, one Avro file per shard and instance
  (``instance=<u>/reports-<shard>.avro``, named by shard index so a retried shard overwrites its
  own files), and yields the summaries; :class:`CombineShardSummaries` adds them up (true counts
  are summed sparsely, never held per respondent).

Report records are Avro-encoded with numpy (:func:`encode_report_records`: the same bytes
fastavro writes, checked by the tests with fastavro and the Apache reference library) and framed
by :class:`schemas.avro.container.ContainerWriter` (Avro 1.11 specification, "Object Container
Files"), because building one Python dict per message would cost more than everything else
together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas import REPORT, SCHEMA_VERSION, schema_json
from schemas.avro.container import ContainerWriter, check_codec
from schemas.avro.crc32c import crc32c_many
from schemas.avro.varint import encode_bytes, encode_long, varint_lengths, varint_matrix, zigzag
from schemas.payloads import EncodedPayloads, encode_message_batch
from schemas.recipes import Recipe, recipe_from_dict
from simulators.fleet import (
    DEFAULT_START_MS,
    DeviceFleet,
    FleetBatch,
    FleetConfig,
    device_policy_for,
    format_origins,
)
from simulators.populations import Population, PopulationContext, build_population
from transforms.sealed import sealing_for

DEFAULT_MESSAGES_PER_SHARD = 2_000_000
DEFAULT_MESSAGES_PER_CHUNK = 250_000
DEFAULT_CODEC = "deflate"
DEFAULT_COMPRESSION_LEVEL = 1
SUMMARY_TAG = "summary"
_PILOT_RESPONDENTS = 256
_BUCKET_BITS = 40

# ---------------------------------------------------------------------------------------------
# Report records as columns, and their Avro binary encoding (vectorized)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ReportBatch:
    """Report records (``schemas/report.avsc``) of one shuffler instance, as columns.

    ``origin`` holds fixed-width ASCII origin strings as an ``(n, w)`` uint8 array; ``payloads``
    the Avro-binary payloads (``schemas.payloads.EncodedPayloads``) and ``payload_crc32c`` their
    CRC32C. Fields that are the same for every record of a recipe are scalars.
    """

    shuffler_instance: int
    channel: str
    recipe_id: str
    min_crowd_size: int
    origin: np.ndarray
    event_time_ms: np.ndarray
    payloads: EncodedPayloads
    payload_crc32c: np.ndarray
    crowd_id: str | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        n = len(self.payloads)
        if self.origin.ndim != 2 or self.origin.shape[0] != n:
            raise ValueError(f"origin must be an (n, width) array for {n} records")
        if self.event_time_ms.shape != (n,) or self.payload_crc32c.shape != (n,):
            raise ValueError(f"event_time_ms and payload_crc32c must have {n} entries")

    def __len__(self) -> int:
        return len(self.payloads)

    def to_arrow(self) -> pa.RecordBatch:
        """The records as one Arrow RecordBatch, one column per Report field (Avro ``int`` as
        int32, ``long`` and timestamps as int64, ``bytes`` as binary), built without per-record
        Python."""
        n = len(self)
        width = self.origin.shape[1]
        origin = np.ascontiguousarray(self.origin).view(f"S{width}").ravel()
        columns = {
            "schema_version": pa.array(np.full(n, self.schema_version, np.int32)),
            "shuffler_instance": pa.array(np.full(n, self.shuffler_instance, np.int32)),
            "channel": _constant_strings(self.channel, n),
            "recipe_id": _constant_strings(self.recipe_id, n),
            "crowd_id": pa.nulls(n, pa.string())
            if self.crowd_id is None
            else _constant_strings(self.crowd_id, n),
            "min_crowd_size": pa.array(np.full(n, self.min_crowd_size, np.int32)),
            "origin": pa.array(origin, pa.binary(width)).cast(pa.binary()).cast(pa.string()),
            "event_time": pa.array(self.event_time_ms.astype(np.int64)),
            "payload": self.payloads.to_arrow().cast(pa.binary()),
            "payload_crc32c": pa.array(self.payload_crc32c.astype(np.int64)),
        }
        return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))

    def to_records(self) -> list[dict[str, Any]]:
        """The records as dicts (per-record Python: for tests and small batches only)."""
        origins = [row.tobytes().decode("ascii") for row in self.origin]
        return [
            {
                "schema_version": self.schema_version,
                "shuffler_instance": self.shuffler_instance,
                "channel": self.channel,
                "recipe_id": self.recipe_id,
                "crowd_id": self.crowd_id,
                "min_crowd_size": self.min_crowd_size,
                "origin": origin,
                "event_time": int(event_time),
                "payload": payload,
                "payload_crc32c": int(crc),
            }
            for origin, event_time, payload, crc in zip(
                origins,
                self.event_time_ms.tolist(),
                self.payloads.to_list(),
                self.payload_crc32c.tolist(),
                strict=True,
            )
        ]


def _constant_strings(text: str, n: int) -> pa.Array:
    """``n`` copies of ``text`` as an Arrow string array, from buffers."""
    data = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data * n))


def report_prefix(batch: ReportBatch) -> bytes:
    """The bytes every record of ``batch`` starts with: the fields before ``origin``."""
    crowd = b"\x00" if batch.crowd_id is None else b"\x02" + encode_bytes(batch.crowd_id)
    return (
        encode_long(batch.schema_version)
        + encode_long(batch.shuffler_instance)
        + encode_bytes(batch.channel)
        + encode_bytes(batch.recipe_id)
        + crowd
        + encode_long(batch.min_crowd_size)
    )


def encode_report_records(batch: ReportBatch) -> EncodedPayloads:
    """Avro binary of every record of ``batch`` (field order of ``report.avsc``), in one buffer.

    Vectorized over records: each field gets a fixed-width slot in an ``(n, width)`` byte matrix
    (constant fields one broadcast prefix, varints one column per byte position, payload bytes
    one masked assignment); a mask of the bytes in use then packs the rows into the records.
    """
    n = len(batch)
    origin_width = batch.origin.shape[1]
    head = np.frombuffer(report_prefix(batch) + encode_long(origin_width), dtype=np.uint8)
    payload_lengths = batch.payloads.lengths
    zigzagged = [
        zigzag(batch.event_time_ms),
        zigzag(payload_lengths),
        zigzag(batch.payload_crc32c.astype(np.int64)),
    ]
    lengths = [varint_lengths(z) for z in zigzagged]
    event_slot, length_slot, crc_slot = (
        varint_matrix(z, length) for z, length in zip(zigzagged, lengths, strict=True)
    )
    payload_width = int(payload_lengths.max(initial=0))
    slots = [
        (head.size, None),
        (origin_width, None),
        (event_slot.shape[1], lengths[0]),
        (length_slot.shape[1], lengths[1]),
        (payload_width, payload_lengths),
        (crc_slot.shape[1], lengths[2]),
    ]
    matrix = np.empty((n, sum(width for width, _ in slots)), dtype=np.uint8)
    used = np.ones(matrix.shape, dtype=bool)
    column = 0
    for (width, used_bytes), content in zip(
        slots, (head, batch.origin, event_slot, length_slot, None, crc_slot), strict=True
    ):
        region = slice(column, column + width)
        if used_bytes is not None:
            used[:, region] = np.arange(width) < used_bytes[:, None]
        if content is None:  # payload bytes fill their slot's used part in row-major order
            matrix[:, region][used[:, region]] = batch.payloads.data
        else:
            matrix[:, region] = content
        column += width
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(used.sum(axis=1), out=offsets[1:])
    return EncodedPayloads(matrix[used], offsets)


# ---------------------------------------------------------------------------------------------
# Plans, shards and the per-shard work (pure: no Beam)
# ---------------------------------------------------------------------------------------------


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
    # Sealed payloads (transforms/sealed.py): the analyzer's PUBLIC key file's JSON, or None.
    public_key_json: str | None = None

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
        # Validates the rest (rounds, start, window, weights) once, in the driver.
        self.fleet_config()

    @classmethod
    def for_recipe(
        cls, recipe: Recipe, population: str, seed: int, **settings: Any
    ) -> SimulationPlan:
        return cls(recipe_json=recipe.to_json(), population=population, seed=seed, **settings)

    def recipe(self) -> Recipe:
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
        markers)."""
        sequence = np.random.SeedSequence(self.entropy, spawn_key=(*self.spawn_key, stream))
        return np.random.Generator(np.random.PCG64DXSM(sequence))


class ShardContext:
    """What a worker builds once from a plan: recipe, population and device fleet."""

    def __init__(self, plan: SimulationPlan) -> None:
        self.plan = plan
        self.recipe = plan.recipe()
        self.randomizer = self.recipe.build_randomizer()
        self.fleet = DeviceFleet(
            self.recipe,
            policy=device_policy_for(
                self.recipe,
                budget_epsilon=plan.device_budget,
                runs=plan.rounds,
                query_class_fields=plan.query_class_fields,
            ),
            config=plan.fleet_config(),
        )
        self.sketch_width = getattr(self.randomizer, "width", None)
        self.sealing = sealing_for(self.recipe, plan.public_key_json, self.fleet.window_ms)

    @property
    def device_budget(self) -> float:
        """The cohort epsilon each device allows (the plan's, or exactly one per round)."""
        if self.plan.device_budget is not None:
            return float(self.plan.device_budget)
        return self.plan.rounds * float(self.recipe.epsilon_central_target)

    @cached_property
    def population(self) -> Population:
        randomizer = self.randomizer
        context = PopulationContext(
            domain_size=int(randomizer.domain_size),
            periods=getattr(randomizer, "periods", None) if self.fleet.longitudinal else None,
            max_changes=getattr(randomizer, "max_changes", None)
            if self.fleet.longitudinal
            else None,
        )
        population = build_population(
            self.plan.population, context, self.plan.respondents, self.plan.population_seed
        )
        if population.value_shape != self.fleet.value_shape:
            raise ValueError(
                f"population {self.plan.population!r} gives values of shape "
                f"{population.value_shape or 'scalar'} but recipe {self.recipe.id} needs "
                f"{self.fleet.value_shape or 'one category per respondent'}"
            )
        return population

    def messages_per_respondent(self) -> float:
        """Expected messages per device and round (data + presence), for sizing shards and chunks:
        the randomizer's own expectation, or a pilot run on the first respondents."""
        expected = getattr(self.randomizer, "expected_messages_per_respondent", None)
        data: float | None = None
        if callable(expected):
            try:
                data = float(expected())
            except TypeError:
                data = None
        if data is None:
            pilot = self.population.values(0, min(_PILOT_RESPONDENTS, self.population.size))
            batch = self.randomizer.randomize(pilot, np.random.default_rng(0))
            data = len(batch) / max(len(pilot), 1)
        presence = self.fleet.num_instances * self.fleet.periods_per_round
        return (data + presence) * self.plan.rounds

    def respondents_per_shard(self) -> int:
        return _respondents_for(self.plan.messages_per_shard, self.messages_per_respondent())

    def respondents_per_chunk(self) -> int:
        return _respondents_for(self.plan.messages_per_chunk, self.messages_per_respondent())

    def shards(self) -> list[ShardSpec]:
        return self.plan.shards(self.population.size, self.respondents_per_shard())

    def fleet_batches(self, shard: ShardSpec) -> Iterator[FleetBatch]:
        """The shard's devices, chunk by chunk (bounded memory), all from the shard's generator."""
        rng = shard.generator(0)
        step = self.respondents_per_chunk()
        for first in range(shard.start, shard.stop, step):
            last = min(shard.stop, first + step)
            yield self.fleet.run(self.population.values(first, last), first, rng)

    def report_batches(self, batch: FleetBatch) -> list[ReportBatch]:
        """One ReportBatch per shuffler instance: its data messages, then its presence messages."""
        batches = report_batches_for(
            batch,
            self.recipe,
            self.randomizer.payload_kind,
            self.fleet.num_instances,
            self.sketch_width,
        )
        if self.sealing is not None:  # -- sealed payloads and chaff (transforms/sealed.py) --
            batches = [self.sealing.seal_batch(report_batch) for report_batch in batches]
        return batches


def _respondents_for(messages: int, per_respondent: float) -> int:
    return max(1, int(messages // max(per_respondent, 1e-9)))


class _Columns:
    """MessageBatch-like view with reordered columns (payload encoding needs no sort order)."""

    def __init__(self, batch: Any, order: np.ndarray) -> None:
        self.bucket = batch.bucket[order]
        self.sign = batch.sign[order]
        self.fragment = batch.fragment[order]
        self.period = batch.period[order]


def _payload_slice(payloads: EncodedPayloads, first: int, last: int) -> EncodedPayloads:
    offsets = payloads.offsets[first : last + 1]
    return EncodedPayloads(payloads.data[offsets[0] : offsets[-1]], offsets - offsets[0])


def _concat_payloads(first: EncodedPayloads, second: EncodedPayloads) -> EncodedPayloads:
    data = np.concatenate([first.data, second.data])
    offsets = np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]])
    return EncodedPayloads(data, offsets)


def presence_payloads(count: int) -> EncodedPayloads:
    """``count`` presence payloads: zero bytes each (their CRC32C is 0). A presence message is a
    normal Report with an empty payload; the shuffler counts its origin as a respondent of the
    crowd and never releases it."""
    return EncodedPayloads(np.zeros(0, dtype=np.uint8), np.zeros(count + 1, dtype=np.int64))


def report_batches_for(
    batch: FleetBatch,
    recipe: Any,
    payload_kind: str,
    num_instances: int,
    sketch_width: int | None = None,
) -> list[ReportBatch]:
    """Split a fleet batch by shuffler instance and encode its payloads (vectorized)."""
    order = np.argsort(batch.message_instance, kind="stable")
    payloads = encode_message_batch(_Columns(batch.messages, order), payload_kind, sketch_width)
    crcs = crc32c_many(payloads)
    bounds = np.searchsorted(batch.message_instance[order], np.arange(num_instances + 1))
    presence_order = np.argsort(batch.presence_instance, kind="stable")
    presence_bounds = np.searchsorted(
        batch.presence_instance[presence_order], np.arange(num_instances + 1)
    )
    message_origin = batch.message_origin[order]
    message_time = batch.message_event_ms[order]
    presence_origin = batch.presence_origin[presence_order]
    presence_time = batch.presence_event_ms[presence_order]
    out = []
    for instance in range(num_instances):
        lo, hi = int(bounds[instance]), int(bounds[instance + 1])
        plo, phi = int(presence_bounds[instance]), int(presence_bounds[instance + 1])
        presence_count = phi - plo
        out.append(
            ReportBatch(
                shuffler_instance=instance,
                channel=recipe.channel,
                recipe_id=recipe.id,
                min_crowd_size=int(recipe.min_crowd_size),
                origin=format_origins(
                    np.concatenate([message_origin[lo:hi], presence_origin[plo:phi]])
                ),
                event_time_ms=np.concatenate([message_time[lo:hi], presence_time[plo:phi]]),
                payloads=_concat_payloads(
                    _payload_slice(payloads, lo, hi), presence_payloads(presence_count)
                ),
                payload_crc32c=np.concatenate(
                    [crcs[lo:hi], np.zeros(presence_count, dtype=np.uint32)]
                ),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Shard summaries (what the pipeline adds up)
# ---------------------------------------------------------------------------------------------


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

    def add_fleet_batch(self, batch: FleetBatch, num_instances: int) -> None:
        self.device_rounds += batch.device_rounds
        self.refusals += batch.refusals
        self.messages = _add_padded(
            self.messages, np.bincount(batch.message_instance, minlength=num_instances)
        )
        self.presence = _add_padded(
            self.presence, np.bincount(batch.presence_instance, minlength=num_instances)
        )
        self._add_truth(batch.truth_window, batch.truth_bucket, batch.truth_count)

    def add_chaff(self, reports: list[ReportBatch], batch: FleetBatch, num_instances: int) -> None:
        """Sealed chaff per instance (transforms/sealed.py): each sealed ReportBatch's messages
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


def simulate_shard(
    context: ShardContext, shard: ShardSpec
) -> Iterator[tuple[int, list[ReportBatch]] | ShardSummary]:
    """The pure core of a shard: ``(chunk index, report batches)`` per chunk, then its summary."""
    summary = ShardSummary(shards=1, respondents=shard.respondents)
    for chunk, batch in enumerate(context.fleet_batches(shard)):
        summary.add_fleet_batch(batch, context.fleet.num_instances)
        reports = context.report_batches(batch)
        if context.sealing is not None:  # sealed chaff: what each instance got beyond the plan
            summary.add_chaff(reports, batch, context.fleet.num_instances)
        yield chunk, reports
    yield summary


def shard_file_name(instance: int, shard: int) -> str:
    """Relative path of a shard's file for one instance: instance=<u>/reports-<shard>.avro."""
    return f"instance={instance}/reports-{shard:05d}.avro"


def write_shard(context: ShardContext, shard: ShardSpec, output_dir: str) -> ShardSummary:
    """Simulate one shard and write its Avro file per instance (overwriting a previous attempt)."""
    sync_rng = shard.generator(1)
    schema = schema_json(REPORT)
    sinks: list[Any] = []
    writers = []
    try:
        for instance in range(context.fleet.num_instances):
            path = FileSystems.join(output_dir, shard_file_name(instance, shard.index))
            sink = FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
            sinks.append(sink)
            writers.append(
                ContainerWriter(
                    sink,
                    schema,
                    codec=context.plan.codec,
                    sync_marker=sync_rng.bytes(16),
                    compression_level=context.plan.compression_level,
                )
            )
        summary = ShardSummary()
        for item in simulate_shard(context, shard):
            if isinstance(item, ShardSummary):
                summary = item
                continue
            for batch in item[1]:
                writers[batch.shuffler_instance].write(encode_report_records(batch))
    finally:
        for sink in sinks:
            sink.close()
    return summary


# ---------------------------------------------------------------------------------------------
# Beam transforms
# ---------------------------------------------------------------------------------------------


class _ShardFn(beam.DoFn):
    def __init__(self, plan: SimulationPlan) -> None:
        self._plan = plan
        self._context: ShardContext | None = None

    def setup(self) -> None:
        self._context = ShardContext(self._plan)

    def _counters(self, summary: ShardSummary) -> None:
        namespace = "esa.simulate"
        beam.metrics.Metrics.counter(namespace, "respondents").inc(summary.respondents)
        beam.metrics.Metrics.counter(namespace, "refusals").inc(summary.refusals)
        beam.metrics.Metrics.counter(namespace, "messages").inc(int(summary.messages.sum()))
        beam.metrics.Metrics.counter(namespace, "presence_messages").inc(
            int(summary.presence.sum())
        )


class _EncodeShardFn(_ShardFn):
    def process(self, shard: ShardSpec) -> Iterator[Any]:
        assert self._context is not None
        for item in simulate_shard(self._context, shard):
            if isinstance(item, ShardSummary):
                self._counters(item)
                yield beam.pvalue.TaggedOutput(SUMMARY_TAG, item)
            else:
                yield from item[1]


class _WriteShardFn(_ShardFn):
    def __init__(self, plan: SimulationPlan, output_dir: str) -> None:
        super().__init__(plan)
        self._output_dir = output_dir

    def process(self, shard: ShardSpec) -> Iterator[ShardSummary]:
        assert self._context is not None
        summary = write_shard(self._context, shard, self._output_dir)
        self._counters(summary)
        yield summary


class EncodeReports(beam.PTransform):
    """Shard descriptors -> ``ReportBatch`` elements (main output) and one ``ShardSummary`` per
    shard (output tag ``"summary"``)."""

    def __init__(self, plan: SimulationPlan) -> None:
        super().__init__()
        self._plan = plan

    def expand(self, shards: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return (
            shards
            | "Spread shards" >> beam.Reshuffle()  # breaks fusion with Create so shards spread
            | "Encode shards"
            >> beam.ParDo(_EncodeShardFn(self._plan)).with_outputs(SUMMARY_TAG, main="reports")
        )


class WriteReportShards(beam.PTransform):
    """Shard descriptors -> Avro files under ``output_dir`` and one ``ShardSummary`` per shard."""

    def __init__(self, plan: SimulationPlan, output_dir: str) -> None:
        super().__init__()
        self._plan = plan
        self._output_dir = output_dir

    def expand(self, shards: beam.PCollection) -> beam.PCollection:
        return (
            shards
            | "Spread shards" >> beam.Reshuffle()  # breaks fusion with Create so shards spread
            | "Write shards" >> beam.ParDo(_WriteShardFn(self._plan, self._output_dir))
        )


class CombineShardSummaries(beam.CombineFn):
    """Adds ShardSummary elements (sparse true counts merged with ``np.unique``)."""

    def create_accumulator(self) -> ShardSummary:
        return ShardSummary()

    def add_input(self, accumulator: ShardSummary, summary: ShardSummary) -> ShardSummary:
        return accumulator.merge(summary)

    def merge_accumulators(self, accumulators: Any) -> ShardSummary:
        merged = ShardSummary()
        for accumulator in accumulators:
            merged.merge(accumulator)
        return merged

    def extract_output(self, accumulator: ShardSummary) -> ShardSummary:
        return accumulator

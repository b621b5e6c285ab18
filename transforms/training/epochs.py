"""LDP-SGD as Beam transforms: the devices' epoch (Algorithm 4) and the server's (Algorithm 5).

* :class:`WriteEpochReports`: device shards in (``simulators.sgd_devices.DeviceShard``), Report
  Avro files out (``instance=<u>/reports-<shard>.avro``, one file per shard and instance, named by
  shard so a retried shard overwrites its own files), and per-shard counts. Each shard computes
  its devices' gradients at theta_t, clips and randomizes them (seed + sign payloads,
  ``schemas.ldp_sgd``) in numpy.
* :class:`CommittedMessageFiles`: the verified commit records of one epoch's releases in
  (``(instance, release directory, SHA-256 of its verified _COMMIT.json)``), the message files
  they commit out: the analyzer's pinned reader (``transforms.analyzer.aggregate.pinned_message_paths``),
  which re-reads each record on the worker and refuses one whose SHA-256 is not the verified
  one, so the server reads exactly the committed files (no glob, no file the record omits).
* :class:`AggregateEpoch`: released ShuffledMessage files in (every shuffler instance of one
  epoch), one :class:`EpochUpdate` out: each batch of messages is checked (recipe, channel,
  CRC32C, payload format), its directions regenerated from the seeds in numpy blocks and summed;
  a CombineFn adds the partial sums; the last step applies Algorithm 5 (scale, learning rate,
  projection onto C). Messages that fail a check are counted by reason and, given a directory,
  written as dead letters (one file per released file), never dropped silently:
  ``read = used + rejected``.

Sealed reports (issue 12, ``transforms/analyzer/opening.py``): given the analyzer's public key, devices
seal each payload (padded to ``SGD_PAD_LENGTH``) bound to the epoch's recipe id, channel and
window (:func:`epoch_window`); given the key ring's path, the server opens them first (sealing
reasons such as ``sealed_open_failed`` are rejections like the others). Without a ring the server
refuses sealed payloads (``sealed_without_key_ring``).

Only shard descriptors and file paths travel through ``beam.Create``; elements are arrays.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from privacy.ldp_sgd import LdpSgdRandomizer, server_step
from schemas import (
    DEAD_LETTER,
    REPORT,
    SCHEMA_VERSION,
    SHUFFLED_MESSAGE,
    parsed_schema,
    schema_json,
)
from schemas.avro.crc32c import crc32c_many
from schemas.crypto.analyzer_keys import KeyRing
from schemas.dead_letters import dead_letter
from schemas.ldp_sgd import PAYLOAD_BYTES, SgdChannel, decode_sgd_payloads, encode_sgd_payloads
from simulators.sgd_data import DeviceData, load_device_data
from simulators.sgd_devices import DeviceShard, EpochPlan, shard_reports
from transforms.analyzer.aggregate import pinned_message_paths
from transforms.analyzer.opening import ReleaseOpener, open_in_window, seal_fixed
from transforms.common.avro_io import ColumnBatch, read_avro_batches, write_avro, write_avro_columns

__all__ = [
    "WriteEpochReports",
    "CommittedMessageFiles",
    "AggregateEpoch",
    "EpochUpdate",
    "SumDirections",
    "DirectionSum",
    "check_and_sum",
    "decode_batch",
    "dead_letter_file_name",
    "report_file_name",
    "epoch_window",
    "SGD_PAD_LENGTH",
]

# esa train's shufflers use their default one-day window; every SGD payload has PAYLOAD_BYTES.
WINDOW_MS = 86_400_000
SGD_PAD_LENGTH = 1 + PAYLOAD_BYTES  # schemas.crypto.sealing.pad: a length byte, then the payload


def epoch_window(event_time_ms: int) -> tuple[int, int]:
    """The shuffler window of an epoch's reports (what sealing binds them to)."""
    start = int(event_time_ms) // WINDOW_MS * WINDOW_MS
    return start, start + WINDOW_MS


METRICS_NAMESPACE = "esa.train"
WRONG_RECIPE = "wrong_recipe"
BAD_CRC = "bad_crc32c"


def report_file_name(instance: int, shard: int) -> str:
    return os.path.join(f"instance={instance}", f"reports-{shard:05d}.avro")


_DATA_CACHE: dict[tuple[str, int], DeviceData] = {}


def _device_data(dataset: str, data_seed: int) -> DeviceData:
    """The dataset once per worker process (digits is read from the scikit-learn wheel)."""
    key = (dataset, data_seed)
    if key not in _DATA_CACHE:
        _DATA_CACHE[key] = load_device_data(dataset, data_seed)
    return _DATA_CACHE[key]


class _WriteShardFn(beam.DoFn):
    def __init__(
        self,
        dataset: str,
        data_seed: int,
        plan: EpochPlan,
        channel: SgdChannel,
        theta: np.ndarray,
        output_dir: str,
        event_time_ms: int,
        public_key_json: str | None = None,
    ) -> None:
        self._public_key_json = public_key_json  # sealed payloads: the analyzer's PUBLIC key
        self._dataset = dataset
        self._data_seed = data_seed
        self._plan = plan
        self._channel = channel
        self._theta = np.asarray(theta, dtype=np.float64)
        self._output_dir = output_dir
        self._event_time_ms = event_time_ms
        self._reports = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "reports_written")

    def process(self, shard: DeviceShard) -> Iterator[dict[str, int]]:
        data = _device_data(self._dataset, self._data_seed)
        reports = shard_reports(data, self._plan, self._theta, shard)
        schema = schema_json(REPORT)
        counts: dict[str, int] = {"devices": shard.stop - shard.start, "reports": len(reports)}
        # One file per instance even when empty, so that a retried shard overwrites every file
        # of its first attempt (with CSPRNG randomness the retry's instance choices differ).
        for instance in range(self._plan.instances):
            rows = np.flatnonzero(reports.instance == instance)
            payloads = encode_sgd_payloads(reports.seeds[rows], reports.signs[rows])
            if self._public_key_json is not None:
                payloads = seal_fixed(
                    self._public_key_json, payloads, SGD_PAD_LENGTH, self._channel.recipe_id,
                    self._channel.channel, epoch_window(self._event_time_ms),
                )  # fmt: skip
            origins = pa.array(np.char.mod("device-%09d", reports.device[rows]).tolist())
            columns = {
                "schema_version": SCHEMA_VERSION,
                "shuffler_instance": instance,
                "channel": self._channel.channel,
                "recipe_id": self._channel.recipe_id,
                "crowd_id": None,
                "min_crowd_size": self._channel.min_crowd_size,
                "origin": origins,
                "event_time": self._event_time_ms,
                "payload": payloads,
                "payload_crc32c": crc32c_many(payloads).astype(np.int64),
            }
            path = FileSystems.join(self._output_dir, report_file_name(instance, shard.index))
            write_avro_columns(path, schema, columns, int(rows.size), codec="deflate")
            counts[f"instance_{instance}"] = int(rows.size)
        self._reports.inc(len(reports))
        yield counts


class WriteEpochReports(beam.PTransform):
    """DeviceShard -> Report files of one epoch under ``output_dir``; yields per-shard counts."""

    def __init__(
        self,
        dataset: str,
        data_seed: int,
        plan: EpochPlan,
        channel: SgdChannel,
        theta: np.ndarray,
        output_dir: str,
        event_time_ms: int,
        public_key_json: str | None = None,
    ) -> None:
        super().__init__()
        self._fn = _WriteShardFn(
            dataset, data_seed, plan, channel, theta, output_dir, event_time_ms, public_key_json
        )

    def expand(self, shards: beam.PCollection) -> beam.PCollection:
        return shards | "EncodeShards" >> beam.ParDo(self._fn)


class CommittedMessageFiles(beam.PTransform):
    """Verified commit records ``(instance, directory, SHA-256)`` -> the paths of the message
    files each commits (never its crowd tables), spread over workers. A record changed since it
    was verified fails the pipeline (``ValueError`` from the pinned read)."""

    def expand(self, commits: beam.PCollection) -> beam.PCollection:
        return (
            commits
            | "CommittedFiles" >> beam.FlatMap(pinned_message_paths)
            | "SpreadFiles" >> beam.Reshuffle()
        )


@dataclass
class DirectionSum:
    """sum_i sign_i v_i over the reports used, their count, and rejections by reason."""

    total: np.ndarray
    reports: int = 0
    read: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    unknown_chunks: int = 0

    def add(self, other: DirectionSum) -> DirectionSum:
        self.total = self.total + other.total
        self.reports += other.reports
        self.read += other.read
        self.unknown_chunks += other.unknown_chunks
        for reason, count in other.rejected.items():
            self.rejected[reason] = self.rejected.get(reason, 0) + count
        return self


def _reject(rejected: dict[str, int], reason: str, count: int) -> None:
    if count:
        rejected[reason] = rejected.get(reason, 0) + int(count)


def check_and_sum(
    columns: pa.RecordBatch, channel: SgdChannel, randomizer: LdpSgdRandomizer
) -> tuple[DirectionSum, list[tuple[int, str]]]:
    """Check and sum one batch of ShuffledMessage columns (see module doc); also returns each
    rejected row with its reason."""
    rows = columns.num_rows
    rejected: dict[str, int] = {}
    recipe = np.asarray(columns.column("recipe_id").to_numpy(zero_copy_only=False))
    channel_names = np.asarray(columns.column("channel").to_numpy(zero_copy_only=False))
    ours = (recipe == channel.recipe_id) & (channel_names == channel.channel)
    ours_rows = np.flatnonzero(ours)
    bad: list[tuple[int, str]] = [(int(r), WRONG_RECIPE) for r in np.flatnonzero(~ours)]
    payloads = columns.column("payload").filter(pa.array(ours))
    stated = columns.column("payload_crc32c").filter(pa.array(ours)).to_numpy()
    crc_ok = crc32c_many(payloads).astype(np.int64) == stated
    bad += [(int(r), BAD_CRC) for r in ours_rows[~crc_ok]]
    decoded = decode_sgd_payloads(payloads.filter(pa.array(crc_ok)))
    checked_rows = ours_rows[crc_ok]
    bad += [
        (int(checked_rows[r]), reason)
        for r, reason in zip(decoded.rejected_rows, decoded.rejected_reasons, strict=True)
    ]
    for _, reason in bad:
        _reject(rejected, reason, 1)
    total = randomizer.decode_sum(decoded.seeds, decoded.signs)
    return DirectionSum(total, int(decoded.signs.shape[0]), rows, rejected), sorted(bad)


def decode_batch(
    columns: pa.RecordBatch, channel: SgdChannel, randomizer: LdpSgdRandomizer
) -> DirectionSum:
    """:func:`check_and_sum` without the rejected rows."""
    return check_and_sum(columns, channel, randomizer)[0]


# The fields the server reads. A file whose writer schema does not resolve to them (a released
# ShuffledMessage file does; so does a Report file) is one schema_mismatch chunk, dead-lettered.
SERVER_READ_SCHEMA = {
    "type": "record",
    "name": "ShuffledMessage",
    "namespace": "esa",
    "fields": [
        field
        for field in schema_json(SHUFFLED_MESSAGE)["fields"]
        if field["name"] in ("channel", "recipe_id", "payload", "payload_crc32c")
    ],
}


def dead_letter_file_name(path: str) -> str:
    """One dead-letter file per released file, named from its path (a retry overwrites it)."""
    return hashlib.sha256(path.encode()).hexdigest()[:20] + ".avro"


class _DecodeFileFn(beam.DoFn):
    def __init__(
        self,
        channel: SgdChannel,
        randomizer: LdpSgdRandomizer,
        dead_letter_dir: str | None,
        key_ring: str | None = None,
        window: tuple[int, int] = (0, WINDOW_MS),
    ) -> None:
        self._key_ring = key_ring  # the key ring's PATH, read on the worker, never key bytes
        self._window = window
        self._opener: ReleaseOpener | None = None
        self._channel = channel
        self._randomizer = randomizer
        self._dead_letter_dir = dead_letter_dir
        self._used = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "reports_used")
        self._rejected = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rejected")

    def setup(self) -> None:
        ring = KeyRing.load(self._key_ring) if self._key_ring else None
        self._opener = ReleaseOpener(ring, {}, {self._channel.recipe_id: SGD_PAD_LENGTH})

    def _open_and_sum(self, columns: pa.RecordBatch) -> tuple[DirectionSum, list[tuple[int, str]]]:
        """Open sealed payloads (transforms/analyzer/opening.py), then :func:`check_and_sum`; rows are
        positions in ``columns``."""
        assert self._opener is not None
        opened = open_in_window(self._opener, columns, self._window)
        part, bad = check_and_sum(opened.columns, self._channel, self._randomizer)
        bad = [(int(opened.kept_rows[row]), reason) for row, reason in bad]
        bad += zip(opened.rejected_rows.tolist(), opened.rejected_reasons, strict=True)
        part.read += columns.num_rows - opened.columns.num_rows
        for _, reason in bad[len(bad) - opened.rejected_rows.size :]:
            _reject(part.rejected, reason, 1)
        _reject(part.rejected, "chaff", opened.counts.get("chaff", 0))  # no device sends any
        return part, sorted(bad)

    def process(self, path: str) -> Iterator[DirectionSum]:
        letters: list[dict[str, object]] = []
        for item in read_avro_batches(path, 20_000, SERVER_READ_SCHEMA):
            if isinstance(item, ColumnBatch):
                part, bad = self._open_and_sum(item.columns)
                payloads = item.columns.column("payload")
                for row, reason in bad:
                    letters.append(
                        dead_letter(
                            "train.server",
                            reason,
                            f"message not used by the epoch {self._channel.epoch} server",
                            f"{path}@record {item.first_record + row}",
                            original_bytes=payloads[row].as_py(),
                        )
                    )
            else:
                # An unreadable chunk's records are read and rejected; a chunk of unknown records
                # is counted apart (the balance in records cannot be claimed then).
                zero = np.zeros(self._randomizer.dimension)
                if item.records is None:
                    part = DirectionSum(zero, unknown_chunks=1)
                else:
                    part = DirectionSum(zero, 0, item.records, {item.reason: item.records})
                letters.append(item.dead_letter("train.server"))
            self._used.inc(part.reports)
            self._rejected.inc(sum(part.rejected.values()))
            yield part
        if letters and self._dead_letter_dir is not None:
            target = FileSystems.join(self._dead_letter_dir, dead_letter_file_name(path))
            write_avro(target, parsed_schema(DEAD_LETTER), letters)


class SumDirections(beam.CombineFn):
    """Adds :class:`DirectionSum` parts (commutative and associative: any bundle order)."""

    def __init__(self, dimension: int) -> None:
        self._dimension = dimension

    def create_accumulator(self) -> DirectionSum:
        return DirectionSum(np.zeros(self._dimension))

    def add_input(self, accumulator: DirectionSum, part: DirectionSum) -> DirectionSum:
        return accumulator.add(part)

    def merge_accumulators(self, accumulators: Iterable[DirectionSum]) -> DirectionSum:
        total = self.create_accumulator()
        for accumulator in accumulators:
            total.add(accumulator)
        return total

    def extract_output(self, accumulator: DirectionSum) -> DirectionSum:
        return accumulator


@dataclass(frozen=True)
class EpochUpdate:
    """Algorithm 5's step for one epoch: theta_{t+1} and what went into it."""

    epoch: int
    theta: np.ndarray
    reports: int
    read: int
    rejected: Mapping[str, int]
    learning_rate: float
    gradient_norm: float
    unknown_chunks: int = 0

    @property
    def adds_up(self) -> bool:
        """read = used + rejected, in records, with no unreadable chunk of unknown records."""
        return self.read == self.reports + sum(self.rejected.values()) and not self.unknown_chunks


def _update(
    parts: DirectionSum,
    theta: np.ndarray,
    epoch: int,
    randomizer: LdpSgdRandomizer,
    radius: float,
    rate_scale: float = 1.0,
) -> EpochUpdate:
    if parts.reports == 0:
        # Nothing released (e.g. every crowd withheld): the model stays where it is.
        return EpochUpdate(
            epoch, theta, 0, parts.read, dict(parts.rejected), 0.0, 0.0, parts.unknown_chunks
        )
    theta_next, eta, norm = server_step(
        theta, parts.total, parts.reports, epoch, randomizer, radius, rate_scale
    )
    return EpochUpdate(
        epoch,
        theta_next,
        parts.reports,
        parts.read,
        dict(parts.rejected),
        eta,
        norm,
        parts.unknown_chunks,
    )


class AggregateEpoch(beam.PTransform):
    """Released message file paths -> one :class:`EpochUpdate` (Algorithm 5, steps 4-6)."""

    def __init__(
        self,
        channel: SgdChannel,
        randomizer: LdpSgdRandomizer,
        theta: np.ndarray,
        radius: float,
        dead_letter_dir: str | None = None,
        key_ring: str | None = None,
        event_time_ms: int = 0,
        rate_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self._rate_scale = float(rate_scale)
        self._key_ring = key_ring  # sealed payloads: the key ring's path
        self._window = epoch_window(event_time_ms)
        self._channel = channel
        self._randomizer = randomizer
        self._theta = np.asarray(theta, dtype=np.float64)
        self._radius = float(radius)
        self._dead_letter_dir = dead_letter_dir

    def expand(self, paths: beam.PCollection) -> beam.PCollection:
        return (
            paths
            | "DecodeAndSum"
            >> beam.ParDo(
                _DecodeFileFn(
                    self._channel,
                    self._randomizer,
                    self._dead_letter_dir,
                    key_ring=self._key_ring,
                    window=self._window,
                )
            )
            | "AddUp" >> beam.CombineGlobally(SumDirections(self._randomizer.dimension))
            | "Update"
            >> beam.Map(
                _update,
                theta=self._theta,
                epoch=self._channel.epoch,
                randomizer=self._randomizer,
                radius=self._radius,
                rate_scale=self._rate_scale,
            )
        )

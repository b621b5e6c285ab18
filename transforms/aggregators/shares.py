"""What an aggregator does with its shares, without Beam (samplable-anonymous-aggregation §4.4.1).

Aggregator ``j`` of a prio3 recipe reads the shuffled messages, opens only its own input share of
each report (``schemas.crypto.prio3_reports``) and runs the two-phase Prio3 verification
(``schemas.crypto.vdaf``, draft 18):

1. :class:`ShareOpener` (phase 1): per batch of released messages, checks recipe, channel and
   CRC32C, opens its share and computes its verification state and verifier share; every message
   it cannot use is a rejection with a reason (:data:`REASONS`).
2. :func:`finish_report` (phase 2): with both aggregators' verifier shares of a report, decides
   the proof; a report whose shares are not of a valid vector is rejected, never counted.
3. :class:`AggregateShareAccumulator`: the output shares of one window and crowd summed into this
   aggregator's aggregate share, with the number of reports and their report-id checksum, which
   both aggregators must state alike before either publishes.

Only aggregator ``j``'s key ring and the shared verify key are read (in ``setup``, from paths);
one aggregator's share alone is uniformly random and says nothing about any report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from schemas.avro.crc32c import crc32c_many
from schemas.crypto.analyzer_keys import KeyRing
from schemas.crypto.prio3_reports import (
    OK,
    SHARE_REASONS,
    add_checksums,
    layout_of,
    open_shares,
    parse_reports,
    report_id_checksum,
)
from schemas.crypto.vdaf import SHARES, Prio3, VdafError
from schemas.crypto.verify_keys import load_verify_key
from schemas.recipes import Recipe, recipe_from_dict

__all__ = [
    "REASONS",
    "CrowdKey",
    "AggregatorSpec",
    "OpenedReport",
    "OpenedBatch",
    "ShareOpener",
    "deduplicate",
    "summary_line",
    "finish_report",
    "AggregateShareAccumulator",
]

# Every reason a report is not counted by an aggregator (dead letters), beyond SHARE_REASONS.
REASONS = (
    *SHARE_REASONS[1:],
    "prio3_other_recipe",  # released under another recipe or channel than this aggregator's
    "crc32c_mismatch",  # the payload is not what its CRC32C says
    "prio3_bad_share",  # the opened share does not decode (wrong length, out-of-field element)
    "replayed_report",  # a second copy of a report id already counted in this batch
    "report_id_reused",  # two different reports with one report id: none is counted
    "missing_verifier_share",  # the other aggregator never initialized this report
    "prio3_invalid",  # the proof does not verify: shares of a vector that is not a valid report
    "peer_only_report",  # phase 2: the other aggregator initialized a report this one did not
)


class CrowdKey(NamedTuple):
    """One window and crowd of one recipe: the unit an aggregate share covers."""

    window_start: int
    window_end: int
    crowd_id: str | None


@dataclass(frozen=True)
class AggregatorSpec:
    """What an aggregator's workers need, picklable: its index, the recipe and PATHS only (key
    bytes never enter the job graph)."""

    agg_id: int
    recipe_json: str
    key_ring: str
    verify_key: str

    def __post_init__(self) -> None:
        if self.agg_id not in range(SHARES):
            raise ValueError(f"aggregator must be 0 or 1, got {self.agg_id!r}")

    def recipe(self) -> Recipe:
        return recipe_from_dict(json.loads(self.recipe_json), source="aggregator recipe")


class OpenedReport(NamedTuple):
    """Phase 1's result for one report: this aggregator's verifier share and state."""

    key: CrowdKey
    report_id: bytes
    verifier_share: bytes
    state: bytes


@dataclass
class OpenedBatch:
    reports: list[OpenedReport]
    rejected_rows: list[int]
    rejected_reasons: list[str]


def _int_column(batch: pa.RecordBatch, name: str) -> np.ndarray:
    return np.asarray(batch.column(name).cast(pa.int64()).to_numpy(zero_copy_only=False))


class ShareOpener:
    """Phase 1 of aggregator ``spec.agg_id`` on column batches of ShuffledMessage records."""

    def __init__(self, spec: AggregatorSpec) -> None:
        self.agg_id = spec.agg_id
        self.recipe = spec.recipe()
        self.vdaf: Prio3 = self.recipe.build_vdaf()
        self.layout = layout_of(self.vdaf)
        self.ring = KeyRing.load(spec.key_ring)
        self.verify_key = load_verify_key(spec.verify_key)

    def open_batch(self, batch: pa.RecordBatch) -> OpenedBatch:
        n = batch.num_rows
        reasons: list[str | None] = [None] * n
        recipe_ids = batch.column("recipe_id").to_pylist()
        channels = batch.column("channel").to_pylist()
        payloads = batch.column("payload").to_pylist()
        declared = _int_column(batch, "payload_crc32c")
        computed = crc32c_many(batch.column("payload")).astype(np.int64)
        starts, ends = _int_column(batch, "window_start"), _int_column(batch, "window_end")
        crowds = batch.column("crowd_id").to_pylist()
        groups: dict[CrowdKey, list[int]] = {}
        for row in range(n):
            if recipe_ids[row] != self.recipe.id or channels[row] != self.recipe.channel:
                reasons[row] = "prio3_other_recipe"
            elif declared[row] != computed[row]:
                reasons[row] = "crc32c_mismatch"
            else:
                key = CrowdKey(int(starts[row]), int(ends[row]), crowds[row])
                groups.setdefault(key, []).append(row)
        reports: list[OpenedReport] = []
        for key, rows in groups.items():
            parsed = parse_reports([payloads[r] for r in rows], self.layout, self.agg_id)
            shares, status = open_shares(
                self.ring,
                self.agg_id,
                parsed,
                self.recipe.id,
                self.recipe.channel,
                key.window_start,
                key.window_end,
                key.crowd_id,
            )
            for index, row in enumerate(rows):
                if status[index] != OK:
                    reasons[row] = SHARE_REASONS[int(status[index])]
                    continue
                report_id = parsed.report_ids[index]
                try:
                    state, verifier_share = self.vdaf.verify_init(
                        self.verify_key,
                        self.agg_id,
                        report_id,
                        parsed.public_shares[index],
                        shares[index],
                    )
                except VdafError:
                    reasons[row] = "prio3_bad_share"
                    continue
                reports.append(OpenedReport(key, report_id, verifier_share, state))
        rejected = [row for row in range(n) if reasons[row] is not None]
        return OpenedBatch(reports, rejected, [str(reasons[row]) for row in rejected])


def deduplicate(copies: Sequence[OpenedReport]) -> tuple[OpenedReport | None, list[str]]:
    """All copies of one report id in one window and crowd: the report counted (or None) and a
    reason for every copy not counted. Identical copies (a replay) count once; copies that
    differ are all refused, since no aggregator can tell which one the device sent."""
    if len(copies) == 1:
        return copies[0], []
    if len({copy.verifier_share for copy in copies}) == 1:
        return copies[0], ["replayed_report"] * (len(copies) - 1)
    return None, ["report_id_reused"] * len(copies)


def finish_report(
    vdaf: Prio3, agg_id: int, state: bytes, verifier_shares: Sequence[bytes | None]
) -> tuple[bytes | None, str, str]:
    """Phase 2 of one report: (output share or None, reason, detail)."""
    if any(share is None for share in verifier_shares):
        return None, "missing_verifier_share", "a verifier share of this report is missing"
    try:
        return vdaf.verify_finish(agg_id, state, list(verifier_shares)), "", ""
    except VdafError as error:
        return None, "prio3_invalid", str(error)


@dataclass
class AggregateShareAccumulator:
    """Output shares of one crowd summed in batches of ``flush_at`` (a CombineFn accumulator)."""

    pending: list[bytes] = field(default_factory=list)
    total: bytes | None = None
    reports: int = 0
    checksum: int = 0
    flush_at: int = 512

    def add(self, vdaf: Prio3, report_id: bytes, output_share: bytes) -> None:
        self.pending.append(output_share)
        self.reports += 1
        self.checksum = add_checksums(self.checksum, report_id_checksum([report_id]))
        if len(self.pending) >= self.flush_at:
            self.flush(vdaf)

    def flush(self, vdaf: Prio3) -> None:
        if self.pending:
            parts = [vdaf.aggregate(self.pending)]
            if self.total is not None:
                parts.append(self.total)
            self.total = vdaf.merge(parts)
            self.pending = []

    def merge(self, vdaf: Prio3, others: Iterator[AggregateShareAccumulator]) -> None:
        for other in others:
            other.flush(vdaf)
            self.flush(vdaf)
            if other.total is not None:
                self.total = (
                    other.total if self.total is None else vdaf.merge([self.total, other.total])
                )
            self.reports += other.reports
            self.checksum = add_checksums(self.checksum, other.checksum)

    def share(self, vdaf: Prio3) -> bytes:
        self.flush(vdaf)
        return self.total if self.total is not None else vdaf.aggregate_init()


def summary_line(key: CrowdKey, reports: int, checksum: int, **extra: Any) -> dict[str, Any]:
    """A JSON-ready record of one crowd's report count and checksum (verify.json, aggregate.json)."""
    return {
        "window_start": key.window_start,
        "window_end": key.window_end,
        "crowd_id": key.crowd_id,
        "reports": int(reports),
        "checksum": f"{int(checksum):064x}",
        **extra,
    }

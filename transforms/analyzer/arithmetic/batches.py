"""One batch of shuffled messages -> partial accumulators per crowd and dead-letter reasons.

Verification (schema version, window, CRC32C, recipe on its channel) and payload decoding are
vectorized over the batch, and so is counting the histogram crowds of small dense domains (one
bincount over crowd x bucket per recipe); what is left per crowd is making its accumulator,
or for those histogram crowds, asked for as rows (:class:`CrowdRows`), only its key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from privacy.estimators import (
    tree_node_offsets,
)
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import (
    CENSUS,
    DECODE_REASONS,
    DecodedPayloads,
    EncodedPayloads,
    decode_payloads,
    message_columns,
)
from schemas.recipes import Recipe
from transforms.analyzer.arithmetic.accumulate import (
    DENSE_LIMIT,
    HISTOGRAM,
    LONGITUDINAL,
    Accumulator,
    BucketCounts,
    CrowdAccumulator,
    CrowdKey,
    LongitudinalAccumulator,
    RecipeBook,
    _bincount,
    decode_limits,
    is_longitudinal,
)
from transforms.common.grouping import group_rows

# ---------------------------------------------------------------------------------------------
# One batch of shuffled messages -> accumulators and rejections
# ---------------------------------------------------------------------------------------------

# Reasons a shuffled message is dead-lettered by the analyzer, besides the payload decoder's own
# (schemas.payloads.DECODE_REASONS).
UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
BAD_WINDOW = "bad_window"
CRC_MISMATCH = "crc_mismatch"
UNKNOWN_RECIPE = "unknown_recipe"
RECIPE_CHANNEL_MISMATCH = "recipe_channel_mismatch"
MISSING_FIELD = "missing_field"
TREE_NODE_MISMATCH = "tree_node_period_mismatch"
CENSUS_NOT_COUNTED = "census_not_counted"
MESSAGE_COLUMNS = (
    "schema_version",
    "window_start",
    "window_end",
    "channel",
    "recipe_id",
    "crowd_id",
    "payload",
    "payload_crc32c",
)


@dataclass(frozen=True)
class CrowdRows:
    """Histogram crowds of one message domain size as rows, not accumulators: their keys, their
    bucket sums (int64, crowds x ``domain``) and their decoded messages; each row is the
    accumulator ``CrowdAccumulator(BucketCounts.from_row(domain, row), {}, messages, {})``."""

    domain: int
    keys: list[CrowdKey]
    sums: np.ndarray
    messages: np.ndarray

    def accumulators(self) -> dict[CrowdKey, Accumulator]:
        """The crowds as accumulators (their sums rows of :attr:`sums`)."""
        make = BucketCounts.from_row
        return {
            key: CrowdAccumulator(make(self.domain, self.sums[row]), {}, messages, {})
            for row, (key, messages) in enumerate(
                zip(self.keys, self.messages.tolist(), strict=True)
            )
        }


@dataclass
class BatchAggregate:
    """What one batch of shuffled messages adds: partial accumulators per crowd (and, when
    asked for, the histogram crowds of small dense domains as :class:`CrowdRows` instead:
    ``rows``), the rows to dead-letter (positions in the batch) with their reasons, and
    counters.

    Counters: ``read`` = ``messages`` + Σ ``rejected:<reason>``.
    """

    accumulators: dict[CrowdKey, Accumulator]
    rejected_rows: np.ndarray
    rejected_reasons: list[str]
    counts: dict[str, int]
    rows: list[CrowdRows] = dataclasses.field(default_factory=list)

    def all_accumulators(self) -> dict[CrowdKey, Accumulator]:
        """:attr:`accumulators` with the crowds of :attr:`rows` added as accumulators."""
        out = dict(self.accumulators)
        for rows in self.rows:
            out.update(rows.accumulators())
        return out


# A reason per row as a uint8 code (0: not rejected; an object array of names cost three
# passes of Python string comparisons a batch): the payload decoder's reasons (code 1 + its own
# code, "ok" never used) and the analyzer's.
_REASON_NAMES: tuple[str, ...] = (
    "",
    *DECODE_REASONS,
    UNKNOWN_SCHEMA_VERSION,
    BAD_WINDOW,
    CRC_MISMATCH,
    UNKNOWN_RECIPE,
    RECIPE_CHANNEL_MISMATCH,
    MISSING_FIELD,
    TREE_NODE_MISMATCH,
    CENSUS_NOT_COUNTED,
)
_REASON_CODE = {name: code for code, name in reversed(list(enumerate(_REASON_NAMES)))}
_DECODER_REASON_OFFSET = 1


def _reject(reasons: np.ndarray, rows: np.ndarray, reason: str) -> None:
    target = rows[reasons[rows] == 0]
    reasons[target] = _REASON_CODE[reason]


def _dictionary_codes(column: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """``column``'s values as int64 codes into a list of its distinct values (a null is one of
    them, None)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column, null_encoding="encode")
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def aggregate_batch(
    batch: pa.RecordBatch,
    book: RecipeBook,
    supported_versions: Iterable[int],
    dense_limit: int = DENSE_LIMIT,
    as_rows: bool = False,
    payloads: EncodedPayloads | None = None,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
) -> BatchAggregate:
    """Verify, decode and count one batch of ShuffledMessage rows of a release.

    Checks, in order: schema version, window bounds, payload CRC32C, a known recipe on its own
    channel, then the payload itself (``schemas.payloads.decode_payloads`` with the recipe's
    payload kind and domain; a retired census payload is dead-lettered ``census_not_counted``: n
    comes only from the shufflers' commit records). Everything is vectorized over the batch
    (payloads decoded once per recipe; histogram crowds of domains up to
    :data:`ROW_DOMAIN_LIMIT` counted as the rows of one matrix); the Python loop over the crowds
    the batch holds only makes their accumulators (longitudinal crowds and larger or sparse
    domains are counted crowd by crowd). ``as_rows``: the histogram crowds counted as rows
    are returned as :class:`CrowdRows` (``rows``, one per domain size, crowds in the order
    their accumulators would have) instead of accumulators, no Python object made per crowd.
    ``payloads`` (``EncodedPayloads.from_arrow`` of the batch's payload column) and ``groups``
    (:func:`crowd_groups` of its crowd key columns), when the caller has them, are not made again.
    """
    rows = batch.num_rows
    missing = [name for name in MESSAGE_COLUMNS if name not in batch.schema.names]
    reasons = np.zeros(rows, dtype=np.uint8)
    counts: dict[str, int] = {"read": rows}
    accumulators: dict[CrowdKey, Accumulator] = {}
    row_parts: dict[int, list[tuple[list[int], np.ndarray, np.ndarray]]] = {}  # by domain
    if missing or rows == 0:
        reasons[:] = _REASON_CODE[MISSING_FIELD]
        return _finish(accumulators, reasons, counts)

    def int_column(name: str) -> np.ndarray:
        return batch.column(name).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)

    version = int_column("schema_version")
    window_start = int_column("window_start")
    window_end = int_column("window_end")
    stored_crc = int_column("payload_crc32c")
    everything = np.arange(rows)
    _reject(
        reasons, everything[~np.isin(version, list(supported_versions))], UNKNOWN_SCHEMA_VERSION
    )
    _reject(reasons, everything[~(window_start < window_end)], BAD_WINDOW)
    if payloads is None:
        payloads = EncodedPayloads.from_arrow(batch.column("payload"))
    actual_crc = crc32c_many(payloads).astype(np.int64)
    _reject(reasons, everything[actual_crc != stored_crc], CRC_MISMATCH)

    key_columns = [
        batch.column("window_start"),
        batch.column("window_end"),
        batch.column("channel"),
        batch.column("recipe_id"),
        batch.column("crowd_id"),
    ]
    order, starts = crowd_groups(key_columns) if groups is None else groups
    sizes = np.diff(starts)
    firsts = order[starts[:-1]]  # each crowd's first row
    group_of = np.empty(rows, dtype=np.int64)
    group_of[order] = np.repeat(np.arange(firsts.size), sizes)
    first_rows = pa.array(firsts)
    recipe_column = batch.column("recipe_id").take(first_rows)
    channel_column = batch.column("channel").take(first_rows)
    recipe_ids = recipe_column.to_pylist()
    channels = channel_column.to_pylist()
    crowd_ids = batch.column("crowd_id").take(first_rows).to_pylist()
    # A known recipe on its own channel, per crowd: looked up once per distinct (recipe ID,
    # channel) pair, the crowds' pairs as dictionary codes (no Python step per crowd).
    recipe_codes, recipe_names = _dictionary_codes(recipe_column)
    channel_codes, channel_names = _dictionary_codes(channel_column)
    pairs, pair_of = np.unique(
        recipe_codes * len(channel_names) + channel_codes, return_inverse=True
    )
    pair_refused = np.zeros(pairs.size, dtype=np.int8)  # 1: unknown recipe, 2: wrong channel
    recipe_of_code: dict[int, Recipe] = {}
    for index, pair in enumerate(pairs.tolist()):
        recipe_id = recipe_names[pair // len(channel_names)]
        recipe = book.get(recipe_id) if recipe_id is not None else None
        if recipe is None:
            pair_refused[index] = 1
        elif channel_names[pair % len(channel_names)] != recipe.channel:
            pair_refused[index] = 2
        else:
            recipe_of_code[pair // len(channel_names)] = recipe
    refused = pair_refused[pair_of.reshape(-1)]
    row_refused = refused[group_of]
    _reject(reasons, everything[row_refused == 1], UNKNOWN_RECIPE)
    _reject(reasons, everything[row_refused == 2], RECIPE_CHANNEL_MISMATCH)
    live_rows = order[(reasons[order] == 0) & (row_refused[order] == 0)]  # in crowd order
    live_sizes = np.bincount(group_of[live_rows], minlength=firsts.size)
    # Each crowd's accumulator, made per recipe: histogram crowds of small dense domains at once
    # (one bincount over crowd x bucket), the others crowd by crowd. Recipes in the order their
    # first live crowd comes, each one's crowds ascending.
    made: dict[int, Accumulator] = {}
    live_groups = np.flatnonzero(live_sizes)
    live_codes = recipe_codes[live_groups]
    codes, first_live = np.unique(live_codes, return_index=True)
    by_recipe: dict[int, list[int]] = {
        code: live_groups[live_codes == code].tolist()
        for code in codes[np.argsort(first_live)].tolist()
    }
    for code, groups in by_recipe.items():
        recipe = recipe_of_code[code]
        chosen = np.zeros(firsts.size, dtype=bool)
        chosen[groups] = True
        recipe_rows = live_rows[chosen[group_of[live_rows]]]  # crowd after crowd, as read
        every_row = recipe_rows.size == rows and np.array_equal(recipe_rows, everything)
        decoded = decode_payloads(
            payloads if every_row else payloads_subset(payloads, recipe_rows),
            allowed_kinds=(CENSUS, recipe.payload_kind),
            limits=decode_limits(recipe),
        )
        bad = ~decoded.valid
        if bad.any():
            reasons[recipe_rows[bad]] = decoded.reason[bad] + _DECODER_REASON_OFFSET
        census = decoded.is_kind(CENSUS)
        if census.any():  # retired census payloads cannot move n: dead letters
            reasons[recipe_rows[census]] = _REASON_CODE[CENSUS_NOT_COUNTED]
        randomizer = recipe.build_randomizer()
        domain = randomizer.message_domain_size
        if is_longitudinal(recipe) or domain > min(dense_limit, ROW_DOMAIN_LIMIT):
            offsets = np.concatenate([[0], np.cumsum(live_sizes[groups])]).tolist()
            for index, group in enumerate(groups):
                part = slice(offsets[index], offsets[index + 1])
                one = dataclasses.replace(
                    decoded,
                    kind=decoded.kind[part],
                    columns={name: column[part] for name, column in decoded.columns.items()},
                    valid=decoded.valid[part],
                    reason=decoded.reason[part],
                )
                made[group] = _crowd_accumulator(
                    recipe, randomizer, one, recipe_rows[part], reasons, dense_limit,
                    int(window_start[firsts[group]]), int(window_end[firsts[group]]),
                )  # fmt: skip
            continue
        is_kind = decoded.is_kind(recipe.payload_kind)
        columns = message_columns(
            decoded, recipe.payload_kind, sketch_width=getattr(randomizer, "width", None)
        )
        crowd_of = group_of[recipe_rows[is_kind]]
        if recipe.payload_kind == "fragment_bucket":
            no_fragment = columns["fragment"] < 1
            if no_fragment.any():  # fragments are numbered 1..τ (Algorithm 2)
                reasons[recipe_rows[is_kind][no_fragment]] = _REASON_CODE["value_out_of_range"]
                columns = {name: col[~no_fragment] for name, col in columns.items()}
                crowd_of = crowd_of[~no_fragment]
        buckets = columns["bucket"]
        if buckets.size and (int(buckets.min()) < 0 or int(buckets.max()) >= domain):
            raise ValueError(
                f"buckets must lie in [0, {domain}), got values in "
                f"[{int(buckets.min())}, {int(buckets.max())}]"
            )
        signs = columns["sign"] if recipe.payload_kind == "signed_bucket" else None
        crowd_rank = np.searchsorted(np.asarray(groups, dtype=np.int64), crowd_of)
        sums = _bincount(crowd_rank * domain + buckets, signs, len(groups) * domain)
        sums = sums.reshape(len(groups), domain)
        if as_rows:
            part = (
                groups,
                sums.astype(np.int64, copy=False),
                np.bincount(crowd_rank, minlength=len(groups)),
            )
            row_parts.setdefault(domain, []).append(part)
            continue
        messages = np.bincount(crowd_rank, minlength=len(groups)).tolist()
        for index, group in enumerate(groups):
            row = BucketCounts.from_row(domain, sums[index])
            made[group] = CrowdAccumulator(row, {}, messages[index], {})
    for group, accumulator in sorted(made.items()):
        start, stop = int(window_start[firsts[group]]), int(window_end[firsts[group]])
        channel, recipe_id, crowd_id = channels[group], recipe_ids[group], crowd_ids[group]
        if isinstance(accumulator, LongitudinalAccumulator):
            key = (LONGITUDINAL, 0, stop - start, channel, recipe_id, crowd_id)
            mine = accumulators.get(key)
            if mine is None:
                accumulators[key] = accumulator
            else:  # another window of the same rounds
                mine.merge(accumulator)
        else:
            accumulators[(HISTOGRAM, start, stop, channel, recipe_id, crowd_id)] = accumulator
    found = [
        _crowd_rows(
            domain, parts, firsts, window_start, window_end, channels, recipe_ids, crowd_ids
        )
        for domain, parts in row_parts.items()
    ]
    return _finish(accumulators, reasons, counts, found)


def _crowd_rows(
    domain: int,
    parts: list[tuple[list[int], np.ndarray, np.ndarray]],
    firsts: np.ndarray,
    window_start: np.ndarray,
    window_end: np.ndarray,
    channels: list[Any],
    recipe_ids: list[Any],
    crowd_ids: list[Any],
) -> CrowdRows:
    """The crowds (groups) of ``parts`` (each: groups, sums, messages) as one :class:`CrowdRows`,
    in group order (the order :func:`aggregate_batch` makes their accumulators in)."""
    groups = np.concatenate([np.asarray(part[0], dtype=np.int64) for part in parts])
    sums = np.concatenate([part[1] for part in parts])
    messages = np.concatenate([part[2] for part in parts]).astype(np.int64, copy=False)
    if len(parts) > 1:
        order = np.argsort(groups, kind="stable")
        groups, sums, messages = groups[order], sums[order], messages[order]
    first_rows = firsts[groups]
    group_list = groups.tolist()
    keys = list(
        zip(
            [HISTOGRAM] * len(group_list),
            window_start[first_rows].tolist(),
            window_end[first_rows].tolist(),
            [channels[group] for group in group_list],
            [recipe_ids[group] for group in group_list],
            [crowd_ids[group] for group in group_list],
            strict=True,
        )
    )
    return CrowdRows(domain, keys, sums, messages)


# Histogram crowds of message domains up to this size are counted together, as the rows of one
# matrix per batch and recipe (larger ones crowd by crowd).
ROW_DOMAIN_LIMIT = 1 << 12


def _crowd_accumulator(
    recipe: Recipe,
    randomizer: Any,
    decoded: DecodedPayloads,
    live: np.ndarray,
    reasons: np.ndarray,
    dense_limit: int,
    start: int,
    stop: int,
) -> Accumulator:
    """One crowd's accumulator from its decoded payloads (its ``live`` rows of the batch)."""
    if is_longitudinal(recipe):
        key = (LONGITUDINAL, 0, stop - start, "", "", None)
        holder: dict[CrowdKey, Accumulator] = {}
        _add_longitudinal(holder, recipe, key, decoded, live, reasons, start, stop)
        return holder[key]
    accumulator = CrowdAccumulator.empty(randomizer.message_domain_size, dense_limit)
    columns = message_columns(
        decoded,
        recipe.payload_kind,
        sketch_width=getattr(randomizer, "width", None),
    )
    if recipe.payload_kind == "fragment_bucket":
        no_fragment = decoded.columns["fragment"][decoded.is_kind("fragment_bucket")] < 1
        if no_fragment.any():  # fragments are numbered 1..τ (Algorithm 2)
            kind_rows = live[decoded.is_kind("fragment_bucket")]
            reasons[kind_rows[no_fragment]] = _REASON_CODE["value_out_of_range"]
            columns = {name: col[~no_fragment] for name, col in columns.items()}
    signed = recipe.payload_kind == "signed_bucket"
    accumulator.add_messages(columns["bucket"], columns["sign"] if signed else None)
    return accumulator


def _add_longitudinal(
    accumulators: dict[CrowdKey, Accumulator],
    recipe: Recipe,
    key: CrowdKey,
    decoded: DecodedPayloads,
    live: np.ndarray,
    reasons: np.ndarray,
    window_start: int,
    window_end: int,
) -> None:
    """Tree-node messages of one window: checks each node belongs to its period, then adds."""
    randomizer = recipe.build_randomizer()
    window_ms = window_end - window_start
    accumulator = accumulators.get(key)
    if accumulator is None:
        accumulator = LongitudinalAccumulator(randomizer.message_domain_size, window_ms)
        accumulators[key] = accumulator
    is_node = decoded.is_kind("tree_node")
    period = decoded.columns["period"][is_node]
    node = decoded.columns["node"][is_node]
    sign = decoded.columns["sign"][is_node]
    consistent = tree_node_matches_period(node, period, randomizer.periods)
    if not consistent.all():
        reasons[live[is_node][~consistent]] = _REASON_CODE[TREE_NODE_MISMATCH]
        period, node, sign = period[consistent], node[consistent], sign[consistent]
    round_start = window_start - (period - 1) * window_ms
    for start in np.unique(round_start).tolist():
        chosen = round_start == start
        accumulator.add_messages(start, node[chosen], sign[chosen])


def tree_node_matches_period(node: np.ndarray, period: np.ndarray, periods: int) -> np.ndarray:
    """Whether flat tree node ``node`` is the node Algorithm 1 reports at ``period`` t.

    A client at level h reports node [h, t / 2^(h-1)] at periods t divisible by 2^(h-1)
    (amplification-by-shuffling, Algorithm 1, Steps 9-16); anything else cannot come from it.
    """
    offsets = tree_node_offsets(periods)
    level = np.searchsorted(offsets, node, side="right")  # 1-based level of each node
    level = np.clip(level, 1, offsets.size)
    stride = np.left_shift(1, level - 1)
    expected = offsets[level - 1] + (period >> (level - 1)) - 1
    return (period >= 1) & (period <= periods) & (period % stride == 0) & (expected == node)


def is_constant(column: pa.Array | pa.ChunkedArray) -> bool:
    """Whether every value of a non-empty column is its first (nulls included)."""
    if column.null_count:
        return column.null_count == len(column)
    return bool(pc.all(pc.equal(column, column[0])).as_py())


def crowd_groups(key_columns: list[pa.Array]) -> tuple[np.ndarray, np.ndarray]:
    """``transforms.common.grouping.group_rows`` of a batch's crowd key columns; a batch of one
    crowd (every key column constant: a release file's common case) without the sort, with
    the same result (``order`` the rows in turn, one group)."""
    rows = len(key_columns[0]) if key_columns else 0
    if rows and all(is_constant(column) for column in reversed(key_columns)):  # last: the ID
        return np.arange(rows), np.array([0, rows], dtype=np.int64)
    return group_rows(key_columns)


def payloads_subset(payloads: EncodedPayloads, rows: np.ndarray) -> EncodedPayloads:
    """The payloads at ``rows`` as a new EncodedPayloads (one gather, no per-row Python)."""
    lengths = payloads.lengths[rows]
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = payloads.offsets[:-1][rows]
    positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
    return EncodedPayloads(payloads.data[positions], offsets)


def _finish(
    accumulators: dict[CrowdKey, Accumulator],
    reasons: np.ndarray,
    counts: dict[str, int],
    rows: list[CrowdRows] | None = None,
) -> BatchAggregate:
    rejected = np.flatnonzero(reasons)
    codes = reasons[rejected]
    rejected_reasons = [_REASON_NAMES[code] for code in codes.tolist()]
    for code, count in enumerate(np.bincount(codes, minlength=len(_REASON_NAMES)).tolist()):
        if count:
            counts[f"rejected:{_REASON_NAMES[code]}"] = count
    counts["messages"] = int(counts["read"] - rejected.size)
    return BatchAggregate(accumulators, rejected, rejected_reasons, counts, rows or [])


# ---------------------------------------------------------------------------------------------
# Commit records -> respondent counts
# ---------------------------------------------------------------------------------------------


def crowd_key(recipe: Recipe, crowd: Mapping[str, Any]) -> CrowdKey:
    """The analyzer's key of a commit record's crowd (longitudinal rounds span windows)."""
    start, stop = int(crowd["window_start_ms"]), int(crowd["window_end_ms"])
    channel, recipe_id, crowd_id = crowd["channel"], crowd["recipe_id"], crowd.get("crowd_id")
    if is_longitudinal(recipe):
        return (LONGITUDINAL, 0, stop - start, channel, recipe_id, crowd_id)
    return (HISTOGRAM, start, stop, channel, recipe_id, crowd_id)


def respondent_accumulators(
    crowds: Iterable[Mapping[str, Any]],
    instance: int,
    book: RecipeBook,
    dense_limit: int = DENSE_LIMIT,
) -> list[tuple[CrowdKey, Accumulator]]:
    """One partial accumulator per released crowd of instance ``instance``'s commit record,
    holding only n_u = ``respondents_released`` (DESIGN.md: n comes from what the shuffler
    counted and released, never from messages). Crowds of recipes not in ``book`` are skipped
    (their messages are dead-lettered ``unknown_recipe``); withheld crowds add nothing.
    Raises ValueError on a released crowd without a count >= 0 or a window that is not a window.
    """
    out: list[tuple[CrowdKey, Accumulator]] = []
    for crowd in crowds:
        if crowd.get("status") != "released":
            continue
        recipe = book.get(crowd.get("recipe_id"))
        if recipe is None:
            continue
        count = crowd.get("respondents_released")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"released crowd without respondents_released >= 0: {dict(crowd)}")
        start, stop = crowd.get("window_start_ms"), crowd.get("window_end_ms")
        if not (isinstance(start, int) and isinstance(stop, int) and start < stop):
            raise ValueError(f"crowd window must be integers start < end: {dict(crowd)}")
        key = crowd_key(recipe, crowd)
        randomizer = recipe.build_randomizer()
        if is_longitudinal(recipe):
            accumulator: Accumulator = LongitudinalAccumulator(
                randomizer.message_domain_size, stop - start
            )
            accumulator.set_respondents(start, instance, count)
        else:
            accumulator = CrowdAccumulator.empty(randomizer.message_domain_size, dense_limit)
            accumulator.set_respondents(instance, count)
        out.append((key, accumulator))
    return out

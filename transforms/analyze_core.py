"""The analyzer's arithmetic, without Beam: count accumulators, respondent counts, reports.

Everything here works on numpy arrays of one batch of messages at a time (never one message at a
time) and is tested without a pipeline; ``transforms/aggregate.py`` and ``transforms/analyze.py``
are thin Beam composites over it.

Counting respondents across K shuffler instances. A respondent sends each randomized message to
one instance ``u`` drawn from the recipe's ``instance_weights`` π, and one content-free census
message to every instance. Shuffler ``u`` may withhold a crowd or delete whole respondents
(Algorithm 3, esa-privacy-revisited, on distinct origins), so the instances' surviving populations
differ. With ``n_u`` census messages counted in instance ``u``'s release of a crowd, the expected
bucket sums over all instances are ``Σ_u π_u Σ_{i alive in u} E[message counts of i]``, so the
estimators are unbiased with the effective respondent count ``n_eff = Σ_u π_u n_u``: the
π-weighted surviving population (it equals ``n`` when nothing was deleted or withheld).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from privacy.accounting import (
    BINARY_RR,
    GENERIC,
    PrivacyLoss,
    amplify,
    compose_basic,
    privacy_report,
)
from privacy.estimators import (
    HistogramEstimate,
    clip_nonnegative,
    debias_one_hot,
    debias_report_fragments,
    debias_zero_sum,
    norm_sub,
    tree_node_offsets,
)
from privacy.randomizers import (
    AsymmetricOneHot,
    BinaryRandomizedResponse,
    LongitudinalClient,
    OneHotRappor,
    ReportFragmented,
    SymmetricOneHot,
    ZeroSumHistogram,
)
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import (
    CENSUS,
    DecodedPayloads,
    EncodedPayloads,
    decode_payloads,
    message_columns,
)
from schemas.recipes import Recipe, recipe_from_dict
from transforms.shuffle_core import group_rows

# Domains up to this many buckets are counted densely (np.bincount into one int64 array, 8 MB at
# the limit); larger domains keep sorted unique keys with their sums.
DENSE_LIMIT = 1 << 20
# A sparse accumulator folds its pending batches into its sorted keys once they hold this many.
SPARSE_PENDING_LIMIT = 1 << 18


class BucketCounts:
    """Integer sums per bucket over ``[0, domain_size)``, dense or sparse.

    Dense (``domain_size <= dense_limit``): one ``int64`` array updated by ``np.bincount`` per
    batch. Sparse: sorted unique keys with their sums; batches wait in a pending list and are
    merged (``np.unique`` + ``np.bincount``) once enough have piled up, so adding a batch costs
    amortized ``O(batch log batch)`` and memory stays proportional to the buckets seen.
    Mutating ``add``/``merge`` keep Beam combiners allocation-free between batches.
    """

    __slots__ = ("domain_size", "_dense", "_keys", "_values", "_pending", "_pending_size")

    def __init__(self, domain_size: int, dense_limit: int = DENSE_LIMIT) -> None:
        if int(domain_size) < 1:
            raise ValueError(f"domain_size must be >= 1, got {domain_size}")
        if int(dense_limit) < 0:
            raise ValueError(f"dense_limit must be >= 0, got {dense_limit}")
        self.domain_size = int(domain_size)
        self._dense: np.ndarray | None = None
        self._keys = np.zeros(0, dtype=np.int64)
        self._values = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0
        if self.domain_size <= int(dense_limit):
            self._dense = np.zeros(self.domain_size, dtype=np.int64)

    @property
    def is_dense(self) -> bool:
        return self._dense is not None

    def __getstate__(self) -> tuple:
        self.compact()
        return (self.domain_size, self._dense, self._keys, self._values)

    def __setstate__(self, state: tuple) -> None:
        self.domain_size, self._dense, self._keys, self._values = state
        self._pending = []
        self._pending_size = 0

    def __repr__(self) -> str:
        mode = "dense" if self.is_dense else "sparse"
        return f"BucketCounts(domain_size={self.domain_size}, {mode}, total={self.total()})"

    def add(self, buckets: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Adds ``weights`` (default 1 each) to ``buckets``; both 1-D integer arrays."""
        buckets = np.asarray(buckets)
        if buckets.ndim != 1:
            raise ValueError(f"buckets must be 1-D, got shape {buckets.shape}")
        if buckets.size == 0:
            return
        if not np.issubdtype(buckets.dtype, np.integer):
            raise ValueError(f"buckets must be integers, got {buckets.dtype}")
        low, high = int(buckets.min()), int(buckets.max())
        if low < 0 or high >= self.domain_size:
            raise ValueError(
                f"buckets must lie in [0, {self.domain_size}), got values in [{low}, {high}]"
            )
        if weights is not None:
            weights = np.asarray(weights)
            if weights.shape != buckets.shape:
                raise ValueError(
                    f"weights shape {weights.shape} differs from buckets shape {buckets.shape}"
                )
            if not np.issubdtype(weights.dtype, np.integer):
                raise ValueError(f"weights must be integers, got {weights.dtype}")
        if self._dense is not None:
            self._dense += _bincount(buckets, weights, self.domain_size)
            return
        keys, inverse = np.unique(buckets, return_inverse=True)
        values = _bincount(inverse, weights, keys.size)
        self._pending.append((keys.astype(np.int64, copy=False), values))
        self._pending_size += keys.size
        if self._pending_size >= max(SPARSE_PENDING_LIMIT, self._keys.size):
            self.compact()

    def merge(self, other: BucketCounts) -> None:
        """Adds ``other``'s sums into this accumulator (``other`` is left unchanged)."""
        if other.domain_size != self.domain_size:
            raise ValueError(
                f"cannot merge counts over {other.domain_size} buckets into {self.domain_size}"
            )
        if self._dense is not None and other._dense is not None:
            self._dense += other._dense
            return
        keys, values = other.sparse()
        if self._dense is not None:
            np.add.at(self._dense, keys, values)
            return
        self._pending.append((keys, values))
        self._pending_size += keys.size
        if self._pending_size >= max(SPARSE_PENDING_LIMIT, self._keys.size):
            self.compact()

    def compact(self) -> None:
        """Folds pending sparse batches into the sorted keys (a no-op when dense)."""
        if not self._pending:
            return
        keys = np.concatenate([self._keys] + [k for k, _ in self._pending])
        values = np.concatenate([self._values] + [v for _, v in self._pending])
        self._pending = []
        self._pending_size = 0
        unique_keys, inverse = np.unique(keys, return_inverse=True)
        self._keys = unique_keys.astype(np.int64, copy=False)
        self._values = _bincount(inverse, values, unique_keys.size)

    def sparse(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted buckets with a non-zero sum, and those sums (int64 arrays)."""
        if self._dense is not None:
            keys = np.flatnonzero(self._dense).astype(np.int64)
            return keys, self._dense[keys]
        self.compact()
        nonzero = self._values != 0
        return self._keys[nonzero], self._values[nonzero]

    def dense(self) -> np.ndarray:
        """All ``domain_size`` sums as one int64 array (a copy)."""
        if self._dense is not None:
            return self._dense.copy()
        if self.domain_size > (1 << 28):
            raise ValueError(
                f"domain of {self.domain_size} buckets is too large to materialize densely"
            )
        out = np.zeros(self.domain_size, dtype=np.int64)
        keys, values = self.sparse()
        out[keys] = values
        return out

    def total(self) -> int:
        """Sum over all buckets."""
        if self._dense is not None:
            return int(self._dense.sum())
        return int(self._values.sum()) + int(sum(int(v.sum()) for _, v in self._pending))


def _bincount(indices: np.ndarray, weights: np.ndarray | None, size: int) -> np.ndarray:
    """Exact integer ``np.bincount`` (weights are split by sign so no float rounding occurs)."""
    if weights is None:
        return np.bincount(indices, minlength=size).astype(np.int64, copy=False)
    weights = weights.astype(np.int64, copy=False)
    if weights.size and int(np.abs(weights).max()) < (1 << 52) // max(1, indices.size):
        # float64 sums of integers stay exact below 2**53.
        return np.rint(np.bincount(indices, weights=weights, minlength=size)).astype(np.int64)
    out = np.zeros(size, dtype=np.int64)
    np.add.at(out, indices, weights)
    return out


@dataclass
class CrowdAccumulator:
    """Everything the analyzer adds up for one (window, channel, recipe, crowd).

    ``counts`` holds the bucket sums of the decoded randomized messages of all instances;
    ``census`` maps shuffler instance -> census messages counted in that instance's release
    (one per surviving respondent); ``messages`` counts decoded randomized messages and
    ``rejected`` counts messages sent to the dead-letter output, by reason.
    """

    counts: BucketCounts
    census: dict[int, int]
    messages: int = 0
    rejected: dict[str, int] | None = None

    @classmethod
    def empty(cls, domain_size: int, dense_limit: int = DENSE_LIMIT) -> CrowdAccumulator:
        return cls(BucketCounts(domain_size, dense_limit), {}, 0, {})

    def add_messages(self, buckets: np.ndarray, weights: np.ndarray | None = None) -> None:
        self.counts.add(buckets, weights)
        self.messages += int(np.asarray(buckets).size)

    def add_census(self, instance: int, count: int) -> None:
        if int(instance) < 0 or int(count) < 0:
            raise ValueError(f"census needs instance >= 0 and count >= 0, got {instance}, {count}")
        self.census[int(instance)] = self.census.get(int(instance), 0) + int(count)

    def add_rejected(self, reason: str, count: int) -> None:
        if self.rejected is None:
            self.rejected = {}
        self.rejected[reason] = self.rejected.get(reason, 0) + int(count)

    def merge(self, other: CrowdAccumulator) -> None:
        """Adds ``other`` into this accumulator."""
        self.counts.merge(other.counts)
        for instance, count in other.census.items():
            self.add_census(instance, count)
        self.messages += other.messages
        for reason, count in (other.rejected or {}).items():
            self.add_rejected(reason, count)


def merge_accumulators(accumulators: Iterable[CrowdAccumulator]) -> CrowdAccumulator:
    """Sums accumulators; the first one is reused as the result (Beam's merge contract)."""
    iterator = iter(accumulators)
    try:
        result = next(iterator)
    except StopIteration:
        raise ValueError("merge_accumulators needs at least one accumulator") from None
    for accumulator in iterator:
        result.merge(accumulator)
    return result


def effective_respondents(census: Mapping[int, int], instance_weights: Iterable[float]) -> float:
    """``n_eff = Σ_u π_u n_u``: the respondent count the de-biasing estimators need.

    ``census[u]`` is the number of census messages in instance ``u``'s release and π the
    recipe's ``instance_weights`` (see the module docstring for why this keeps the estimators
    unbiased when shufflers withhold crowds or delete respondents).
    """
    weights = np.asarray(list(instance_weights), dtype=np.float64)
    if weights.ndim != 1 or weights.size == 0:
        raise ValueError("instance_weights must be a non-empty 1-D sequence")
    if np.any(weights < 0) or not math.isclose(float(weights.sum()), 1.0, abs_tol=1e-9):
        raise ValueError(f"instance_weights must be >= 0 and sum to 1, got {weights.tolist()}")
    n_eff = 0.0
    for instance, count in census.items():
        if not 0 <= int(instance) < weights.size:
            raise ValueError(
                f"census from shuffler instance {instance}, but the recipe has "
                f"{weights.size} instances"
            )
        if int(count) < 0:
            raise ValueError(f"census count for instance {instance} is negative: {count}")
        n_eff += float(weights[int(instance)]) * int(count)
    return n_eff


class LongitudinalAccumulator:
    """Tree-node sums of one (channel, recipe, crowd) over its d-period rounds (epochs).

    Algorithm 1 (amplification-by-shuffling) sends the report for period t in the period's own
    window, so one round of d periods spans d consecutive windows; a message's round starts at
    ``window_start - (period - 1) * window length``. ``nodes`` maps round start (ms) to the
    2d - 1 node sums (flat order of ``privacy.estimators.tree_node_offsets``); ``census`` maps
    (window_start, instance) to census messages, so each period has its own respondent count.
    """

    __slots__ = ("node_count", "window_ms", "nodes", "census", "messages", "rejected")

    def __init__(self, node_count: int, window_ms: int) -> None:
        if int(node_count) < 1 or int(window_ms) < 1:
            raise ValueError(
                f"need node_count >= 1 and window_ms >= 1, got {node_count}, {window_ms}"
            )
        self.node_count = int(node_count)
        self.window_ms = int(window_ms)
        self.nodes: dict[int, BucketCounts] = {}
        self.census: dict[tuple[int, int], int] = {}
        self.messages = 0
        self.rejected: dict[str, int] = {}

    def __getstate__(self) -> tuple:
        return (
            self.node_count,
            self.window_ms,
            self.nodes,
            self.census,
            self.messages,
            self.rejected,
        )

    def __setstate__(self, state: tuple) -> None:
        (self.node_count, self.window_ms, self.nodes, self.census, self.messages, self.rejected) = (
            state
        )

    def add_messages(self, round_start: int, nodes: np.ndarray, signs: np.ndarray) -> None:
        counts = self.nodes.get(int(round_start))
        if counts is None:
            counts = self.nodes[int(round_start)] = BucketCounts(self.node_count)
        counts.add(nodes, signs)
        self.messages += int(np.asarray(nodes).size)

    def add_census(self, window_start: int, instance: int, count: int) -> None:
        if int(instance) < 0 or int(count) < 0:
            raise ValueError(f"census needs instance >= 0 and count >= 0, got {instance}, {count}")
        key = (int(window_start), int(instance))
        self.census[key] = self.census.get(key, 0) + int(count)

    def add_rejected(self, reason: str, count: int) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + int(count)

    def merge(self, other: LongitudinalAccumulator) -> None:
        if (other.node_count, other.window_ms) != (self.node_count, self.window_ms):
            raise ValueError("cannot merge longitudinal accumulators of different trees or windows")
        for round_start, counts in other.nodes.items():
            mine = self.nodes.get(round_start)
            if mine is None:
                mine = self.nodes[round_start] = BucketCounts(self.node_count)
            mine.merge(counts)
        for (window_start, instance), count in other.census.items():
            self.add_census(window_start, instance, count)
        self.messages += other.messages
        for reason, count in other.rejected.items():
            self.add_rejected(reason, count)


Accumulator = CrowdAccumulator | LongitudinalAccumulator


def merge_any(accumulators: Iterable[Accumulator | None]) -> Accumulator | None:
    """Sums accumulators of one kind, skipping ``None`` (an empty Beam accumulator)."""
    result = None
    for accumulator in accumulators:
        if accumulator is None:
            continue
        if result is None:
            result = accumulator
        else:
            result.merge(accumulator)
    return result


# ---------------------------------------------------------------------------------------------
# Recipes as the analyzer needs them
# ---------------------------------------------------------------------------------------------

HISTOGRAM = "histogram"
LONGITUDINAL = "longitudinal"
# (kind, window_start, window_end, channel, recipe_id, crowd_id) for histograms;
# (kind, 0, window length, channel, recipe_id, crowd_id) for longitudinal counters (all windows
# of one length together: a round of d periods spans d windows).
CrowdKey = tuple[str, int, int, str, str, str | None]


class RecipeBook:
    """The recipes the analyzer accepts, by id, with their randomizers built once.

    Pickles as the recipes' JSON (Beam ships it to workers), so nothing unpicklable travels.
    """

    def __init__(self, recipes: Mapping[str, Recipe] | Iterable[Recipe]) -> None:
        items = recipes.values() if isinstance(recipes, Mapping) else recipes
        self._recipes: dict[str, Recipe] = {}
        for recipe in items:
            if recipe.id in self._recipes:
                raise ValueError(f"recipe {recipe.id} given twice")
            self._recipes[recipe.id] = recipe

    def __getstate__(self) -> list[dict]:
        return [recipe.to_dict() for recipe in self._recipes.values()]

    def __setstate__(self, state: list[dict]) -> None:
        self.__init__([recipe_from_dict(item) for item in state])

    def __len__(self) -> int:
        return len(self._recipes)

    def __contains__(self, recipe_id: object) -> bool:
        return recipe_id in self._recipes

    def get(self, recipe_id: str) -> Recipe | None:
        return self._recipes.get(recipe_id)

    def ids(self) -> list[str]:
        return sorted(self._recipes)


def is_longitudinal(recipe: Recipe) -> bool:
    return recipe.payload_kind == "tree_node"


def decode_limits(recipe: Recipe) -> dict[str, int]:
    """Exclusive upper bounds of the payload fields of ``recipe`` (``decode_payloads`` limits)."""
    randomizer = recipe.build_randomizer()
    kind = recipe.payload_kind
    if kind in ("bucket", "signed_bucket"):
        return {"bucket": randomizer.message_domain_size}
    if kind == "fragment_bucket":
        return {"bucket": randomizer.message_domain_size, "fragment": randomizer.fragments + 1}
    if kind == "sketch":
        return {"row": randomizer.num_hashes, "column": randomizer.width}
    if kind == "tree_node":
        return {"node": randomizer.message_domain_size, "period": randomizer.periods + 1}
    raise ValueError(f"recipe {recipe.id}: no decoder for payload kind {kind!r}")


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


@dataclass
class BatchAggregate:
    """What one batch of shuffled messages adds: partial accumulators per crowd, the rows to
    dead-letter (positions in the batch) with their reasons, and counters.

    Counters: ``read`` = ``census`` + ``messages`` + Σ ``rejected:<reason>``.
    """

    accumulators: dict[CrowdKey, Accumulator]
    rejected_rows: np.ndarray
    rejected_reasons: list[str]
    counts: dict[str, int]


def _reject(reasons: np.ndarray, rows: np.ndarray, reason: str) -> None:
    target = rows[reasons[rows] == ""]
    reasons[target] = reason


def aggregate_batch(
    batch: pa.RecordBatch,
    instance: int,
    book: RecipeBook,
    supported_versions: Iterable[int],
    dense_limit: int = DENSE_LIMIT,
) -> BatchAggregate:
    """Verify, decode and count one batch of ShuffledMessage rows from shuffler ``instance``.

    Checks, in order: schema version, window bounds, payload CRC32C, a known recipe on its own
    channel, then the payload itself (``schemas.payloads.decode_payloads`` with the recipe's
    payload kind and domain, plus census messages). Everything is vectorized over the batch; the
    only Python loop is over the crowds the batch holds.
    """
    rows = batch.num_rows
    missing = [name for name in MESSAGE_COLUMNS if name not in batch.schema.names]
    reasons = np.full(rows, "", dtype=object)
    counts: dict[str, int] = {"read": rows}
    accumulators: dict[CrowdKey, Accumulator] = {}
    if missing or rows == 0:
        reasons[:] = MISSING_FIELD
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
    order, starts = group_rows(key_columns)
    channel_column = batch.column("channel")
    recipe_column = batch.column("recipe_id")
    crowd_column = batch.column("crowd_id")
    for begin, end in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        group = order[begin:end]
        first = int(group[0])
        recipe_id = recipe_column[first].as_py()
        channel = channel_column[first].as_py()
        crowd_id = crowd_column[first].as_py()
        recipe = book.get(recipe_id) if recipe_id is not None else None
        if recipe is None:
            _reject(reasons, group, UNKNOWN_RECIPE)
            continue
        if channel != recipe.channel:
            _reject(reasons, group, RECIPE_CHANNEL_MISMATCH)
            continue
        live = group[reasons[group] == ""]
        if live.size == 0:
            continue
        decoded = decode_payloads(
            payloads_subset(payloads, live),
            allowed_kinds=(CENSUS, recipe.payload_kind),
            limits=decode_limits(recipe),
        )
        bad = ~decoded.valid
        if bad.any():
            reasons[live[bad]] = decoded.reason_names()[bad]
        census = decoded.is_kind(CENSUS)
        start, stop = int(window_start[first]), int(window_end[first])
        if is_longitudinal(recipe):
            key = (LONGITUDINAL, 0, stop - start, channel, recipe_id, crowd_id)
            _add_longitudinal(
                accumulators, recipe, key, decoded, live, reasons, census, instance, start, stop
            )
        else:
            key = (HISTOGRAM, start, stop, channel, recipe_id, crowd_id)
            randomizer = recipe.build_randomizer()
            accumulator = CrowdAccumulator.empty(randomizer.message_domain_size, dense_limit)
            accumulator.add_census(instance, int(census.sum()))
            columns = message_columns(
                decoded,
                recipe.payload_kind,
                sketch_width=getattr(randomizer, "width", None),
            )
            if recipe.payload_kind == "fragment_bucket":
                no_fragment = decoded.columns["fragment"][decoded.is_kind("fragment_bucket")] < 1
                if no_fragment.any():  # fragments are numbered 1..τ (Algorithm 2)
                    kind_rows = live[decoded.is_kind("fragment_bucket")]
                    reasons[kind_rows[no_fragment]] = "value_out_of_range"
                    columns = {name: col[~no_fragment] for name, col in columns.items()}
            signed = recipe.payload_kind == "signed_bucket"
            accumulator.add_messages(columns["bucket"], columns["sign"] if signed else None)
            accumulators[key] = accumulator
        counts["census"] = counts.get("census", 0) + int(census.sum())
    return _finish(accumulators, reasons, counts)


def _add_longitudinal(
    accumulators: dict[CrowdKey, Accumulator],
    recipe: Recipe,
    key: CrowdKey,
    decoded: DecodedPayloads,
    live: np.ndarray,
    reasons: np.ndarray,
    census: np.ndarray,
    instance: int,
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
    accumulator.add_census(window_start, instance, int(census.sum()))
    is_node = decoded.is_kind("tree_node")
    period = decoded.columns["period"][is_node]
    node = decoded.columns["node"][is_node]
    sign = decoded.columns["sign"][is_node]
    consistent = tree_node_matches_period(node, period, randomizer.periods)
    if not consistent.all():
        reasons[live[is_node][~consistent]] = TREE_NODE_MISMATCH
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


def payloads_subset(payloads: EncodedPayloads, rows: np.ndarray) -> EncodedPayloads:
    """The payloads at ``rows`` as a new EncodedPayloads (one gather, no per-row Python)."""
    lengths = payloads.lengths[rows]
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = payloads.offsets[:-1][rows]
    positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
    return EncodedPayloads(payloads.data[positions], offsets)


def _finish(
    accumulators: dict[CrowdKey, Accumulator], reasons: np.ndarray, counts: dict[str, int]
) -> BatchAggregate:
    rejected = np.flatnonzero(reasons != "")
    rejected_reasons = reasons[rejected].tolist()
    for reason in set(rejected_reasons):
        counts[f"rejected:{reason}"] = rejected_reasons.count(reason)
    counts["messages"] = int(counts["read"] - rejected.size - counts.get("census", 0))
    return BatchAggregate(accumulators, rejected, rejected_reasons, counts)


# ---------------------------------------------------------------------------------------------
# De-biasing
# ---------------------------------------------------------------------------------------------

POSTPROCESSING = ("none", "clip_nonnegative", "norm_sub")
# Sparse sums are expanded to a dense array for estimators that need the whole vector (sketches,
# binary randomized response) up to this many buckets (1 GiB of int64).
MATERIALIZE_LIMIT = 1 << 27


@dataclass(frozen=True, eq=False)
class HistogramResult:
    """The de-biased histogram of one crowd.

    ``estimate`` is unbiased (Invariant 6); ``postprocessed`` (labelled by ``postprocessing``) is
    the optional biased clean-up. Dense results cover every bucket of the randomizer's domain;
    sparse ones (domains above the dense limit) list the buckets that received messages, and
    every other bucket has the estimate ``unobserved_estimate`` with ``unobserved_stderr``.
    ``raw_count`` is the bucket sum behind each estimate when buckets and messages coincide.
    """

    key: CrowdKey
    domain_size: int
    buckets: np.ndarray
    estimate: np.ndarray
    stderr: np.ndarray
    raw_count: np.ndarray | None
    respondents: float
    census: Mapping[int, int]
    messages: int
    postprocessing: str = "none"
    postprocessed: np.ndarray | None = None
    unobserved_estimate: float | None = None
    unobserved_stderr: float | None = None

    @property
    def dense(self) -> bool:
        return self.unobserved_estimate is None


def _elementwise_estimate(randomizer: Any, sums: np.ndarray, n: float) -> HistogramEstimate | None:
    """Estimates of randomizers whose bucket j depends only on S_j and n, for any subset of
    buckets (the same formulas as their ``estimate``); None for the others."""
    if isinstance(randomizer, ReportFragmented):
        return debias_report_fragments(
            sums, n, randomizer.backstop_keep, randomizer.fragment_keep, randomizer.fragments
        )
    if isinstance(randomizer, ZeroSumHistogram):
        return debias_zero_sum(sums, n, randomizer.p)
    if isinstance(randomizer, OneHotRappor | SymmetricOneHot | AsymmetricOneHot):
        return debias_one_hot(sums, n, randomizer.p_one, randomizer.p_zero)
    return None


def estimate_histogram(
    recipe: Recipe,
    key: CrowdKey,
    accumulator: CrowdAccumulator,
    postprocessing: str = "none",
) -> HistogramResult:
    """De-bias one crowd with the recipe's estimator at ``n_eff`` (:func:`effective_respondents`).

    Raises ValueError when no respondent was counted (nothing can be de-biased).
    """
    if postprocessing not in POSTPROCESSING:
        raise ValueError(f"postprocessing must be one of {POSTPROCESSING}, got {postprocessing!r}")
    randomizer = recipe.build_randomizer()
    n_eff = effective_respondents(accumulator.census, recipe.instance_weights)
    if n_eff <= 0:
        raise ValueError(f"{key}: no census message, so no respondent count to de-bias with")
    counts = accumulator.counts
    common = {
        "key": key,
        "respondents": n_eff,
        "census": dict(sorted(accumulator.census.items())),
        "messages": accumulator.messages,
    }
    if not counts.is_dense:
        keys, values = counts.sparse()
        sparse = _elementwise_estimate(randomizer, np.append(values, 0), n_eff)
        if sparse is not None:
            return HistogramResult(
                domain_size=counts.domain_size,
                buckets=keys,
                estimate=sparse.estimate[:-1],
                stderr=sparse.stderr[:-1],
                raw_count=values,
                unobserved_estimate=float(sparse.estimate[-1]),
                unobserved_stderr=float(sparse.stderr[-1]),
                **common,
            )
        if counts.domain_size > MATERIALIZE_LIMIT:
            raise ValueError(
                f"{key}: {recipe.randomizer} over {counts.domain_size} buckets has no sparse "
                f"estimator and is too large to expand (limit {MATERIALIZE_LIMIT})"
            )
    sums = counts.dense()
    result = randomizer.estimate(sums, n_eff)
    postprocessed = None
    if postprocessing == "clip_nonnegative":
        postprocessed = clip_nonnegative(result).estimate
    elif postprocessing == "norm_sub":
        postprocessed = norm_sub(result).estimate
    return HistogramResult(
        domain_size=len(result),
        buckets=np.arange(len(result), dtype=np.int64),
        estimate=result.estimate,
        stderr=result.stderr,
        raw_count=sums if sums.size == len(result) else None,
        postprocessing=postprocessing,
        postprocessed=postprocessed,
        **common,
    )


def sparse_truth(buckets: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique buckets with their summed counts."""
    keys, inverse = np.unique(np.asarray(buckets, dtype=np.int64), return_inverse=True)
    return keys, np.bincount(inverse, weights=np.asarray(counts, np.float64), minlength=keys.size)


def values_at(buckets: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` of sorted ``keys`` looked up at ``buckets`` (0 where a bucket has no key)."""
    if keys.size == 0:
        return np.zeros(len(buckets))
    position = np.clip(np.searchsorted(keys, buckets), 0, keys.size - 1)
    return np.where(keys[position] == buckets, values[position], 0.0)


def histogram_accuracy(
    result: HistogramResult, truth_buckets: np.ndarray, truth_counts: np.ndarray
) -> dict[str, float]:
    """RMSE of the estimate against the truth over all buckets, next to the root mean square
    of the reported standard errors (what the RMSE should be, Invariant 6).

    The estimate counts the n_eff respondents behind the release; when shufflers deleted or
    withheld some, the truth of the whole population is scaled to n_eff first (deletion is
    uniform over respondents, so the survivors' expected histogram is the scaled truth;
    ``truth_scale`` is 1 when nothing was lost). Sparse results are compared over the whole
    domain: buckets that received no message carry ``unobserved_estimate``. Also: the largest
    |error| / stderr and the RMSE of the post-processed values when present.
    """
    truth_buckets = np.asarray(truth_buckets, dtype=np.int64)
    truth_counts = np.asarray(truth_counts, dtype=np.float64)
    if truth_buckets.shape != truth_counts.shape:
        raise ValueError("truth_buckets and truth_counts must have one shape")
    if truth_buckets.size and (
        truth_buckets.min() < 0 or truth_buckets.max() >= result.domain_size
    ):
        raise ValueError(f"truth buckets outside the domain [0, {result.domain_size})")
    total = float(truth_counts.sum())
    scale = result.respondents / total if total > 0 else 1.0
    truth_counts = truth_counts * scale
    domain = result.domain_size
    out: dict[str, float] = {"truth_total": total, "truth_scale": scale}
    if result.dense:
        truth = np.zeros(domain)
        np.add.at(truth, truth_buckets, truth_counts)
        error = result.estimate - truth
        out["rmse"] = float(np.sqrt(np.mean(error**2)))
        out["stderr_rms"] = float(np.sqrt(np.mean(result.stderr**2)))
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(result.stderr > 0, np.abs(error) / result.stderr, 0.0)
        out["max_abs_z"] = float(z.max()) if z.size else 0.0
        if result.postprocessed is not None:
            out["rmse_postprocessed"] = float(np.sqrt(np.mean((result.postprocessed - truth) ** 2)))
        return out
    # Sparse: buckets observed (K), buckets with truth only (T \ K), and the rest at the default.
    keys, values = sparse_truth(truth_buckets, truth_counts)
    observed_truth = values_at(result.buckets, keys, values)
    squared = float(np.sum((result.estimate - observed_truth) ** 2))
    e0 = float(result.unobserved_estimate)
    truth_only = ~np.isin(keys, result.buckets)
    squared += float(np.sum((e0 - values[truth_only]) ** 2))
    rest = domain - result.buckets.size - int(truth_only.sum())
    squared += rest * e0**2
    variance = (
        float(np.sum(result.stderr**2))
        + (domain - result.buckets.size) * float(result.unobserved_stderr) ** 2
    )
    out["rmse"] = math.sqrt(squared / domain)
    out["stderr_rms"] = math.sqrt(variance / domain)
    return out


# ---------------------------------------------------------------------------------------------
# Longitudinal counters
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LongitudinalResult:
    """Marginals f̃_t, t = 1..d, of one round (Algorithm 2, amplification-by-shuffling).

    ``bound``: Theorem 6's error bound α with P(max_t |f̃_t - f_t| > α) <= ``failure_probability``
    at ``respondents`` clients. ``respondents_per_period``: n_eff of each period's window.
    ``messages``: tree-node messages of the crowd over all its rounds.
    """

    key: CrowdKey
    round_start: int
    window_ms: int
    estimate: np.ndarray
    stderr: np.ndarray
    respondents: float
    respondents_per_period: np.ndarray
    bound: float
    failure_probability: float
    messages: int
    notes: tuple[str, ...] = ()

    @property
    def periods(self) -> int:
        return int(self.estimate.size)

    def window_starts(self) -> np.ndarray:
        return self.round_start + np.arange(self.periods, dtype=np.int64) * self.window_ms


def node_periods(periods: int) -> np.ndarray:
    """The period t at which Algorithm 1 reports each flat tree node [h, j]: t = j 2^(h-1)."""
    offsets = tree_node_offsets(periods)
    node = np.arange(2 * periods - 1, dtype=np.int64)
    level = np.searchsorted(offsets, node, side="right")
    j = node - offsets[level - 1] + 1
    return j << (level - 1)


def estimate_longitudinal(
    recipe: Recipe,
    key: CrowdKey,
    accumulator: LongitudinalAccumulator,
    failure_probability: float = 0.05,
) -> list[LongitudinalResult]:
    """Algorithm 2 (A_server, amplification-by-shuffling) for every round in ``accumulator``.

    Each period's window has its own census, so its n_eff_t = Σ_u π_u n_u,t. Node sums reported in
    period t are scaled by n / n_eff_t with n = max_t n_eff_t before the tree sums: randomized
    deletion removes respondents uniformly, so this keeps f̃_t unbiased for the n clients
    (the factor is 1 when nothing was deleted). A period with no census at all (withheld
    everywhere) cannot be rescaled; its nodes count as 0 and a note says so.
    """
    if not 0 < failure_probability < 1:
        raise ValueError(f"failure_probability must be in (0, 1), got {failure_probability}")
    randomizer = recipe.build_randomizer()
    periods = randomizer.periods
    weights = recipe.instance_weights
    reported_at = node_periods(periods)
    results = []
    for round_start in sorted(accumulator.nodes):
        windows = round_start + np.arange(periods, dtype=np.int64) * accumulator.window_ms
        per_period = np.array(
            [
                effective_respondents(
                    {u: c for (w, u), c in accumulator.census.items() if w == window}, weights
                )
                for window in windows.tolist()
            ]
        )
        n = float(per_period.max())
        notes = []
        if n <= 0:
            notes.append("no census message in any period: nothing to estimate")
            continue
        missing = np.flatnonzero(per_period <= 0) + 1
        if missing.size:
            notes.append(
                f"periods {missing.tolist()} have no census (withheld): their tree nodes count as 0"
            )
        scale = np.where(per_period > 0, n / np.where(per_period > 0, per_period, 1.0), 0.0)
        sums = accumulator.nodes[round_start].dense().astype(np.float64) * scale[reported_at - 1]
        result = randomizer.estimate(sums, n)
        results.append(
            LongitudinalResult(
                key=key,
                round_start=int(round_start),
                window_ms=accumulator.window_ms,
                estimate=result.estimate,
                stderr=result.stderr,
                respondents=n,
                respondents_per_period=per_period,
                bound=randomizer.error_bound(max(n, 1.0), failure_probability),
                failure_probability=failure_probability,
                messages=accumulator.messages,
                notes=tuple(notes),
            )
        )
    return results


# ---------------------------------------------------------------------------------------------
# Privacy report
# ---------------------------------------------------------------------------------------------

THEOREM_3_2 = "shuffled_model_histograms_theorem_3_2"
ALGORITHM_3 = "algorithm_3_deletion"


def _finite_or_none(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def amplification_respondents(census: Mapping[int, int], instance_weights: Iterable[float]) -> int:
    """The crowd an amplification bound may count on: the smallest census among the instances
    that released the crowd and receive messages (π_u > 0).

    A respondent's message sits in exactly one instance's release. Per attribute j, each of the
    n_u census respondents of instance u contributes either a message for j there or nothing:
    a randomized response thinned by the routing, still ε_ℓ-DP per bit, so the per-attribute
    amplification of Section III (esa-privacy-revisited) holds among n_u respondents; the FMT
    bounds need nothing more, while Theorem III.1 is the paper's bound for its setting of one
    shuffler per attribute. The weakest instance bounds the guarantee.
    """
    weights = list(instance_weights)
    sizes = [int(count) for u, count in census.items() if count > 0 and weights[int(u)] > 0]
    return min(sizes) if sizes else 0


def privacy_summary(
    recipe: Recipe,
    census: Mapping[int, int],
    deletion: Mapping[int, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The privacy report of one released crowd (DESIGN.md "Results"; Table X).

    * ε_ℓ∞ and ε_ℓ1: Theorem IV.1 (esa-privacy-revisited) with t = τ and t = 1 (both ε_ℓ without
      report fragmentation).
    * ε_c: the tightest valid bound for what was released: attribute-fragmented one-hot
      randomizers use Theorem III.1 (exact and simplified) and the FMT bounds per attribute
      (``privacy.accounting.privacy_report``); report fragments the backstop's guarantee
      (Theorem IV.2); binary randomized response Lemma II.6; the zero-sum protocol its own
      Theorem 3.2 (shuffled-model-histograms) when the crowd is at least the size it was
      calibrated for; anything else (sketches, longitudinal tree nodes, asymmetric one-hot) the
      numerical shuffle bound for the whole report. Bounds outside their validity range are not
      used (``privacy.accounting.amplify`` refuses them).
    * ``epsilon_central_without_attribute_fragmentation``: Table X's comparison for one-hot reports.
    * deletion: each instance that ran Algorithm 3 released a crowd size that is (ε_cr, δ_cr)-DP
      (Theorem V.1); every respondent is counted by every instance, so these add up with ε_c by
      basic composition into ``epsilon_central_total``/``delta_total``.
    """
    randomizer = recipe.build_randomizer()
    delta = float(recipe.delta)
    n = amplification_respondents(census, recipe.instance_weights)
    out: dict[str, Any] = {
        "randomizer": recipe.randomizer,
        "local_model": randomizer.ldp_kind,
        "delta": delta,
        "respondents": n,
        "respondents_effective": effective_respondents(census, recipe.instance_weights),
        "epsilon_central_target": float(recipe.epsilon_central_target),
        "notes": [],
    }
    epsilon_all = float(randomizer.epsilon_local)
    epsilon_one = float(getattr(randomizer, "epsilon_single_fragment", epsilon_all))
    out["epsilon_local_all"] = _finite_or_none(epsilon_all)
    out["epsilon_local_one"] = _finite_or_none(epsilon_one)
    central: dict[str, Any] | None = None
    without: dict[str, Any] | None = None
    if n < 1:
        out["notes"].append("no instance released this crowd: no central guarantee to state")
    elif isinstance(randomizer, OneHotRappor | SymmetricOneHot | ReportFragmented):
        if isinstance(randomizer, ReportFragmented):
            report = privacy_report(
                randomizer.backstop_epsilon,
                n,
                delta,
                fragments=randomizer.fragments,
                epsilon_fragment=randomizer.fragment_epsilon,
            )
        else:
            report = privacy_report(randomizer.epsilon, n, delta)
        central = report.central.to_dict()
        without = report.central_without_attribute_fragmentation.to_dict()
    elif isinstance(randomizer, ZeroSumHistogram):
        if n >= randomizer.respondents:
            central = {
                "epsilon_central": randomizer.central_epsilon,
                "delta": randomizer.central_delta,
                "bound": THEOREM_3_2,
                "bound_description": "Theorem 3.2 (shuffled-model-histograms): (2ε, 2δ) for "
                "crowds of at least the n the protocol was calibrated for",
            }
        else:
            out["notes"].append(
                f"crowd of {n} is below the {randomizer.respondents} respondents the zero-sum "
                "protocol is calibrated for: Theorem 3.2 does not hold, no ε_c is stated"
            )
    else:
        if isinstance(randomizer, BinaryRandomizedResponse):
            guarantee = amplify(epsilon_all, n, delta, BINARY_RR)
        else:
            guarantee = amplify(epsilon_all, n, delta, GENERIC, local_model=randomizer.ldp_kind)
        central = guarantee.to_dict()
        if isinstance(randomizer, LongitudinalClient):
            out["notes"].append(
                "ε_c is per period window (one tree-node report per client and period); the "
                f"whole round of {randomizer.periods} periods is ε_ℓ-LDP (Theorem 5)"
            )
    if central is not None:
        out["epsilon_central"] = _finite_or_none(central["epsilon_central"])
        out["delta"] = float(central["delta"])
        out["bound"] = central["bound"]
        out["bound_description"] = central.get("bound_description", central["bound"])
        out["central"] = central
    else:
        out["epsilon_central"] = None
        out["bound"] = None
    if without is not None:
        out["epsilon_central_without_attribute_fragmentation"] = _finite_or_none(
            without["epsilon_central"]
        )
        out["bound_without_attribute_fragmentation"] = without["bound"]
    losses = []
    if out["epsilon_central"] is not None:
        losses.append(PrivacyLoss(out["epsilon_central"], out["delta"], out["bound"]))
    applied = {int(u): tuple(p) for u, p in (deletion or {}).items() if p is not None}
    if applied:
        out["deletion"] = {
            str(u): {"epsilon": float(eps), "delta": float(dlt)}
            for u, (eps, dlt) in sorted(applied.items())
        }
        losses.extend(
            PrivacyLoss(float(eps), float(dlt), ALGORITHM_3) for eps, dlt in applied.values()
        )
    else:
        out["notes"].append(
            "no randomized deletion (Algorithm 3): crowd sizes were released exactly"
        )
    if out["epsilon_central"] is not None:
        total = compose_basic(losses)
        out["epsilon_central_total"] = float(total.epsilon)
        out["delta_total"] = float(total.delta)
    return out


# ---------------------------------------------------------------------------------------------
# Truth (simulations only) and report assembly
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Truth:
    """True counts of a simulation (``truth.parquet`` of ``esa simulate``): one recipe, counts
    per (window start, bucket); for longitudinal recipes bucket 1 counts clients in state True.
    Applies to crowds of ``recipe_id`` without a crowd ID."""

    recipe_id: str
    window_start: np.ndarray
    bucket: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        arrays = [
            np.asarray(getattr(self, name), dtype=np.int64)
            for name in ("window_start", "bucket", "count")
        ]
        if not arrays[0].shape == arrays[1].shape == arrays[2].shape or arrays[0].ndim != 1:
            raise ValueError("truth window_start, bucket and count must be 1-D of one length")
        for name, array in zip(("window_start", "bucket", "count"), arrays, strict=True):
            object.__setattr__(self, name, array)

    def applies_to(self, key: CrowdKey) -> bool:
        return key[4] == self.recipe_id and key[5] is None

    def window(self, window_start: int) -> tuple[np.ndarray, np.ndarray]:
        """(buckets, counts) of one window."""
        rows = self.window_start == int(window_start)
        return self.bucket[rows], self.count[rows]

    def marginals(self, window_starts: np.ndarray) -> np.ndarray:
        """f_t: bucket-1 counts of each window (NaN where the truth has no such window)."""
        out = np.full(len(window_starts), np.nan)
        for index, start in enumerate(np.asarray(window_starts).tolist()):
            rows = self.window_start == start
            if rows.any():
                out[index] = float(self.count[rows & (self.bucket == 1)].sum())
        return out


def key_fields(key: CrowdKey) -> dict[str, Any]:
    kind, window_start, window_end, channel, recipe_id, crowd_id = key
    fields = {"kind": kind, "channel": channel, "recipe_id": recipe_id, "crowd_id": crowd_id}
    if kind == HISTOGRAM:
        fields.update(window_start=int(window_start), window_end=int(window_end))
    return fields


def missing_instance_note(recipe: Recipe, census: Mapping[int, int]) -> str | None:
    """A note when some instance that receives messages (π_u > 0) released nothing for a crowd."""
    silent = [
        u
        for u, weight in enumerate(recipe.instance_weights)
        if weight > 0 and census.get(u, 0) == 0
    ]
    if not silent:
        return None
    return (
        f"shuffler instance(s) {silent} released nothing for this crowd (withheld, or no input): "
        "n_eff and the estimate cover the other instances' respondents only"
    )


def histogram_report(
    recipe: Recipe,
    result: HistogramResult,
    deletion: Mapping[int, tuple[float, float]] | None,
    accuracy: Mapping[str, float] | None,
    rejected: Mapping[str, int] | None,
) -> dict[str, Any]:
    """The summary.json entry of one histogram crowd."""
    report = key_fields(result.key)
    report.update(
        respondents_effective=result.respondents,
        census_by_instance={str(u): int(c) for u, c in result.census.items()},
        messages=int(result.messages),
        rejected=dict(rejected or {}),
        domain_size=int(result.domain_size),
        buckets_reported=int(result.buckets.size),
        postprocessing=result.postprocessing,
        privacy=privacy_summary(recipe, result.census, deletion),
        notes=[],
    )
    if not result.dense:
        report["unobserved_estimate"] = result.unobserved_estimate
        report["unobserved_stderr"] = result.unobserved_stderr
        report["notes"].append(
            f"sparse domain: {result.buckets.size} of {result.domain_size} buckets received "
            f"messages; every other bucket's estimate is {result.unobserved_estimate:.6g}"
        )
    note = missing_instance_note(recipe, result.census)
    if note:
        report["notes"].append(note)
    if accuracy is not None:
        report["accuracy"] = dict(accuracy)
    return report


def longitudinal_report(
    recipe: Recipe,
    result: LongitudinalResult,
    census: Mapping[int, int],
    deletion: Mapping[int, tuple[float, float]] | None,
    truth: np.ndarray | None,
) -> dict[str, Any]:
    """The summary.json entry of one longitudinal round; with truth, the largest error against
    Theorem 6's bound."""
    report = key_fields(result.key)
    report.update(
        round_start=int(result.round_start),
        window_ms=int(result.window_ms),
        periods=result.periods,
        respondents=result.respondents,
        respondents_per_period=[float(v) for v in result.respondents_per_period],
        messages=int(result.messages),
        error_bound=float(result.bound),
        error_bound_failure_probability=float(result.failure_probability),
        error_bound_source="Theorem 6 (amplification-by-shuffling), explicit constants",
        privacy=privacy_summary(recipe, census, deletion),
        notes=list(result.notes),
    )
    if truth is not None and np.all(np.isfinite(truth)):
        error = np.abs(result.estimate - truth)
        report["accuracy"] = {
            "max_abs_error": float(error.max()),
            "within_bound": bool(error.max() <= result.bound),
            "rmse": float(np.sqrt(np.mean(error**2))),
            "stderr_rms": float(np.sqrt(np.mean(result.stderr**2))),
        }
    return report


# The manifest fields the analyzer reads (never the respondent counts).
MANIFEST_FIELDS = (
    "window_start",
    "window_end",
    "shuffler_instance",
    "channel",
    "recipe_id",
    "crowd_id",
    "status",
    "withheld_reason",
)


def withheld_notes(
    manifests: Iterable[Mapping[str, Any]],
    estimated: Iterable[tuple[int, str, str, str | None]],
) -> list[dict[str, Any]]:
    """Notes for crowds a shuffler withheld, from the releases' manifests (status fields only;
    the respondent counts there stay unused: the analyzer's n comes from census messages).

    ``estimated``: (window_start, channel, recipe_id, crowd_id) of every window that produced an
    estimate. A crowd withheld by every instance gets "no estimate"; one withheld by some
    instances only is also noted in its own entry (:func:`missing_instance_note`).
    """
    estimated = set(estimated)
    notes: dict[tuple, dict[str, Any]] = {}
    for record in manifests:
        if record.get("status") != "WITHHELD":
            continue
        crowd = (
            int(record["window_start"]),
            record["channel"],
            record["recipe_id"],
            record.get("crowd_id"),
        )
        entry = notes.setdefault(
            crowd,
            {
                "window_start": crowd[0],
                "window_end": int(record["window_end"]),
                "channel": crowd[1],
                "recipe_id": crowd[2],
                "crowd_id": crowd[3],
                "withheld_by": {},
            },
        )
        reason = record.get("withheld_reason") or "withheld"
        entry["withheld_by"][str(int(record["shuffler_instance"]))] = reason
    out = []
    for crowd, entry in sorted(notes.items(), key=lambda item: tuple(str(v) for v in item[0])):
        entry["estimated"] = crowd in estimated
        entry["note"] = (
            "withheld by some shuffler instances; estimated from the others"
            if entry["estimated"]
            else "withheld by the shuffler: no estimate for this crowd"
        )
        out.append(entry)
    return out

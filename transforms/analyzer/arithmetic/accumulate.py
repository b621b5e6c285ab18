"""What the analyzer adds up per crowd: bucket sums (dense or sparse), accumulators of
histogram crowds and longitudinal rounds, and the recipes it accepts (:class:`RecipeBook`).

Everything works on numpy arrays of one batch at a time and is tested without a pipeline;
``transforms/analyzer/aggregate.py`` is the thin Beam combiner over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from schemas.recipes import Recipe

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
        self._keys = _EMPTY
        self._values = _EMPTY
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0
        if self.domain_size <= int(dense_limit):
            self._dense = np.zeros(self.domain_size, dtype=np.int64)

    @property
    def is_dense(self) -> bool:
        return self._dense is not None

    def __getstate__(self) -> tuple:
        # Raw int64 bytes, not pickled arrays: Beam encodes an accumulator per crowd and batch,
        # and runners that keep grouped values (FnApiRunner) hold every one of them.
        self.compact()
        dense = None if self._dense is None else self._dense.tobytes()
        return (self.domain_size, dense, self._keys.tobytes(), self._values.tobytes())

    def __setstate__(self, state: tuple) -> None:
        self.domain_size, dense, keys, values = state
        self._dense = None if dense is None else _int64s(dense)
        self._keys, self._values = _int64s(keys), _int64s(values)
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
        """Adds ``other``'s sums into this accumulator (``other``'s sums are left unchanged).

        A sparse accumulator that meets a dense one becomes dense (so the result does not depend
        on the order partial accumulators arrive in)."""
        if other.domain_size != self.domain_size:
            raise ValueError(
                f"cannot merge counts over {other.domain_size} buckets into {self.domain_size}"
            )
        if self._dense is None and other._dense is not None:
            keys, values = self.sparse()
            self._dense = other._dense.copy()
            np.add.at(self._dense, keys, values)
            self._keys = _EMPTY
            self._values = _EMPTY
            return
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

    def copy(self) -> BucketCounts:
        """An independent accumulator with the same sums."""
        out = BucketCounts.__new__(BucketCounts)
        out.__setstate__(self.__getstate__())
        return out

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

    @classmethod
    def from_row(cls, domain_size: int, row: np.ndarray | None) -> BucketCounts:
        """Dense sums held in ``row`` (a writable int64 array of ``domain_size``, taken as it
        is, e.g. a row of a bucket's matrix), or empty sparse sums when ``row`` is None: what
        ``CrowdBucket`` rebuilds its crowds from, without ``__init__``'s checks and zeros."""
        out = cls.__new__(cls)
        out.domain_size = domain_size
        out._dense = row
        out._keys = out._values = _EMPTY
        out._pending = []
        out._pending_size = 0
        return out

    def dense_row(self) -> np.ndarray | None:
        """The dense sums themselves (not a copy: read only), an empty int64 array for sparse
        sums without a bucket, None for sparse sums with buckets (``CrowdBucket`` stores the
        first two as rows of a matrix)."""
        if self._dense is not None:
            return self._dense
        self.compact()
        return _EMPTY if self._keys.size == 0 else None

    def total(self) -> int:
        """Sum over all buckets."""
        if self._dense is not None:
            return int(self._dense.sum())
        return int(self._values.sum()) + int(sum(int(v.sum()) for _, v in self._pending))


# One shared, read-only empty array for every accumulator without sparse keys (most of them).
_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


def _int64s(raw: bytes | np.ndarray) -> np.ndarray:
    """A writable int64 array of ``raw`` (its own copy), or the shared empty one."""
    if isinstance(raw, np.ndarray):  # state of an accumulator pickled as arrays
        raw = raw.astype(np.int64, copy=False).tobytes()
    if not raw:
        return _EMPTY
    return np.frombuffer(bytearray(raw), dtype=np.int64)


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


def _merge_respondents(mine: dict, other: Mapping, what: str) -> None:
    """Respondent counts are stated once per (crowd, instance) by a commit record: two partial
    accumulators never both hold one key, so a repeated key is an error, not a sum."""
    for key, count in other.items():
        if key in mine:
            raise ValueError(f"respondents of {what} {key} stated twice")
        mine[key] = int(count)


def _check_respondents(instance: int, count: int) -> None:
    if int(instance) < 0 or int(count) < 0:
        raise ValueError(f"respondents need instance >= 0 and count >= 0, got {instance}, {count}")


@dataclass
class CrowdAccumulator:
    """Everything the analyzer adds up for one (window, channel, recipe, crowd).

    ``counts`` holds the bucket sums of the decoded randomized messages of all instances;
    ``respondents`` maps shuffler instance -> the respondents that instance's commit record says
    it released for the crowd (never a count of messages); ``messages`` counts decoded randomized
    messages and ``rejected`` counts messages sent to the dead-letter output, by reason.
    """

    counts: BucketCounts
    respondents: dict[int, int]
    messages: int = 0
    rejected: dict[str, int] | None = None

    @classmethod
    def empty(cls, domain_size: int, dense_limit: int = DENSE_LIMIT) -> CrowdAccumulator:
        return cls(BucketCounts(domain_size, dense_limit), {}, 0, {})

    def add_messages(self, buckets: np.ndarray, weights: np.ndarray | None = None) -> None:
        self.counts.add(buckets, weights)
        self.messages += int(np.asarray(buckets).size)

    def set_respondents(self, instance: int, count: int) -> None:
        _check_respondents(instance, count)
        _merge_respondents(self.respondents, {int(instance): int(count)}, "instance")

    def add_rejected(self, reason: str, count: int) -> None:
        if self.rejected is None:
            self.rejected = {}
        self.rejected[reason] = self.rejected.get(reason, 0) + int(count)

    def merge(self, other: CrowdAccumulator) -> None:
        """Adds ``other`` into this accumulator (``other`` is left unchanged)."""
        self.counts.merge(other.counts)
        _merge_respondents(self.respondents, other.respondents, "instance")
        self.messages += other.messages
        for reason, count in (other.rejected or {}).items():
            self.add_rejected(reason, count)

    def copy(self) -> CrowdAccumulator:
        return CrowdAccumulator(
            self.counts.copy(), dict(self.respondents), self.messages, dict(self.rejected or {})
        )


def merge_into(
    crowds: dict[CrowdKey, Accumulator], pairs: Iterable[tuple[CrowdKey, Accumulator]]
) -> dict[CrowdKey, Accumulator]:
    """``crowds`` with each ``(key, accumulator)`` of ``pairs`` added: kept as it is when its
    key is new (the dict takes it over), merged into the one there otherwise."""
    for key, accumulator in pairs:
        mine = crowds.get(key)
        if mine is None:
            crowds[key] = accumulator
        else:
            mine.merge(accumulator)
    return crowds


def merge_accumulators(accumulators: Iterable[CrowdAccumulator]) -> CrowdAccumulator:
    """Sums accumulators into a copy of the first one (no input is modified)."""
    iterator = iter(accumulators)
    try:
        result = next(iterator).copy()
    except StopIteration:
        raise ValueError("merge_accumulators needs at least one accumulator") from None
    for accumulator in iterator:
        result.merge(accumulator)
    return result


class LongitudinalAccumulator:
    """Tree-node sums of one (channel, recipe, crowd) over its d-period rounds (epochs).

    Algorithm 1 (amplification-by-shuffling) sends the report for period t in the period's own
    window, so one round of d periods spans d consecutive windows; a message's round starts at
    ``window_start - (period - 1) * window length``. ``nodes`` maps round start (ms) to the
    2d - 1 node sums (flat order of ``privacy.estimators.tree_node_offsets``); ``respondents``
    maps (window_start, instance) to the respondents that instance's commit record states for
    the period's crowd, so each period has its own respondent count.
    """

    __slots__ = ("node_count", "window_ms", "nodes", "respondents", "messages", "rejected")

    def __init__(self, node_count: int, window_ms: int) -> None:
        if int(node_count) < 1 or int(window_ms) < 1:
            raise ValueError(
                f"need node_count >= 1 and window_ms >= 1, got {node_count}, {window_ms}"
            )
        self.node_count = int(node_count)
        self.window_ms = int(window_ms)
        self.nodes: dict[int, BucketCounts] = {}
        self.respondents: dict[tuple[int, int], int] = {}
        self.messages = 0
        self.rejected: dict[str, int] = {}

    def __getstate__(self) -> tuple:
        return (
            self.node_count,
            self.window_ms,
            self.nodes,
            self.respondents,
            self.messages,
            self.rejected,
        )

    def __setstate__(self, state: tuple) -> None:
        (
            self.node_count,
            self.window_ms,
            self.nodes,
            self.respondents,
            self.messages,
            self.rejected,
        ) = state

    def add_messages(self, round_start: int, nodes: np.ndarray, signs: np.ndarray) -> None:
        counts = self.nodes.get(int(round_start))
        if counts is None:
            counts = self.nodes[int(round_start)] = BucketCounts(self.node_count)
        counts.add(nodes, signs)
        self.messages += int(np.asarray(nodes).size)

    def set_respondents(self, window_start: int, instance: int, count: int) -> None:
        _check_respondents(instance, count)
        key = (int(window_start), int(instance))
        _merge_respondents(self.respondents, {key: int(count)}, "(window, instance)")

    def add_rejected(self, reason: str, count: int) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + int(count)

    def merge(self, other: LongitudinalAccumulator) -> None:
        """Adds ``other`` into this accumulator (``other`` is left unchanged)."""
        if (other.node_count, other.window_ms) != (self.node_count, self.window_ms):
            raise ValueError("cannot merge longitudinal accumulators of different trees or windows")
        for round_start, counts in other.nodes.items():
            mine = self.nodes.get(round_start)
            if mine is None:
                self.nodes[round_start] = counts.copy()
            else:
                mine.merge(counts)
        _merge_respondents(self.respondents, other.respondents, "(window, instance)")
        self.messages += other.messages
        for reason, count in other.rejected.items():
            self.add_rejected(reason, count)

    def copy(self) -> LongitudinalAccumulator:
        out = LongitudinalAccumulator(self.node_count, self.window_ms)
        out.merge(self)
        return out


Accumulator = CrowdAccumulator | LongitudinalAccumulator


def merge_any(accumulators: Iterable[Accumulator | None]) -> Accumulator | None:
    """Sums accumulators of one kind, skipping ``None`` (an empty Beam accumulator), into a new
    accumulator: no input is modified."""
    result = None
    for accumulator in accumulators:
        if accumulator is None:
            continue
        if result is None:
            result = accumulator.copy()
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

    Pickles as its recipes, each as its JSON form with its solved epsilon_local
    (``Recipe.__reduce__``; Beam ships the book to workers), so nothing unpicklable travels.
    """

    def __init__(self, recipes: Mapping[str, Recipe] | Iterable[Recipe]) -> None:
        items = recipes.values() if isinstance(recipes, Mapping) else recipes
        self._recipes: dict[str, Recipe] = {}
        for recipe in items:
            if recipe.id in self._recipes:
                raise ValueError(f"recipe {recipe.id} given twice")
            self._recipes[recipe.id] = recipe

    def __getstate__(self) -> list[Recipe]:
        return list(self._recipes.values())

    def __setstate__(self, state: list[Recipe]) -> None:
        self.__init__(state)

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

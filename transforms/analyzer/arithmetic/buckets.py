"""Crowd buckets of the analyzer: many crowds' partial accumulators as one unit of work.

The analyzer adds, estimates and writes crowds a bucket at a time (issue: memory flat in the
number of crowds): a crowd's bucket is ``schemas.release.crowd_buckets.crowd_bucket`` of its channel,
recipe and crowd ID (never of window or instance, so every instance's parts of a crowd meet),
and the unit key adds the crowd key's kind and window (:func:`bucket_key`). A
:class:`CrowdBucket` holds the partial accumulators of its crowds and the withheld-crowd records
of their commit records; it crosses a pipeline's groupings as one compressed blob
(:meth:`CrowdBucket.pack`), never as one element or one Python object per crowd.

Pure: numpy, Arrow (a verified crowd table's columns and LZ4), pickle; no Beam.
"""

from __future__ import annotations

import itertools
import math
import operator
import pickle
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.release.crowd_buckets import (
    DEFAULT_CROWD_BUCKETS,
    MAX_CROWD_BUCKETS,
    crowd_bucket,
    crowd_buckets_of,
)
from schemas.release.crowd_tables import CrowdColumns, crowd_table_buckets
from transforms.analyzer.arithmetic.accumulate import (
    HISTOGRAM,
    Accumulator,
    BucketCounts,
    CrowdAccumulator,
    CrowdKey,
    RecipeBook,
    _check_respondents,
    _merge_respondents,
    is_longitudinal,
    merge_into,
)
from transforms.analyzer.arithmetic.batches import (
    CrowdRows,
    crowd_key,
    respondent_accumulators,
)

# The analyzer's own number of crowd buckets (independent of any shuffler's): at least this many,
# more when there are many crowds (:func:`analyzer_buckets`).
ANALYZER_BUCKETS = DEFAULT_CROWD_BUCKETS
# At most about this many crowds per bucket and window (:func:`analyzer_buckets`).
CROWDS_PER_BUCKET = 1000


def analyzer_buckets(crowds: int, crowds_per_bucket: int = CROWDS_PER_BUCKET) -> int:
    """Crowd buckets for ``crowds`` crowds in the largest unit of analysis (a kind and window;
    all crowds of every window bound it): enough that a bucket of that unit holds at most about
    ``crowds_per_bucket`` crowds, so what a worker holds of one bucket (its crowds'
    accumulators, reports and rows) does not grow with the crowds; at least
    :data:`ANALYZER_BUCKETS`, at most ``MAX_CROWD_BUCKETS``."""
    wanted = math.ceil(max(0, int(crowds)) / max(1, int(crowds_per_bucket)))
    return min(MAX_CROWD_BUCKETS, max(ANALYZER_BUCKETS, wanted))


# (kind, window_start, window_end, bucket): window_start 0 and window_end the window length for
# longitudinal crowds, as in their crowd keys (a round spans windows).
AnalysisBucketKey = tuple[str, int, int, int]
# A withheld crowd as one instance's commit record states it:
# (window_start_ms, window_end_ms, channel, recipe_id, crowd_id, instance).
WithheldRecord = tuple[int, int, str, str, "str | None", int]


def bucket_key(key: CrowdKey, buckets: int = ANALYZER_BUCKETS) -> AnalysisBucketKey:
    """The unit a crowd is added, estimated and written in."""
    kind, start, stop, channel, recipe_id, crowd_id = key
    return (kind, int(start), int(stop), crowd_bucket(channel, recipe_id, crowd_id, buckets))


def crowd_sort_key(key: CrowdKey) -> tuple:
    """A total order of crowd keys (a null crowd ID before every string)."""
    kind, start, stop, channel, recipe_id, crowd_id = key
    return (kind, start, stop, channel, recipe_id, crowd_id is not None, crowd_id or "")


# A bucket folds the packed buckets added to it (:meth:`CrowdBucket.add`) once they hold at least
# this many bytes, or as many as its own packed content.
PENDING_BYTES = 1 << 16
# Histogram crowds of domains up to this size are packed as rows of one matrix per domain size
# (:class:`_Rows`); larger domains, sparse sums and longitudinal crowds as pickled objects.
ROW_DOMAIN_LIMIT = 1 << 12
_ROWS_FORMAT = "rows/2"
# A packed bucket is its pickled state compressed whole with LZ4 (frame format) after its
# length: the 376 buckets (12 MB pickled) of bench_crowds' 99,518-crowd analysis compressed
# and decompressed in 13-16 ms against 38-60 ms with zstd at level 1 (two runs), at 17% of the
# bytes against 9%; zstd was itself a third of zlib's time.
_BLOB_CODEC = pa.Codec("lz4")
_BLOB_SIZE = struct.Struct("<Q")


def _compressed(state: Any) -> bytes:
    """``state`` pickled and compressed (read back by :func:`_decompressed`)."""
    data = pickle.dumps(state, pickle.HIGHEST_PROTOCOL)
    return _BLOB_SIZE.pack(len(data)) + _BLOB_CODEC.compress(data, asbytes=True)


def _decompressed(blob: bytes) -> Any:
    """The state :func:`_compressed` packed."""
    (size,) = _BLOB_SIZE.unpack_from(blob)
    return pickle.loads(
        _BLOB_CODEC.decompress(memoryview(blob)[_BLOB_SIZE.size :], decompressed_size=size)
    )


def _narrow(values: np.ndarray) -> tuple[str, bytes]:
    """Integers as the bytes of the smallest signed type holding them (with that type's name;
    read back by :func:`_widened`): counts are mostly small, so a blob is mostly smaller."""
    dtype = np.dtype(np.int64)
    if values.size:
        low, high = int(values.min()), int(values.max())
        for candidate in (np.int8, np.int16, np.int32):
            info = np.iinfo(candidate)
            if info.min <= low and high <= info.max:
                dtype = np.dtype(candidate)
                break
    return dtype.str, values.astype(dtype, copy=False).tobytes()


def _widened(narrowed: tuple[str, bytes]) -> np.ndarray:
    """The writable int64 array :func:`_narrow` gave the bytes of."""
    dtype, data = narrowed
    return np.frombuffer(data, dtype=np.dtype(dtype)).astype(np.int64)


def _shared_names(keys: list[CrowdKey]) -> list[CrowdKey]:
    """``keys`` (equal tuples) holding one string object per distinct kind, channel and recipe
    ID: pickle memoizes an object, so a name many keys share is written once."""
    names: dict[str, str] = {}
    name = names.setdefault
    return [
        (name(kind, kind), start, stop, name(channel, channel), name(recipe_id, recipe_id), crowd)
        for kind, start, stop, channel, recipe_id, crowd in keys
    ]


class _Rows:
    """Histogram crowds of one message domain size as columns: their keys, whether each one's
    sums are dense (else empty and sparse: a commit record's n_u only), the sums as the rows of
    one int64 matrix, the messages, the respondents per instance and the rejections. What
    :class:`CrowdBucket` packs, adds and unpacks without a Python object per crowd.

    The keys' kinds, channels and recipe IDs are packed as one string object per distinct name
    (:func:`_shared_names`, once: ``names_shared``), which pickle writes once and later
    references, and which unpickled keys share again."""

    __slots__ = (
        "domain",
        "keys",
        "dense",
        "counts",
        "messages",
        "respondents",
        "rejected",
        "names_shared",
    )

    def __init__(
        self,
        domain: int,
        keys: list[CrowdKey],
        dense: np.ndarray,
        counts: np.ndarray,
        messages: np.ndarray,
        respondents: list[dict[int, int]],
        rejected: list[dict[str, int] | None],
    ) -> None:
        self.domain, self.keys, self.dense, self.counts = domain, keys, dense, counts
        self.messages, self.respondents, self.rejected = messages, respondents, rejected
        self.names_shared = False

    def state(self) -> tuple:
        if not self.names_shared:
            self.keys, self.names_shared = _shared_names(self.keys), True
        return (
            self.domain,
            self.keys,
            self.dense.tobytes(),
            _narrow(self.counts),
            _narrow(self.messages),
            self.respondents,
            self.rejected,
        )

    @classmethod
    def from_state(cls, state: tuple) -> _Rows:
        domain, keys, dense, counts, messages, respondents, rejected = state
        rows = len(keys)
        out = cls(
            domain,
            keys,
            np.frombuffer(bytearray(dense), dtype=bool),
            _widened(counts).reshape(rows, domain),
            _widened(messages),
            respondents,
            rejected,
        )
        out.names_shared = True  # as state() packed them
        return out

    def accumulator(self, row: int) -> CrowdAccumulator:
        """Crowd ``row`` as an accumulator (its dense sums a writable row of the matrix)."""
        counts = self.counts[row] if self.dense[row] else None
        sums = BucketCounts.from_row(self.domain, counts)
        messages = int(self.messages[row])
        return CrowdAccumulator(sums, self.respondents[row], messages, self.rejected[row])

    def accumulators(self) -> Iterator[tuple[CrowdKey, CrowdAccumulator]]:
        """The crowds as accumulators; their dense sums are writable rows of the matrix."""
        domain, counts, dense = self.domain, self.counts, self.dense.tolist()
        make = BucketCounts.from_row
        for row, (key, respondents, messages, rejected) in enumerate(
            zip(self.keys, self.respondents, self.messages.tolist(), self.rejected, strict=True)
        ):
            sums = make(domain, counts[row] if dense[row] else None)
            yield key, CrowdAccumulator(sums, respondents, messages, rejected)


def _add_rejected(mine: dict[str, int] | None, other: dict[str, int] | None) -> Any:
    """``CrowdAccumulator.merge``'s rejections, into a new dict (``mine`` may be shared)."""
    if not other:
        return mine
    out = dict(mine or {})
    for reason, count in other.items():
        out[reason] = out.get(reason, 0) + int(count)
    return out


def _add_rows(parts: list[_Rows]) -> _Rows:
    """The crowds of ``parts`` (one domain size) added up: keys in order of first appearance,
    a crowd's parts merged in order (``CrowdAccumulator.merge``: sums added, sparse + dense is
    dense, respondents stated twice refused, rejections added), with numpy over the rows."""
    if len(parts) == 1:
        return parts[0]
    keys = [key for part in parts for key in part.keys]
    index: dict[CrowdKey, int] = {}
    position = np.fromiter(
        (index.setdefault(key, len(index)) for key in keys), dtype=np.int64, count=len(keys)
    )
    counts = np.concatenate([part.counts for part in parts])
    dense = np.concatenate([part.dense for part in parts])
    messages = np.concatenate([part.messages for part in parts])
    respondents = [r for part in parts for r in part.respondents]
    rejected = [r for part in parts for r in part.rejected]
    domain = parts[0].domain
    shared = all(part.names_shared for part in parts)  # a few objects per name: still shared
    if len(index) == len(keys):  # no crowd in two parts
        out = _Rows(domain, keys, dense, counts, messages, respondents, rejected)
        out.names_shared = shared
        return out
    crowds = len(index)
    added = np.zeros((crowds, domain), dtype=np.int64)
    np.add.at(added, position, counts)
    any_dense = np.bincount(position, weights=dense, minlength=crowds) > 0
    added_messages = np.zeros(crowds, dtype=np.int64)
    np.add.at(added_messages, position, messages)
    merged_respondents: list[Any] = [None] * crowds
    merged_rejected: list[Any] = [None] * crowds
    copied = np.zeros(crowds, dtype=bool)
    for row, stated, rejections in zip(position.tolist(), respondents, rejected, strict=True):
        mine = merged_respondents[row]
        if mine is None:
            merged_respondents[row], merged_rejected[row] = stated, rejections
            continue
        if stated:
            if not mine and all(type(count) is int for count in stated.values()):
                merged_respondents[row] = stated  # what merging it into {} would make
            else:
                if not copied[row]:  # a part's own dict is never changed
                    mine = merged_respondents[row] = dict(mine)
                    copied[row] = True
                _merge_respondents(mine, stated, "instance")
        if rejections:
            merged_rejected[row] = _add_rejected(merged_rejected[row], rejections)
    out = _Rows(
        domain,
        list(index),
        any_dense,
        added,
        added_messages,
        merged_respondents,
        merged_rejected,
    )
    out.names_shared = shared
    return out


class _Content:
    """A bucket's crowds as :class:`_Rows` per domain size and other accumulators by key, and
    its withheld records: a bucket unpacked without an object per histogram crowd."""

    __slots__ = ("rows", "others", "withheld")

    def __init__(
        self,
        rows: dict[int, _Rows],
        others: dict[CrowdKey, Accumulator],
        withheld: list[WithheldRecord],
    ) -> None:
        self.rows, self.others, self.withheld = rows, others, withheld

    @classmethod
    def of(cls, crowds: Mapping[CrowdKey, Accumulator], withheld: list[WithheldRecord]) -> _Content:
        """The accumulators ``crowds`` as rows where they can be (their sums are copied)."""
        gathered: dict[int, tuple[list, list, list, list, list]] = {}
        others: dict[CrowdKey, Accumulator] = {}
        for key, accumulator in crowds.items():
            if type(accumulator) is CrowdAccumulator:
                counts = accumulator.counts
                domain = counts.domain_size
                row = counts.dense_row() if domain <= ROW_DOMAIN_LIMIT else None
                if row is not None:
                    columns = gathered.get(domain)
                    if columns is None:
                        columns = gathered[domain] = ([], [], [], [], [])
                    columns[0].append(key)
                    columns[1].append(row)
                    columns[2].append(accumulator.messages)
                    columns[3].append(accumulator.respondents)
                    columns[4].append(accumulator.rejected)
                    continue
            others[key] = accumulator
        rows = {}
        for domain, (keys, sums, messages, respondents, rejected) in gathered.items():
            dense = np.array([row.size > 0 for row in sums], dtype=bool)
            counts = np.zeros((len(keys), domain), dtype=np.int64)
            if dense.any():
                counts[dense] = np.stack([row for row in sums if row.size])
            rows[domain] = _Rows(
                domain,
                keys,
                dense,
                counts,
                np.array(messages, dtype=np.int64),
                list(respondents),
                list(rejected),
            )
        return cls(rows, others, withheld)

    def state(self) -> tuple:
        return (
            _ROWS_FORMAT,
            [rows.state() for rows in self.rows.values()],
            self.others,
            self.withheld,
        )

    @classmethod
    def from_state(cls, state: tuple) -> _Content:
        _, rows, others, withheld = state
        return cls({item[0]: _Rows.from_state(item) for item in rows}, others, withheld)

    def accumulators(self) -> dict[CrowdKey, Accumulator]:
        """Every crowd as an accumulator (parts of one crowd merged)."""
        crowds: dict[CrowdKey, Accumulator] = {}
        for rows in self.rows.values():
            merge_into(crowds, rows.accumulators())
        return merge_into(crowds, self.others.items())

    def densify(self, dense_limit: int) -> None:
        for domain, rows in self.rows.items():
            if domain <= dense_limit:
                rows.dense = np.ones(len(rows.keys), dtype=bool)
        _densify(self.others.values(), dense_limit)


# What CrowdBucket.content gives: rows per domain size, other accumulators, withheld records.
BucketContent = _Content


def _add_contents(parts: list[_Content]) -> _Content | None:
    """``parts`` added up in order (rows with numpy: :func:`_add_rows`), or None when a crowd
    is rows in one part and an object in another (the caller then merges accumulators)."""
    if len(parts) == 1:
        return parts[0]
    if any(part.others for part in parts):
        in_rows = {key for part in parts for rows in part.rows.values() for key in rows.keys}
        if any(key in in_rows for part in parts for key in part.others):
            return None
    by_domain: dict[int, list[_Rows]] = {}
    for part in parts:
        for domain, rows in part.rows.items():
            by_domain.setdefault(domain, []).append(rows)
    others: dict[CrowdKey, Accumulator] = {}
    for part in parts:
        merge_into(others, part.others.items())
    withheld = [record for part in parts for record in part.withheld]
    return _Content({d: _add_rows(rows) for d, rows in by_domain.items()}, others, withheld)


def _densify(accumulators: Iterable[Accumulator], dense_limit: int) -> None:
    for accumulator in accumulators:
        counts = getattr(accumulator, "counts", None)
        if isinstance(counts, BucketCounts) and not counts.is_dense:
            if counts.domain_size <= dense_limit:
                counts.merge(BucketCounts(counts.domain_size, dense_limit))


class CrowdBucket:
    """The partial accumulators of one bucket's crowds (crowd key -> accumulator) and the
    withheld records of those crowds.

    ``merge`` adds another bucket without changing it (crowds it holds that this one lacks are
    copied). Pickled, a bucket is one compressed blob (LZ4) and stays one until it is read again
    (:meth:`pack`), so a runner that holds grouped values decoded keeps a bytes object per
    bucket, not Python objects per crowd. Inside the blob the histogram crowds of small domains
    are columns (:class:`_Rows`: keys, one matrix of sums, respondents), so packing, unpacking
    and adding buckets (:meth:`add`) cost numpy work and C-level pickling per crowd, not
    Python objects; an accumulator per crowd is made only when :attr:`crowds` or
    :meth:`items` is read. :meth:`add` keeps a combiner's buckets packed too: an added bucket
    waits as its blob, and the waiting blobs are folded in (unpacked, added as rows, packed
    again) once they weigh as much as the bucket's own blob, so adding costs amortized O(log)
    unpacks per crowd and a combiner holding every bucket (Beam's lifted combine keeps every
    key's accumulator until its bundle ends) holds compressed bytes. An empty bucket takes the
    first bucket added as its own blob, and :meth:`densify` of a packed bucket waits (with the
    blob, pickled too) until the content is read, so a bucket combined from one input and
    densified crosses the combiner without being unpacked and packed again.
    """

    __slots__ = (
        "_crowds",
        "_withheld",
        "_content",
        "_packed",
        "_pending",
        "_pending_bytes",
        "_dense_limit",
    )

    def __init__(
        self,
        crowds: Mapping[CrowdKey, Accumulator] | None = None,
        withheld: Iterable[WithheldRecord] = (),
    ) -> None:
        self._crowds: dict[CrowdKey, Accumulator] | None = dict(crowds or {})
        self._withheld: list[WithheldRecord] | None = list(withheld)
        self._content: _Content | None = None
        self._packed: bytes | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        # densify(limit) not yet applied to the packed blob
        self._dense_limit: int | None = None

    @classmethod
    def of_content(cls, content: _Content) -> CrowdBucket:
        """A bucket holding ``content`` (its own from now on)."""
        out = cls()
        out._crowds = out._withheld = None
        out._content = content
        return out

    def _own_content(self) -> _Content:
        """This bucket's content as rows, the waiting blobs added (the objects are let go)."""
        if self._crowds is not None:
            content = _Content.of(self._crowds, self._withheld or [])
        elif self._content is not None:
            content = self._content
        else:
            content = _unpack(self._packed)
        self._crowds = self._withheld = None
        self._content, self._packed = content, None
        if self._dense_limit is not None:  # waiting since before any pending blob was added
            content.densify(self._dense_limit)
            self._dense_limit = None
        if self._pending:
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            parts = [content, *(_unpack(blob) for blob in pending)]
            added = _add_contents(parts)
            if added is None:  # a crowd in rows and as an object: merged as accumulators
                crowds = parts[0].accumulators()
                for part in parts[1:]:
                    merge_into(crowds, part.accumulators().items())
                withheld = [record for part in parts for record in part.withheld]
                added = _Content.of(crowds, withheld)
            self._content = added
        return self._content

    def content(self) -> BucketContent:
        """The bucket as :class:`_Rows` per domain size, other accumulators by key and withheld
        records, without an accumulator per row crowd (read only: the bucket's own)."""
        return self._own_content()

    def _open(self) -> tuple[dict[CrowdKey, Accumulator], list[WithheldRecord]]:
        if self._crowds is None or self._pending:
            content = self._own_content()
            self._crowds, self._withheld = content.accumulators(), content.withheld
            self._content = None
        return self._crowds, self._withheld  # type: ignore[return-value]

    def pack(self) -> CrowdBucket:
        """Compress the content into one blob (read back on first use); returns ``self``."""
        if self._packed is None or self._pending:
            state = self._own_content().state()
            self._packed = _compressed(state)
            self._content = None
        return self

    def add(self, other: CrowdBucket) -> None:
        """Adds ``other`` (its value unchanged) lazily, keeping this bucket packed (an empty
        bucket takes ``other``'s blob as its own)."""
        state = other.__getstate__()
        if self._is_new():
            self.__setstate__(state)
            return
        if self._dense_limit is not None:  # densified before other was added
            self._own_content()
        if isinstance(state, bytes):
            blobs = [state]
        elif len(state) == 3 and state[1] is None:  # other's blob and the blobs waiting in it
            blobs = [state[0], *state[2]]
        else:  # other's waiting densify applied to its blob first
            other._own_content()
            blobs = [other.__getstate__()]
        self._pending.extend(blobs)
        self._pending_bytes += sum(map(len, blobs))
        if self._pending_bytes >= max(PENDING_BYTES, len(self._packed or b"")):
            self.pack()

    def compact(self) -> CrowdBucket:
        """What a combiner does before a bucket crosses a grouping: :meth:`pack` a bucket that
        holds objects; a bucket that is only blobs (its own and those :meth:`add` left waiting)
        is left so, and crosses as them (:meth:`__getstate__`), to be folded where it is read:
        folding here would unpack them, add them and pack the sum, which the reader would
        unpack again. Returns ``self``."""
        if not self._blobs_only():
            self.pack()
        return self

    def _blobs_only(self) -> bool:
        """Whether the content is the packed blob and the waiting ones, nothing unpacked."""
        return self._crowds is None and self._content is None and self._dense_limit is None

    def _is_new(self) -> bool:
        """Whether nothing was put in this bucket yet (as made by ``CrowdBucket()``)."""
        return (
            self._packed is None
            and self._content is None
            and not self._pending
            and not self._crowds
            and not self._withheld
            and self._dense_limit is None
        )

    def __getstate__(self) -> bytes | tuple[bytes, int] | tuple[bytes, None, tuple[bytes, ...]]:
        """The blob (:meth:`pack`), with the limit of a :meth:`densify` still to apply; a
        bucket that is only blobs with some waiting (:meth:`compact`): its blob, None and the
        waiting blobs, none of them opened."""
        if self._pending and self._blobs_only():
            return self._packed or b"", None, tuple(self._pending)
        self.pack()
        if self._dense_limit is not None:
            return self._packed or b"", self._dense_limit
        return self._packed or b""

    def __setstate__(
        self, state: bytes | tuple[bytes, int] | tuple[bytes, None, tuple[bytes, ...]]
    ) -> None:
        self._crowds = self._withheld = None
        self._content = None
        self._pending = []
        if isinstance(state, bytes):
            self._packed, self._dense_limit = state, None
        elif len(state) == 3:
            self._packed, self._dense_limit = state[0], None
            self._pending = list(state[2])
        else:
            self._packed, self._dense_limit = state
        self._pending_bytes = sum(map(len, self._pending))

    def __len__(self) -> int:
        return len(self._open()[0])

    def __repr__(self) -> str:
        crowds, withheld = self._open()
        return f"CrowdBucket({len(crowds)} crowds, {len(withheld)} withheld records)"

    @property
    def crowds(self) -> dict[CrowdKey, Accumulator]:
        """Crowd key -> accumulator (the bucket's own: do not modify)."""
        return self._open()[0]

    @property
    def withheld(self) -> list[WithheldRecord]:
        return self._open()[1]

    def items(self) -> Iterator[tuple[CrowdKey, Accumulator]]:
        """The crowds in :func:`crowd_sort_key` order."""
        crowds = self._open()[0]
        for key in sorted(crowds, key=crowd_sort_key):
            yield key, crowds[key]

    def merge(self, other: CrowdBucket) -> None:
        """Adds ``other`` into this bucket (``other`` is left unchanged)."""
        crowds, withheld = self._open()
        for key, accumulator in other.crowds.items():
            mine = crowds.get(key)
            if mine is None:
                crowds[key] = accumulator.copy()
            else:
                mine.merge(accumulator)
        withheld.extend(other.withheld)

    def copy(self) -> CrowdBucket:
        out = CrowdBucket()
        out.merge(self)
        return out

    def densify(self, dense_limit: int) -> None:
        """Histogram crowds of domains up to ``dense_limit`` counted densely, also those whose
        only parts were respondent counts (kept sparse, i.e. empty, while they travel); of a
        packed bucket when it is next read."""
        if self._crowds is None and self._content is None and not self._pending:
            limit = self._dense_limit
            self._dense_limit = dense_limit if limit is None else max(limit, int(dense_limit))
            return
        if self._crowds is None or self._pending:  # as rows: a flag per crowd
            self._own_content().densify(dense_limit)
            return
        _densify(self._open()[0].values(), dense_limit)


def _unpack(blob: bytes | None) -> _Content:
    if not blob:
        return _Content({}, {}, [])
    state = _decompressed(blob)
    if len(state) == 2:  # a blob of accumulators by key (no rows)
        crowds, withheld = state
        return _Content({}, crowds, withheld)
    return _Content.from_state(state)


def bucket_accumulators(
    accumulators: Mapping[CrowdKey, Accumulator],
    buckets: int = ANALYZER_BUCKETS,
    rows: Sequence[CrowdRows] = (),
    known: dict[tuple[Any, Any, Any], int] | None = None,
    every_crowd_in: int | None = None,
) -> dict[AnalysisBucketKey, CrowdBucket]:
    """Partial accumulators per crowd (one batch's) as partial buckets; ``rows``: more of the
    batch's crowds as :class:`CrowdRows` (``aggregate_batch(as_rows=True)``), put into their
    buckets' rows with numpy (no accumulator per crowd), the crowds of a bucket that also
    holds accumulators made accumulators. ``known``: ``(channel, recipe_id, crowd_id)`` ->
    bucket of earlier calls with the same ``buckets`` (:func:`crowd_buckets_known`).
    ``every_crowd_in``: the crowd bucket of every crowd of the batch, when the caller knows it
    (no crowd hashed; ``transforms.analyzer.aggregate.release_file_analyzer_bucket``)."""
    out: dict[AnalysisBucketKey, CrowdBucket] = {}
    keys = list(accumulators)

    def buckets_of(keys: Sequence[CrowdKey]) -> list[int]:
        if every_crowd_in is not None:
            return [every_crowd_in] * len(keys)
        return _buckets_of(keys, buckets, known)

    for key, bucket in zip(keys, buckets_of(keys), strict=True):
        unit = (key[0], int(key[1]), int(key[2]), bucket)
        partial = out.get(unit)
        if partial is None:
            partial = out[unit] = CrowdBucket()
        partial.crowds[key] = accumulators[key]
    contents: dict[AnalysisBucketKey, _Content] = {}  # units of rows only
    for part in rows:
        if not part.keys:
            continue
        index, codes = _row_units(part.keys, buckets_of(part.keys))
        order = np.argsort(codes, kind="stable")  # each unit's crowds in the batch's order
        bounds = np.searchsorted(codes[order], np.arange(len(index) + 1)).tolist()
        for code, unit in enumerate(index):
            chosen = order[bounds[code] : bounds[code + 1]]
            unit_keys = [part.keys[row] for row in chosen.tolist()]
            partial = out.get(unit)
            if partial is not None or part.domain > ROW_DOMAIN_LIMIT:
                if partial is None:
                    partial = out[unit] = CrowdBucket()
                picked = CrowdRows(part.domain, unit_keys, part.sums[chosen], part.messages[chosen])
                partial.crowds.update(picked.accumulators())
                continue
            crowds_in = len(unit_keys)
            content = contents.get(unit)
            if content is None:
                content = contents[unit] = _Content({}, {}, [])
            found = _Rows(
                part.domain,
                unit_keys,
                np.ones(crowds_in, dtype=bool),
                part.sums[chosen],
                part.messages[chosen],
                [{} for _ in range(crowds_in)],
                [{} for _ in range(crowds_in)],
            )
            held = content.rows.get(part.domain)  # aggregate_batch gives one part per domain
            content.rows[part.domain] = found if held is None else _add_rows([held, found])
    for unit, content in contents.items():
        out[unit] = CrowdBucket.of_content(content)
    return out


# Most crowds a ``known`` map of :func:`bucket_accumulators` holds (it is emptied when full).
KNOWN_BUCKETS_LIMIT = 1 << 16


def _row_units(
    keys: Sequence[CrowdKey], crowd_buckets: list[int]
) -> tuple[dict[AnalysisBucketKey, int], np.ndarray]:
    """The analysis units of crowds (keys with their crowd buckets), numbered in the order of
    their first crowd, and each crowd's unit number. Keys of one window (a release file's
    batch) differ in their bucket only: numbered by bucket, no tuple made per crowd."""
    heads = set(map(_WINDOW_OF_KEY, keys))
    if len(heads) == 1:
        kind, start, stop = heads.pop()
        number = {bucket: code for code, bucket in enumerate(dict.fromkeys(crowd_buckets))}
        codes = np.fromiter(map(number.__getitem__, crowd_buckets), np.int64, len(crowd_buckets))
        return {(kind, int(start), int(stop), b): code for b, code in number.items()}, codes
    index: dict[AnalysisBucketKey, int] = {}
    codes = np.fromiter(
        (
            index.setdefault((key[0], int(key[1]), int(key[2]), bucket), len(index))
            for key, bucket in zip(keys, crowd_buckets, strict=True)
        ),
        dtype=np.int64,
        count=len(keys),
    )
    return index, codes


# A crowd key's kind and window (what its analysis unit has besides the crowd bucket).
_WINDOW_OF_KEY = operator.itemgetter(0, 1, 2)


def crowd_buckets_known(
    crowds: Sequence[tuple[Any, Any, Any]],
    buckets: int,
    known: dict[tuple[Any, Any, Any], int],
    limit: int = KNOWN_BUCKETS_LIMIT,
) -> list[int]:
    """``crowd_buckets_of(crowds, buckets)``, hashing only the crowds ``known`` (a map of
    earlier calls with the same ``buckets``) lacks, and adding them to it; a map that would
    pass ``limit`` crowds is emptied first (memory stays flat whatever the crowds)."""
    out = list(map(known.get, crowds))  # one look-up per crowd; None where unknown
    if None not in out:
        return out
    missing = [crowd for crowd, bucket in zip(crowds, out, strict=True) if bucket is None]
    found = dict(zip(missing, crowd_buckets_of(missing, buckets), strict=True))
    out = [found[crowd] if bucket is None else bucket
           for crowd, bucket in zip(crowds, out, strict=True)]  # fmt: skip
    if len(known) + len(found) > limit:
        known.clear()
    if len(found) <= limit:
        known.update(found)
    return out


def _buckets_of(
    keys: Sequence[CrowdKey], buckets: int, known: dict[tuple[Any, Any, Any], int] | None
) -> list[int]:
    """The crowd bucket of each crowd key (:func:`bucket_key`'s last field)."""
    crowds = [key[3:] for key in keys]
    if known is None:
        return crowd_buckets_of(crowds, buckets)
    return crowd_buckets_known(crowds, buckets, known)


class _CommitUnits:
    """What :func:`commit_buckets` gathers per analysis unit, in the order each unit is first
    touched: rows by domain (the crowd keys in order with their respondents), other
    accumulators by key, withheld records."""

    def __init__(self, book: RecipeBook) -> None:
        self.book = book
        self.units: dict[AnalysisBucketKey, tuple[dict, dict, list]] = {}
        self.first: dict[AnalysisBucketKey, int] = {}  # index of the first crowd in a unit
        self.domains: dict[str, int | None] = {}  # recipe id -> its rows' domain (None: objects)

    def parts(self, unit: AnalysisBucketKey, index: int) -> tuple[dict, dict, list]:
        parts = self.units.get(unit)
        if parts is None:
            parts = self.units[unit] = ({}, {}, [])  # rows by domain, other accumulators, withheld
            self.first[unit] = index
        elif index < self.first[unit]:
            self.first[unit] = index
        return parts

    def domain(self, recipe_id: Any) -> int | None:
        """The message domain of a recipe's row crowds; None for a longitudinal or large
        domain, or an unknown recipe."""
        if recipe_id not in self.domains:
            recipe = self.book.get(recipe_id)
            domain = None
            if recipe is not None and not is_longitudinal(recipe):
                size = recipe.build_randomizer().message_domain_size
                domain = size if size <= ROW_DOMAIN_LIMIT else None
            self.domains[recipe_id] = domain
        return self.domains[recipe_id]

    def add(self, index: int, instance: int, crowd: Mapping[str, Any], bucket: Any) -> None:
        """Crowd number ``index`` (``bucket``: its :func:`bucket_key` bucket when known, else a
        callable giving a crowd key's unit)."""

        def unit_of(key: CrowdKey) -> tuple[dict, dict, list]:
            if callable(bucket):
                return self.parts(bucket(key), index)
            return self.parts((key[0], int(key[1]), int(key[2]), bucket), index)

        book = self.book
        if crowd.get("status") == "released":
            recipe_id = crowd.get("recipe_id")
            domain = self.domain(recipe_id)
            if domain is None:  # a longitudinal or large domain, or an unknown recipe (none)
                for key, accumulator in respondent_accumulators([crowd], instance, book, 0):
                    merge_into(unit_of(key)[1], [(key, accumulator)])
                return
            count = crowd.get("respondents_released")
            if type(count) is not int or count < 0:  # bool is no count either
                raise ValueError(f"released crowd without respondents_released >= 0: {dict(crowd)}")
            start, stop = crowd.get("window_start_ms"), crowd.get("window_end_ms")
            if not (isinstance(start, int) and isinstance(stop, int) and start < stop):
                raise ValueError(f"crowd window must be integers start < end: {dict(crowd)}")
            _check_respondents(instance, count)
            key = (HISTOGRAM, int(start), int(stop), crowd["channel"], recipe_id,
                   crowd.get("crowd_id"))  # fmt: skip
            rows = unit_of(key)[0].get(domain)
            if rows is None:
                rows = unit_of(key)[0][domain] = ({}, [])  # key -> position, respondents
            positions, respondents = rows
            position = positions.get(key)
            if position is None:
                positions[key] = len(respondents)
                respondents.append({int(instance): int(count)})
            else:
                _merge_respondents(respondents[position], {int(instance): int(count)}, "instance")
            return
        recipe = book.get(crowd["recipe_id"])
        start, stop = int(crowd["window_start_ms"]), int(crowd["window_end_ms"])
        channel, recipe_id, crowd_id = crowd["channel"], crowd["recipe_id"], crowd.get("crowd_id")
        if recipe is not None:
            key = crowd_key(recipe, crowd)
        else:
            key = (HISTOGRAM, start, stop, channel, recipe_id, crowd_id)
        record = (start, stop, channel, recipe_id, crowd_id, int(instance))
        unit_of(key)[2].append(record)

    def buckets(self) -> dict[AnalysisBucketKey, CrowdBucket]:
        out: dict[AnalysisBucketKey, CrowdBucket] = {}
        for unit in sorted(self.units, key=self.first.__getitem__):
            by_domain, others, withheld = self.units[unit]
            rows = {}
            for domain, (keys, respondents) in by_domain.items():
                crowds_in = len(respondents)
                rows[domain] = _Rows(
                    domain,
                    list(keys),
                    np.zeros(crowds_in, dtype=bool),  # empty sparse sums until densified
                    np.zeros((crowds_in, domain), dtype=np.int64),
                    np.zeros(crowds_in, dtype=np.int64),
                    respondents,
                    [{} for _ in range(crowds_in)],
                )
            out[unit] = CrowdBucket.of_content(_Content(rows, others, withheld))
        return out


def commit_buckets(
    crowds: Iterable[tuple[int, Mapping[str, Any]]],
    book: RecipeBook,
    buckets: int = ANALYZER_BUCKETS,
    known_buckets: Sequence[int | None] | None = None,
) -> dict[AnalysisBucketKey, CrowdBucket]:
    """``(instance, commit crowd record)`` pairs as partial buckets: each released crowd of a
    known recipe as an accumulator holding only n_u (``respondent_accumulators``; counts kept
    empty and sparse until :meth:`CrowdBucket.densify`), each withheld crowd as a
    :data:`WithheldRecord` in the bucket its estimate would be in (a histogram bucket when
    its recipe is unknown). ValueError on a malformed released record. Histogram crowds of
    domains up to :data:`ROW_DOMAIN_LIMIT` go straight into the bucket's rows (no accumulator
    per crowd). ``known_buckets``: per pair, its bucket when the caller knows it without
    hashing the crowd (:func:`bucket_key`'s last field; None: hashed here)."""
    units = _CommitUnits(book)

    def hashed(key: CrowdKey) -> AnalysisBucketKey:
        return bucket_key(key, buckets)

    for index, (instance, crowd) in enumerate(crowds):
        known = None if known_buckets is None else known_buckets[index]
        units.add(index, instance, crowd, hashed if known is None else known)
    return units.buckets()


def commit_table_buckets(
    tables: Sequence[tuple[int, CrowdColumns, int | None]],
    book: RecipeBook,
    buckets: int = ANALYZER_BUCKETS,
) -> dict[AnalysisBucketKey, CrowdBucket]:
    """:func:`commit_buckets` of verified crowd tables ``(instance, crowds, the bucket of all
    its crowds or None)`` in turn, the same buckets from their columns: the row crowds
    (released, of a histogram recipe of a small domain) checked as ``commit_buckets`` checks
    them with numpy and grouped per unit and domain at once (the key tuples and respondent
    dicts its rows hold are made in one comprehension per group), the others crowd by crowd;
    each crowd hashed only where its table's bucket is not known (``crowd_table_buckets``).
    A crowd's key is in one table of one instance (``check_crowd_table``: rows in strict crowd
    order, each crowd in its bucket's table); tables of several instances, or a row crowd that
    ``commit_buckets`` would refuse, are left to ``commit_buckets``, which says what is wrong."""

    def by_rows() -> dict[AnalysisBucketKey, CrowdBucket]:
        pairs = [(instance, crowd) for instance, crowds, _ in tables for crowd in crowds]
        known = [bucket for _, crowds, bucket in tables for _ in range(len(crowds))]
        return commit_buckets(pairs, book, buckets, known)

    tables = [table for table in tables if len(table[1])]
    if not tables:
        return {}
    instance = tables[0][0]
    plain = (
        all(table[0] == instance for table in tables)
        and type(instance) is int
        and instance >= 0
        and type(buckets) is int
        and 1 <= buckets <= MAX_CROWD_BUCKETS
    )
    if not plain:
        return by_rows()
    crowds = CrowdColumns(
        pa.concat_tables([pa.table(table.table) for _, table, _ in tables]).combine_chunks()
    )
    bucket = np.concatenate([
        np.full(len(table), known, dtype=np.int64) if type(known) is int
        else crowd_table_buckets(table, buckets)
        for _, table, known in tables
    ])  # fmt: skip
    units = _CommitUnits(book)
    recipes = crowds.column("recipe_id").dictionary_encode()
    domain_of = [units.domain(recipe_id) for recipe_id in recipes.dictionary.to_pylist()]
    domains = np.array([-1 if d is None else d for d in domain_of], dtype=np.int64)[
        pc.fill_null(recipes.indices, 0).to_numpy(zero_copy_only=False)
    ]
    released = pc.fill_null(pc.equal(crowds.column("status"), "released"), False)
    released = released.to_numpy(zero_copy_only=False)
    row_crowds = (
        released
        & (domains >= 0)
        & crowds.column("recipe_id").is_valid().to_numpy(zero_copy_only=False)
    )
    windows = [crowds.column(name) for name in ("window_start_ms", "window_end_ms")]
    counts = crowds.column("respondents_released")
    start, stop = (w.fill_null(0).to_numpy(zero_copy_only=False) for w in windows)
    refused = (
        windows[0].null_count
        or windows[1].null_count
        or (row_crowds & ~counts.is_valid().to_numpy(zero_copy_only=False)).any()
        or (row_crowds & (counts.fill_null(0).to_numpy(zero_copy_only=False) < 0)).any()
        or (row_crowds & (start >= stop)).any()
    )
    if refused:
        return by_rows()
    rest = np.flatnonzero(~row_crowds)
    if rest.size:  # withheld crowds and released ones of other recipes: crowd by crowd
        others = CrowdColumns(crowds.table.take(pa.array(rest))).rows()
        for index, crowd in zip(rest.tolist(), others, strict=True):
            units.add(index, instance, crowd, int(bucket[index]))
    picked = np.flatnonzero(row_crowds)
    if picked.size:
        _add_row_crowds(units, instance, crowds, picked, start, stop, bucket, domains)
    return units.buckets()


def _add_row_crowds(
    units: _CommitUnits,
    instance: int,
    crowds: CrowdColumns,
    picked: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    bucket: np.ndarray,
    domains: np.ndarray,
) -> None:
    """The row crowds ``picked`` (positions in ``crowds``) into their units' rows, a group of
    one unit and domain at a time, groups in the order of their first crowd."""
    table = crowds.table if len(picked) == len(crowds) else crowds.table.take(pa.array(picked))
    lists = [table.column(name).to_pylist() for name in
             ("window_start_ms", "window_end_ms", "channel", "recipe_id", "crowd_id")]  # fmt: skip
    keys = list(zip(itertools.repeat(HISTOGRAM), *lists, strict=False))
    respondents = table.column("respondents_released").to_pylist()
    # runs of rows of one unit and domain (a table's, mostly), gathered per group in the order
    # of their first row
    columns = np.stack([start[picked], stop[picked], bucket[picked], domains[picked]])
    edges = np.flatnonzero((columns[:, 1:] != columns[:, :-1]).any(axis=0)) + 1
    bounds = [0, *edges.tolist(), len(picked)]
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for low, high in itertools.pairwise(bounds):
        groups.setdefault(tuple(columns[:, low].tolist()), []).append((low, high))
    for (group_start, group_stop, group_bucket, domain), runs in groups.items():
        unit = (HISTOGRAM, group_start, group_stop, group_bucket)
        by_domain = units.parts(unit, int(picked[runs[0][0]]))[0]
        if len(runs) == 1:
            low, high = runs[0]
            group_keys, counts = keys[low:high], respondents[low:high]
        else:
            group_keys = [key for low, high in runs for key in keys[low:high]]
            counts = [count for low, high in runs for count in respondents[low:high]]
        by_domain[domain] = (group_keys, [{instance: count} for count in counts])


def withheld_records(records: Iterable[WithheldRecord]) -> list[dict[str, Any]]:
    """:data:`WithheldRecord` tuples as the commit-record dicts ``withheld_notes`` reads."""
    return [
        {
            "window_start_ms": start,
            "window_end_ms": stop,
            "channel": channel,
            "recipe_id": recipe_id,
            "crowd_id": crowd_id,
            "status": "withheld",
            "instance": instance,
        }
        for start, stop, channel, recipe_id, crowd_id, instance in records
    ]


__all__ = [
    "ANALYZER_BUCKETS",
    "CROWDS_PER_BUCKET",
    "AnalysisBucketKey",
    "BucketContent",
    "CrowdBucket",
    "WithheldRecord",
    "analyzer_buckets",
    "bucket_accumulators",
    "bucket_key",
    "commit_buckets",
    "commit_table_buckets",
    "crowd_buckets_known",
    "crowd_sort_key",
    "withheld_records",
]

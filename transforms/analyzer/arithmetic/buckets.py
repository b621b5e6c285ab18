"""Crowd buckets of the analyzer: many crowds' partial accumulators as one unit of work.

The analyzer adds, estimates and writes crowds a bucket at a time (issue: memory flat in the
number of crowds): a crowd's bucket is ``schemas.release.crowd_buckets.crowd_bucket`` of its channel,
recipe and crowd ID (never of window or instance, so every instance's parts of a crowd meet),
and the unit key adds the crowd key's kind and window (:func:`bucket_key`). A
:class:`CrowdBucket` holds the partial accumulators of its crowds and the withheld-crowd records
of their commit records; it crosses a pipeline's groupings as one compressed blob
(:meth:`CrowdBucket.pack`), never as one element or one Python object per crowd.

Pure: numpy, pickle and zlib; no Beam.
"""

from __future__ import annotations

import math
import pickle
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from schemas.release.crowd_buckets import DEFAULT_CROWD_BUCKETS, MAX_CROWD_BUCKETS, crowd_bucket
from transforms.analyzer.arithmetic.accumulate import (
    HISTOGRAM,
    Accumulator,
    BucketCounts,
    CrowdKey,
    RecipeBook,
)
from transforms.analyzer.arithmetic.batches import crowd_key, respondent_accumulators

# The analyzer's own number of crowd buckets (independent of any shuffler's): at least this many,
# more when there are many crowds (:func:`analyzer_buckets`).
ANALYZER_BUCKETS = DEFAULT_CROWD_BUCKETS
# At most about this many crowds per bucket and window (:func:`analyzer_buckets`).
CROWDS_PER_BUCKET = 1000


def analyzer_buckets(crowds: int, crowds_per_bucket: int = CROWDS_PER_BUCKET) -> int:
    """Crowd buckets for about ``crowds`` crowds (all windows counted): enough that a bucket of
    one window holds at most about ``crowds_per_bucket`` crowds even if every crowd is in the
    same window, so what a worker holds of one bucket (its crowds' accumulators, reports and
    rows) does not grow with the crowds; at least :data:`ANALYZER_BUCKETS`, at most
    ``MAX_CROWD_BUCKETS``."""
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


class CrowdBucket:
    """The partial accumulators of one bucket's crowds (crowd key -> accumulator) and the
    withheld records of those crowds.

    ``merge`` adds another bucket without changing it (crowds it holds that this one lacks are
    copied). Pickled, a bucket is one zlib-compressed blob and stays one until it is read again
    (:meth:`pack`), so a runner that holds grouped values decoded keeps a bytes object per
    bucket, not Python objects per crowd. :meth:`add` keeps a combiner's buckets packed too:
    an added bucket waits as its blob, and the waiting blobs are folded in (unpacked, merged,
    packed again) once they weigh as much as the bucket's own blob, so adding costs amortized
    O(log) unpacks per crowd and a combiner holding every bucket (Beam's lifted combine keeps
    every key's accumulator until its bundle ends) holds compressed bytes.
    """

    __slots__ = ("_crowds", "_withheld", "_packed", "_pending", "_pending_bytes")

    def __init__(
        self,
        crowds: Mapping[CrowdKey, Accumulator] | None = None,
        withheld: Iterable[WithheldRecord] = (),
    ) -> None:
        self._crowds: dict[CrowdKey, Accumulator] | None = dict(crowds or {})
        self._withheld: list[WithheldRecord] | None = list(withheld)
        self._packed: bytes | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def _open(self) -> tuple[dict[CrowdKey, Accumulator], list[WithheldRecord]]:
        if self._crowds is None or self._withheld is None:
            self._crowds, self._withheld = _unpack(self._packed)
            self._packed = None
        if self._pending:
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            for blob in pending:  # freshly unpacked: merged without copies
                crowds, withheld = _unpack(blob)
                for key, accumulator in crowds.items():
                    mine = self._crowds.get(key)
                    if mine is None:
                        self._crowds[key] = accumulator
                    else:
                        mine.merge(accumulator)
                self._withheld.extend(withheld)
        return self._crowds, self._withheld

    def pack(self) -> CrowdBucket:
        """Compress the content into one blob (read back on first use); returns ``self``."""
        if self._packed is None or self._pending:
            crowds, withheld = self._open()
            state = (crowds, withheld)
            self._packed = zlib.compress(pickle.dumps(state, pickle.HIGHEST_PROTOCOL), 1)
            self._crowds = self._withheld = None
        return self

    def add(self, other: CrowdBucket) -> None:
        """Adds ``other`` (its value unchanged) lazily, keeping this bucket packed."""
        blob = other.__getstate__()
        self._pending.append(blob)
        self._pending_bytes += len(blob)
        if self._pending_bytes >= max(PENDING_BYTES, len(self._packed or b"")):
            self.pack()

    def __getstate__(self) -> bytes:
        self.pack()
        return self._packed or b""

    def __setstate__(self, state: bytes) -> None:
        self._crowds = self._withheld = None
        self._packed = state
        self._pending = []
        self._pending_bytes = 0

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
        only parts were respondent counts (kept sparse, i.e. empty, while they travel)."""
        for accumulator in self._open()[0].values():
            counts = getattr(accumulator, "counts", None)
            if isinstance(counts, BucketCounts) and not counts.is_dense:
                if counts.domain_size <= dense_limit:
                    counts.merge(BucketCounts(counts.domain_size, dense_limit))


def _unpack(blob: bytes | None) -> tuple[dict[CrowdKey, Accumulator], list[WithheldRecord]]:
    if not blob:
        return {}, []
    return pickle.loads(zlib.decompress(blob))


def bucket_accumulators(
    accumulators: Mapping[CrowdKey, Accumulator], buckets: int = ANALYZER_BUCKETS
) -> dict[AnalysisBucketKey, CrowdBucket]:
    """Partial accumulators per crowd (one batch's) as partial buckets."""
    out: dict[AnalysisBucketKey, CrowdBucket] = {}
    for key, accumulator in accumulators.items():
        unit = bucket_key(key, buckets)
        bucket = out.get(unit)
        if bucket is None:
            bucket = out[unit] = CrowdBucket()
        bucket.crowds[key] = accumulator
    return out


def commit_buckets(
    crowds: Iterable[tuple[int, Mapping[str, Any]]],
    book: RecipeBook,
    buckets: int = ANALYZER_BUCKETS,
) -> dict[AnalysisBucketKey, CrowdBucket]:
    """``(instance, commit crowd record)`` pairs as partial buckets: each released crowd of a
    known recipe as an accumulator holding only n_u (``respondent_accumulators``; counts kept
    empty and sparse until :meth:`CrowdBucket.densify`), each withheld crowd as a
    :data:`WithheldRecord` in the bucket its estimate would be in (a histogram bucket when
    its recipe is unknown). ValueError on a malformed released record."""
    out: dict[AnalysisBucketKey, CrowdBucket] = {}

    def bucket_of(key: CrowdKey) -> CrowdBucket:
        unit = bucket_key(key, buckets)
        bucket = out.get(unit)
        if bucket is None:
            bucket = out[unit] = CrowdBucket()
        return bucket

    for instance, crowd in crowds:
        if crowd.get("status") == "released":
            for key, accumulator in respondent_accumulators([crowd], instance, book, 0):
                bucket = bucket_of(key)
                mine = bucket.crowds.get(key)
                if mine is None:
                    bucket.crowds[key] = accumulator
                else:
                    mine.merge(accumulator)
            continue
        recipe = book.get(crowd["recipe_id"])
        start, stop = int(crowd["window_start_ms"]), int(crowd["window_end_ms"])
        channel, recipe_id, crowd_id = crowd["channel"], crowd["recipe_id"], crowd.get("crowd_id")
        if recipe is not None:
            key = crowd_key(recipe, crowd)
        else:
            key = (HISTOGRAM, start, stop, channel, recipe_id, crowd_id)
        record = (start, stop, channel, recipe_id, crowd_id, int(instance))
        bucket_of(key).withheld.append(record)
    return out


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
    "CrowdBucket",
    "WithheldRecord",
    "analyzer_buckets",
    "bucket_accumulators",
    "bucket_key",
    "commit_buckets",
    "crowd_sort_key",
    "withheld_records",
]

"""Step 6 of the shuffler after the decisions (``transforms/shuffler/shuffle.py``): delete, scatter,
complete a bucket's groups, permute.

``DeleteAndScatter`` deletes whole respondents per crowd of a shard (``decide.kept_rows``) from
the candidates ``CountShard`` spilled (the shard's screened data messages: payload, CRC, crowd
and the origin's rank in its crowd) and scatters the survivors over uniform slots;
``CompleteBucket`` joins a bucket's decision with its shards' results: final manifests, the crowd
table and the output groups (``release_core.complete_groups`` from the bucket's released count);
``PermuteGroup`` orders a group's rows by crowd in ``crowd_order``, each crowd's rows in a uniform
permutation from the injected secure source (esa-privacy-revisited, Section II-C).

Why a crowd's release order is uniform although its shards scatter and its groups are permuted
in parallel, by different workers: every surviving message of the crowd draws its slot
independently and uniformly (``decide.assign_groups``, fresh secure randomness in whichever shard
holds it), slots merge into the bucket's 2**g groups by contiguous ranges
(``decide.complete_groups``), so each message's group is i.i.d. uniform, independent of its
content, origin and arrival; then each group's rows of the crowd get a uniform permutation of their
own (:func:`crowd_release_order`). Given the crowd's group sizes ``n_0 .. n_{G-1}`` (sum n), the
i.i.d. labels make every partition of the crowd into groups of those sizes equally likely, with
probability ``prod(n_j!) / n!``, and each group's order has probability ``1 / n_j!``; a release
order (groups in order, concatenated) comes from exactly one partition and one order per group,
so each of the n! orders has probability ``prod(n_j!) / n! * prod(1 / n_j!) = 1 / n!``. The sizes
themselves are multinomial in n with G fixed by the bucket's released count, which the analyzer
sees anyway: nothing about arrival or origin reaches the positions.
(``tests/transforms/shuffler/test_release_order.py`` checks this by chi-square.)
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from privacy.noise import os_random_source
from schemas.release.crowd_buckets import BucketKey, crowd_order
from transforms.shuffler import decide, spill
from transforms.shuffler.bundles import CountsBundles
from transforms.shuffler.config import (
    DELETED,
    RELEASED,
    ShuffleConfig,
)
from transforms.shuffler.sinks import CrowdTable, ReleasedGroup
from transforms.shuffler.spill import Piece, crowd_of_text, pack_ints, unpack_ints, unpack_texts
from transforms.shuffler.steps import count as _count
from transforms.shuffler.steps import (
    crowd_codes,
    draft_decision,
    manifest_record,
    manifest_row,
    released_crowd,
)


@beam.typehints.with_output_types(typing.Any)
class DeleteAndScatter(CountsBundles):
    """(bucket, DeletionTask) -> (bucket, ShardRelease): whole respondents deleted per crowd,
    surviving data messages stripped to payload, CRC and crowd, each in a fresh uniform slot.

    Reads the shard's candidates that ``CountShard`` spilled (its screened data messages, each
    with its origin code in its crowd), not the shard's report rows again."""

    def __init__(self, spill_dir: str) -> None:
        self._spill_dir = spill_dir
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[BucketKey, spill.DeletionTask]) -> Iterator[Any]:
        self.worked()
        key, deletion = element
        task_texts = unpack_texts(deletion.crowds)
        if deletion.candidates is None:  # its crowds' respondents sent presence messages only
            rows = pa.RecordBatch.from_pylist([], spill.CANDIDATE_SPILL_SCHEMA)
        else:
            rows = spill.read_spill(deletion.candidates, spill.CANDIDATE_SPILL_SCHEMA)
        crowds, texts = crowd_codes(rows.column("crowd"))
        code_of = {text: code for code, text in enumerate(texts)}
        origin = rows.column("origin_code").to_numpy()
        # Every origin of the task's crowds, crowd after crowd: kept or deleted (whole).
        respondents = unpack_ints(deletion.respondents)
        keep_origin = np.ones(int(respondents.sum()), dtype=bool)
        bases = np.zeros(len(texts) + 1, dtype=np.int64)
        limits = np.zeros(len(texts) + 1, dtype=np.int64)  # 0: a crowd not released here
        begin = 0
        for text, distinct, respondents_deleted in zip(
            task_texts,
            respondents.tolist(),
            unpack_ints(deletion.respondents_deleted).tolist(),
            strict=True,
        ):
            keep_origin[begin : begin + distinct] = decide.kept_rows(
                np.arange(distinct), distinct, respondents_deleted, self._source
            )
            code = code_of.get(text)
            if code is not None:
                bases[code], limits[code] = begin, distinct
            begin += distinct
        in_release = limits[crowds] > 0
        if np.any(origin[in_release] >= limits[crowds[in_release]]) or (
            deletion.candidates is not None and rows.num_rows != deletion.candidates.rows
        ):
            raise RuntimeError(
                f"shard {deletion.task.shard} of {key}: candidates beyond those counted: spill "
                "files changed during the run"
            )
        kept = np.zeros(rows.num_rows, dtype=bool)
        kept[in_release] = keep_origin[bases[crowds[in_release]] + origin[in_release]]
        survivors = np.flatnonzero(kept)
        gone = ~kept & in_release
        # The task's crowds' codes (one past the last for a crowd with no rows here).
        task_codes = np.array(
            [code_of.get(text, len(texts)) for text in task_texts], dtype=np.int64
        )
        per_deleted = np.bincount(crowds[gone], minlength=len(texts) + 1)
        per_released = np.bincount(crowds[survivors], minlength=len(texts) + 1)
        counts: dict[str, int] = {}
        _count(counts, DELETED, int(np.count_nonzero(gone)))
        yield beam.pvalue.TaggedOutput("counts", counts)
        pieces: list[tuple[int, Piece]] = []
        if survivors.size:
            slots = decide.assign_groups(survivors.size, 1 << deletion.slot_bits, self._source)
            order = decide.stable_order(slots, 1 << deletion.slot_bits)
            sorted_slots = slots[order]
            released = rows.select(RELEASED_COLUMNS).take(pa.array(survivors[order]))
            starts = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
            ends = np.r_[starts[1:], sorted_slots.size]
            bounds_list = list(zip(starts.tolist(), ends.tolist(), strict=True))
            path = spill.spill_path(self._spill_dir, "released")
            positions = spill.write_spill(path, [released.slice(b, e - b) for b, e in bounds_list])
            for (begin, end), (offset, length, _) in zip(bounds_list, positions, strict=True):
                piece = Piece(path, offset, length, end - begin, "", 0)
                pieces.append((int(sorted_slots[begin]), piece))
        yield (
            key,
            spill.ShardRelease(
                deletion.crowds,
                pack_ints(per_deleted[task_codes]),
                pack_ints(per_released[task_codes]),
                deletion.slot_bits,
                tuple(pieces),
            ),
        )


RELEASED_COLUMNS = ("payload", "payload_crc32c", "crowd")


@beam.typehints.with_output_types(typing.Any)
class CompleteBucket(beam.DoFn):
    """(bucket, {draft, shards}) -> ((bucket, group), pieces) per output group
    (``release_core.complete_groups`` on the bucket's released count); the bucket's final
    manifests (``manifest``) and crowd table (``crowds``: ReleasedCrowd records in
    ``crowd_order``) as one element each."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config

    def process(self, element: tuple[BucketKey, Mapping[str, list[Any]]]) -> Iterator[Any]:
        key, joined = element
        drafts: list[spill.BucketDraft] = list(joined["draft"])
        if len(drafts) != 1:
            raise RuntimeError(f"bucket {key} has {len(drafts)} decisions, expected one")
        (draft,) = drafts
        shards: list[spill.ShardRelease] = list(joined["shards"])
        stats: dict[str, list[int]] = {}
        for shard in shards:
            for text, deleted, released in zip(
                unpack_texts(shard.crowds),
                unpack_ints(shard.messages_deleted).tolist(),
                unpack_ints(shard.messages_released).tolist(),
                strict=True,
            ):
                total = stats.setdefault(text, [0, 0])
                total[0] += deleted
                total[1] += released
        manifests, table = [], []
        for text, row in zip(
            unpack_texts(draft.crowds), unpack_ints(draft.decisions).tolist(), strict=True
        ):
            decision, messages_in = draft_decision(row)
            deleted, released = stats.get(text, (0, 0))
            manifest = manifest_record(
                (key[0], key[1], *crowd_of_text(text)),
                draft.window_end,
                decision,
                messages_in,
                deleted,
                released,
            )
            manifests.append(manifest_row(manifest))
            table.append(released_crowd(manifest))
        yield beam.pvalue.TaggedOutput("manifest", (key, tuple(manifests)))
        yield beam.pvalue.TaggedOutput("crowds", CrowdTable(key, tuple(table)))
        slotted = sorted(
            ((slot, piece) for shard in shards for slot, piece in shard.pieces),
            key=lambda pair: (pair[0], pair[1]),
        )
        if not slotted:
            return
        groups = decide.complete_groups(
            [slot for slot, _ in slotted],
            draft.slot_bits,
            sum(total[1] for total in stats.values()),
            self._config.messages_per_file,
        )
        for group, indices in groups.items():
            yield (key, group), tuple(slotted[index][1] for index in indices)


def crowd_release_order(crowd_rank: np.ndarray, source: Any) -> np.ndarray:
    """The order of a group's rows (``crowd_rank``: each row's crowd's place in ``crowd_order``):
    by crowd, each crowd's rows in a uniformly random order (a uniform permutation of the group
    from the secure ``source``, then a stable sort by crowd)."""
    shuffled = decide.release_order(crowd_rank.size, source)
    ranks = crowd_rank[shuffled]
    return shuffled[decide.stable_order(ranks, int(ranks.max()) + 1 if ranks.size else 0)]


@beam.typehints.with_output_types(typing.Any)
class PermuteGroup(CountsBundles):
    """((bucket, group), pieces) -> ReleasedGroup: rows grouped by crowd in ``crowd_order``,
    each crowd's rows in uniformly random order (secure)."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[tuple[BucketKey, int], tuple[Piece, ...]]) -> Iterator[Any]:
        self.worked()
        (key, group), pieces = element
        batches = [spill.read_spill(piece, spill.RELEASED_SPILL_SCHEMA) for piece in pieces]
        table = (
            pa.Table.from_batches(batches, schema=spill.RELEASED_SPILL_SCHEMA)
            .unify_dictionaries()
            .combine_chunks()
        )
        crowds, texts = crowd_codes(table.column("crowd"))
        keys = [crowd_of_text(text) for text in texts]
        rank = np.empty(len(keys), dtype=np.int64)
        rank[sorted(range(len(keys)), key=lambda index: crowd_order(*keys[index]))] = np.arange(
            len(keys)
        )
        order = crowd_release_order(rank[crowds], self._source)
        per_crowd = np.bincount(rank[crowds], minlength=len(keys))
        ordered_keys = [None] * len(keys)
        for index, position in enumerate(rank.tolist()):
            ordered_keys[position] = keys[index]
        take = pa.array(order)
        counts: dict[str, int] = {}
        _count(counts, RELEASED, table.num_rows)
        yield beam.pvalue.TaggedOutput("counts", counts)
        yield ReleasedGroup(
            key,
            group,
            key[0] + self._config.window.period_ms,
            tuple(ordered_keys),
            tuple(per_crowd.tolist()),
            table.column("payload").combine_chunks().take(take),
            table.column("payload_crc32c").combine_chunks().take(take).to_numpy(),
        )

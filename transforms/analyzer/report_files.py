"""The analyzer's per-crowd reports and withheld-crowd notes as JSON Lines datasets.

``reports.jsonl/part-SSSSS-of-NNNNN.jsonl`` holds one privacy/accuracy report per crowd (per round
for longitudinal crowds), ``withheld.jsonl/part-*.jsonl`` one note per crowd a shuffler withheld
(``analyze_core.withheld_notes``). Like the Parquet tables (``transforms.analyzer.tables``), each
part (a shard of crowd buckets, whose lines arrive compressed, :func:`pack_lines`) is written
by one worker holding only its own crowds, sorted, under a name fixed by its
index (a retried bundle replaces it, ``transforms.common.atomic_files``); every part exists, empty ones
too. ``summary.json`` keeps only totals and these directories' names, so neither a worker nor the
driver ever gathers every crowd's report (issue: no whole-dataset gathers).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.analyzer import arithmetic
from transforms.analyzer.tables import WriteParts, compress_batch, decompress_batch, load_batch
from transforms.common import atomic_files

REPORTS_DIR = "reports.jsonl"
WITHHELD_DIR = "withheld.jsonl"

# A crowd: (window_start, channel, recipe_id, crowd_id) as the commit records name it.
WindowCrowd = tuple[int, str, str, "str | None"]


def report_order(report: Mapping[str, Any]) -> tuple:
    """Order of reports in a part (and of a whole dataset read back)."""
    return (
        report.get("kind", ""),
        report.get("channel", ""),
        report.get("recipe_id", ""),
        report.get("crowd_id") or "",
        report.get("window_start", report.get("round_start", 0)),
    )


def histogram_report_order(key: tuple) -> tuple:
    """:func:`report_order` of the report of histogram crowd ``key`` (``arithmetic.CrowdKey``),
    without the report."""
    kind, window_start, _, channel, recipe_id, crowd_id = key
    return (kind, channel, recipe_id, crowd_id or "", int(window_start))


def histogram_report_orders(keys: Iterable[tuple]) -> list[tuple]:
    """:func:`histogram_report_order` of each key."""
    return [
        (kind, channel, recipe_id, crowd_id or "", int(window_start))
        for kind, window_start, _, channel, recipe_id, crowd_id in keys
    ]


def note_order(note: Mapping[str, Any]) -> tuple:
    return tuple(str(note.get(k)) for k in ("window_start", "channel", "recipe_id", "crowd_id"))


def json_ready(value: Any) -> Any:
    """``value`` with numpy scalars and arrays as JSON types and non-finite floats as None."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating | float):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    return value


def estimated_crowds(report: Mapping[str, Any]) -> list[WindowCrowd]:
    """The commit-record crowds a report estimated: its window (histogram reports with a privacy
    report) or every period with respondents (longitudinal rounds)."""
    if report.get("kind") == arithmetic.HISTOGRAM and "privacy" in report:
        return [
            (report["window_start"], report["channel"], report["recipe_id"], report["crowd_id"])
        ]
    if report.get("kind") == arithmetic.LONGITUDINAL:
        return [
            (
                report["round_start"] + period * report["window_ms"],
                report["channel"],
                report["recipe_id"],
                report["crowd_id"],
            )
            for period in range(report["periods"])
            if report["respondents_per_period"][period] > 0
        ]
    return []


def part_name(shard: int, shards: int) -> str:
    return f"part-{shard:05d}-of-{shards:05d}.jsonl"


def _json_scalar(value: Any) -> Any:
    """``json.dumps``'s ``default`` for :func:`json_line`'s direct path: numpy integers and finite
    floats and arrays; anything else (a non-finite float too) makes the direct path give up."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating) and math.isfinite(float(value)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not directly serializable: {type(value).__name__}")


def json_line(record: Mapping[str, Any]) -> str:
    """One JSON Lines line of ``record`` (numpy values as JSON types, no NaN).

    The same line as ``json.dumps(json_ready(record))``: when every key is a string and every
    float finite, ``json.dumps`` writes it directly (numpy values through :func:`_json_scalar`)
    without copying the record; else (a non-string key, a NaN) through :func:`json_ready`."""
    try:
        if all(isinstance(key, str) for key in record):
            return json.dumps(record, allow_nan=False, default=_json_scalar)
    except (TypeError, ValueError):
        pass
    return json.dumps(json_ready(record), sort_keys=False, allow_nan=False)


def json_value(value: Any) -> str:
    """The JSON text ``value`` has inside a :func:`json_line` (numpy values as JSON types, no
    NaN): ``json_line({"k": value})`` is ``'{"k": ' + json_value(value) + "}"``, so a line can be
    joined from the texts of its values (``json.dumps``'s default separators)."""
    try:
        return json.dumps(value, allow_nan=False, default=_json_scalar)
    except (TypeError, ValueError):
        return json.dumps(json_ready(value), allow_nan=False)


def _json_string(value: Any) -> str:
    """:func:`json_value` of a crowd ID, without the encoder for plain printable ASCII text."""
    if value is None:
        return "null"
    if (
        isinstance(value, str)
        and value.isascii()
        and value.isprintable()
        and '"' not in value
        and "\\" not in value
    ):
        return f'"{value}"'
    return json_value(value)


def _crowd_id_texts(crowd_ids: Sequence[str | None]) -> list[str]:
    """:func:`_json_string` of each crowd ID: quoted directly when every one is plain printable
    ASCII text (checked on their concatenation: each property holds per character)."""
    if all(type(crowd_id) is str for crowd_id in crowd_ids):
        joined = "".join(crowd_ids)
        if joined.isascii() and joined.isprintable() and '"' not in joined and "\\" not in joined:
            return [f'"{crowd_id}"' for crowd_id in crowd_ids]
    return [_json_string(crowd_id) for crowd_id in crowd_ids]


def _per_row(texts: Mapping[Any, str], keys: Iterable[Any], rows: int) -> Iterable[str]:
    """Each of ``rows`` rows' text, looked up in ``texts`` by its key from ``keys`` (the one
    text repeated, keys unread, when every row shares it)."""
    if len(texts) == 1:
        return itertools.repeat(next(iter(texts.values())), rows)
    return map(texts.__getitem__, keys)


class HistogramReportLines:
    """The report lines of many histogram crowds: for row i of ``arithmetic.HistogramRows``,
    ``json_line(arithmetic.histogram_report(recipe, rows.result(i), deletion, accuracy,
    rejected))``, joined from the JSON texts of its values instead of made as a dict and
    serialized whole.

    What depends only on the crowd's respondents per instance (``respondents_by_instance``,
    the privacy report and the notes) is serialized once per distinct respondents and kept
    (at most ``limit`` of them; the cache empties when full, as the privacy reports'). Only
    dense results pass through here (no ``unobserved_*`` entries); keys follow
    ``histogram_report``'s order, which a test holds to the per-crowd lines.
    """

    def __init__(self, deletion: Mapping[int, tuple[float, float]], limit: int = 4096) -> None:
        self._deletion = deletion
        self._limit = int(limit)
        self._respondents: dict[tuple, tuple[Any, str, str]] = {}
        self._strings: dict[Any, str] = {}

    def _string(self, value: str | None) -> str:
        """``json.dumps(value)`` of a name many crowds share (kind, channel, recipe)."""
        text = self._strings.get(value)
        if text is None:
            if len(self._strings) >= self._limit:
                self._strings.clear()
            text = self._strings[value] = json.dumps(value)
        return text

    def _by_respondents(self, recipe: Any, respondents: dict[int, int]) -> tuple[str, str]:
        """(respondents_by_instance, privacy + notes) texts of one respondents mapping (each
        entry keeps its recipe, so an id() is never a later object's)."""
        cache_key = (id(recipe), tuple(respondents.items()))
        hit = self._respondents.get(cache_key)
        if hit is None or hit[0] is not recipe:
            if len(self._respondents) >= self._limit:
                self._respondents.clear()
            privacy = arithmetic.cached_privacy_summary(recipe, respondents, self._deletion)
            note = arithmetic.missing_instance_note(recipe, respondents)
            by_instance = {str(u): int(c) for u, c in respondents.items()}
            hit = self._respondents[cache_key] = (
                recipe,
                json_value(by_instance),
                f'{json_value(privacy)}, "notes": {json_value([note] if note else [])}',
            )
        return hit[1], hit[2]

    def _respondents_texts(
        self, recipe: Any, by_instance: list[dict[int, int]]
    ) -> list[tuple[str, str]]:
        """:meth:`_by_respondents` of each row's mapping, looked up once per distinct mapping of
        the rows (a one-instance mapping by its instance and count, no tuple per row)."""
        single: dict[int, dict[int, tuple[str, str]]] = {}
        several: dict[tuple, tuple[str, str]] = {}
        out = []
        for respondents in by_instance:
            if len(respondents) == 1:
                for instance, count in respondents.items():
                    counts = single.get(instance)
                    if counts is None:
                        counts = single[instance] = {}
                    texts = counts.get(count)
                    if texts is None:
                        texts = counts[count] = self._by_respondents(recipe, respondents)
            else:
                items = tuple(respondents.items())
                texts = several.get(items)
                if texts is None:
                    texts = several[items] = self._by_respondents(recipe, respondents)
            out.append(texts)
        return out

    def pieces(
        self,
        recipe: Any,
        rows: arithmetic.HistogramRows,
        accuracy: Mapping[int, Mapping[str, float]],
        rejected: list[Mapping[str, int] | None],
    ) -> tuple[list[str], list[str], list[str]]:
        """The lines of every row (``accuracy``: row -> the accuracy of the crowds with a
        truth; ``rejected``: each row's rejected counts) as (heads, shared texts, tails): line i
        is ``heads[i] + shared[i] + tails[i]``, where ``shared[i]`` (domain, privacy and notes:
        most of a line) is one object for every row of the same respondents, which
        :func:`pack_lines` stores once. Each column's texts are made as a list (a text the rows
        share once), then the heads joined from them in one pass."""
        crowds = len(rows.keys)
        if not crowds:
            return [], [], []
        string = self._string
        kinds, starts, ends, channels, recipe_ids, crowd_ids = zip(*rows.keys, strict=True)
        # "kind", "channel", "recipe_id" (usually one recipe's, the same on every row)
        names = {
            (kind, channel, recipe_id): (
                f'{{"kind": {string(kind)}, "channel": {string(channel)}, '
                f'"recipe_id": {string(recipe_id)}, "crowd_id": '
            )
            for kind, channel, recipe_id in set(zip(kinds, channels, recipe_ids, strict=True))
        }
        name_texts = _per_row(names, zip(kinds, channels, recipe_ids, strict=True), crowds)
        # a bucket is one window: its text made once
        windows = {
            (start, end): f', "window_start": {int(start)}, "window_end": {int(end)}, '
            '"respondents_effective": '
            for start, end in set(zip(starts, ends, strict=True))
        }
        window_texts = _per_row(windows, zip(starts, ends, strict=True), crowds)
        by_instance, privacy = zip(
            *self._respondents_texts(recipe, rows.respondents_by_instance), strict=True
        )
        heads = [
            f"{name}{crowd_id}{window}{effective}, "
            f'"respondents_by_instance": {instances}, "messages": {messages}, '
            f'"rejected": {counted}'
            for name, crowd_id, window, effective, instances, messages, counted in zip(
                name_texts,
                _crowd_id_texts(crowd_ids),
                window_texts,
                map(float.__repr__, rows.respondents.tolist()),
                by_instance,
                rows.messages.tolist(),
                [json_value(dict(counted)) if counted else "{}" for counted in rejected],
                strict=True,
            )
        ]
        domain = rows.domain_size
        middle = (
            f', "domain_size": {domain}, "buckets_reported": {domain}, '
            f'"postprocessing": {json.dumps(rows.postprocessing)}, "privacy": '
        )
        shared_texts = {text: middle + text for text in set(privacy)}
        tails = ["}"] * crowds
        for row in accuracy:
            tails[row] = f', "accuracy": {json_value(dict(accuracy[row]))}}}'
        return heads, list(map(shared_texts.__getitem__, privacy)), tails


def pack_lines(
    lines: list[str],
    orders: list[tuple] | None = None,
    shared: list[str] | None = None,
    tails: list[str] | None = None,
) -> bytes:
    """Lines as one compressed batch (``tables.compress_batch`` of a pickle; read back by
    :func:`unpack_ordered_lines`): line i is ``lines[i] + shared[i] + tails[i]`` (each list, when
    given, one text per line; :meth:`HistogramReportLines.pieces`), where the distinct
    ``shared`` texts (most of a report line, the same for many crowds) are stored once, so a
    batch neither holds nor compresses them per line and the part is joined from them.

    ``orders``: each line's sort key as the part's ``order`` would read it from the line's
    record (``report_order`` or ``note_order``), carried with the lines, so the part is sorted
    without parsing every line again (:func:`write_json_part`)."""
    count = len(lines)
    for name, column in (("sort keys", orders), ("shared texts", shared), ("tails", tails)):
        if column is not None and len(column) != count:
            raise ValueError(f"{len(column)} {name} for {count} lines")
    texts: list[bytes] = []
    which = None
    if shared is not None:
        index: dict[str, int] = {}
        which = [index.setdefault(text, len(index)) for text in shared]
        texts = [text.encode() for text in index]
    # a JSON line holds no newline: each column is one text
    tail_text = None if tails is None else "\n".join(tails).encode()
    state = (count, orders, "\n".join(lines).encode(), texts, which, tail_text)
    return compress_batch(pickle.dumps(state, pickle.HIGHEST_PROTOCOL))


def _unpack_pieces(
    batch: bytes,
) -> tuple[list[tuple] | None, list[bytes], list[bytes], list[bytes]]:
    """(sort keys or None, heads, shared texts, tails) of a :func:`pack_lines` batch, each
    line's pieces as UTF-8 bytes (a part is written as bytes: the lines need no decoding and
    encoding on the way)."""
    count, orders, heads, texts, which, tails = pickle.loads(decompress_batch(batch))
    if not count:
        return orders, [], [], []
    empty = [b""] * count
    return (
        orders,
        heads.split(b"\n"),
        empty if which is None else list(map(texts.__getitem__, which)),
        empty if tails is None else tails.split(b"\n"),
    )


def unpack_ordered_lines(batch: bytes) -> tuple[list[tuple] | None, list[str]]:
    """(sort keys or None, lines) of a :func:`pack_lines` batch."""
    orders, heads, shared, tails = _unpack_pieces(batch)
    return orders, [(a + b + c).decode() for a, b, c in zip(heads, shared, tails, strict=True)]


def write_json_part(
    directory: str,
    shard: int,
    shards: int,
    batches: Iterable[bytes | str],
    order: Callable[[Mapping[str, Any]], tuple],
) -> str:
    """One JSON Lines part: the lines of the shard's :func:`pack_lines` batches (or the paths
    where ``analysis_tables.spill_batches`` spilled them), sorted by ``order`` of the record each line
    holds (the same order as the records'): the sort keys a batch carries, else each line read
    back. The part's bytes are joined once from the lines' pieces."""
    heads: list[bytes] = []
    shared: list[bytes] = []
    tails: list[bytes] = []
    keys: list[tuple] = []
    for batch in batches:
        orders, batch_heads, batch_shared, batch_tails = _unpack_pieces(load_batch(batch))
        if orders is None:
            orders = [
                order(json.loads(a + b + c))
                for a, b, c in zip(batch_heads, batch_shared, batch_tails, strict=True)
            ]
        heads += batch_heads
        shared += batch_shared
        tails += batch_tails
        keys += orders
    ordered = sorted(range(len(heads)), key=keys.__getitem__)
    # each line: head, shared text, tail, newline
    pieces = [b"\n"] * (4 * len(ordered))
    pieces[0::4] = [heads[index] for index in ordered]
    pieces[1::4] = [shared[index] for index in ordered]
    pieces[2::4] = [tails[index] for index in ordered]
    return atomic_files.publish_bytes(directory, part_name(shard, shards), b"".join(pieces))


class WriteLineBatches(beam.PTransform):
    """(part, compressed lines) -> ``directory/part-SSSSS-of-NNNNN.jsonl`` for every part in
    ``range(shards)`` (empty ones too), each sorted by ``order`` (:func:`write_json_part`)."""

    def __init__(
        self, directory: str, shards: int, order: Callable[[Mapping[str, Any]], tuple]
    ) -> None:
        super().__init__()
        if int(shards) < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self._directory, self._shards, self._order = directory, int(shards), order

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        return (batches,) | WriteParts([self.writer()], self._shards)

    def writer(self) -> Callable[[int, list], str]:
        """What writes one part (``analysis_tables.WriteParts``' writer)."""
        directory, shards, order = self._directory, self._shards, self._order
        return lambda shard, batches: write_json_part(directory, shard, shards, batches, order)


def report_totals(report: Mapping[str, Any]) -> dict[str, int]:
    """Counts summary.json keeps of a report (summed with ``combiners.SumCounts``)."""
    kind = report.get("kind")
    name = {arithmetic.HISTOGRAM: "histograms", arithmetic.LONGITUDINAL: "longitudinal"}.get(
        kind, "other"
    )
    counts = {name: 1}
    if "notes" in report:
        counts["with_notes"] = 1
    return counts


def read_json_parts(directory: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The records of a JSON Lines dataset in part order (every one, or the parts' records until
    at least ``limit`` were read): for small results, tests and the console table."""
    if not os.path.isdir(directory):
        return []
    records = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(directory, name)
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            records += [json.loads(line) for line in handle.read().decode().splitlines() if line]
        if limit is not None and len(records) >= limit:
            break
    return records


def read_withheld(output_dir: str, limit: int | None = None) -> list[dict[str, Any]]:
    """An analysis's withheld-crowd notes, sorted (without its reports, which may be many
    more): every one, or those of the first parts holding at least ``limit``."""
    notes = read_json_parts(os.path.join(output_dir, WITHHELD_DIR), limit)
    return sorted(notes, key=note_order)


def read_reports(output_dir: str, limit: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """An analysis's reports and notes as ``{"histograms", "longitudinal", "withheld"}`` lists,
    each sorted: every one (small analyses, tests) or those of the first parts holding at least
    ``limit`` (the console table)."""
    reports = read_json_parts(os.path.join(output_dir, REPORTS_DIR), limit)
    reports = sorted(reports, key=report_order)
    return {
        "histograms": [r for r in reports if r.get("kind") == arithmetic.HISTOGRAM],
        "longitudinal": [r for r in reports if r.get("kind") == arithmetic.LONGITUDINAL],
        "withheld": read_withheld(output_dir, limit),
    }

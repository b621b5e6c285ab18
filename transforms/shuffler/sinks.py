"""Sinks of the shuffler: released message files, crowd tables, the release index and commit,
private outputs.

Release (``--output DIR``, SPEC: release layout ``esa-release/2``, ``schemas/release/crowd_buckets.py``):
per crowd bucket of a window and instance (its *stem*), ``messages/<stem>-g<group>.avro``
ShuffledMessage files and ``crowds/<stem>.avro`` (one ReleasedCrowd record per crowd decided),
all with DETERMINISTIC names, so a retried bundle overwrites its file instead of adding one,
written to ``_temporary/`` first and renamed when complete (``transforms.common.atomic_files``); then
``_COMMIT.json``, written last by the driver from the release index only (:func:`commit_record`,
``schemas/release/commit.py``): never from a list of all crowds.

Shuffler-private (``--private-output PDIR``): ``index/<file>.json`` (one entry per release file:
bytes, records, SHA-256 computed from the bytes written; a crowd table's entry adds its crowds
released and withheld and respondents released), ``dead_letter/*.avro`` (names from a digest of
their content), ``manifest/window_start=<ms>/<stem>.avro`` (one CrowdManifest per crowd of a
bucket) and ``metrics.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import apache_beam as beam
import fastavro
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms import trigger as beam_trigger
from apache_beam.transforms import window as beam_window

from schemas import SCHEMA_VERSION, parsed_schema, schema_json
from schemas.avro.container import encode_encoded_container
from schemas.avro.encode import encode_rows
from schemas.release import commit as release_format
from schemas.release.crowd_buckets import (
    MESSAGES_DIR,
    BucketKey,
    bucket_stem,
    crowd_table_path,
    message_file_path,
)
from transforms.common import atomic_files
from transforms.common.combiners import SumCounts
from transforms.shuffler.config import metrics_summary
from transforms.shuffler.steps import manifest_dict

INDEX_DIR = "index"
RELEASE_FORMAT = release_format.RELEASE_FORMAT  # esa-release/2
# Totals a crowd table's index entry states besides its FileEntry fields.
CROWD_TOTALS = ("crowds_released", "crowds_withheld", "respondents_released")


# Blocks of a released message file: the analyzer reads a file spread over workers as ranges of
# whole blocks, shared out round robin, a fixed number per worker, so the blocks are what evens
# the shares out. Sealed messages (~125 bytes) in 1 MiB blocks made ranges of 8,390 records and
# files' tails of ~3,000: sixteen workers' shares of bench_scaling's release (192 such ranges)
# came out at 1.17x their mean for the largest on average (16 round-robin shares of the ranges in
# random order), and the analysis waits for that one; in blocks of 256 KiB (~2,100 sealed
# messages, ~8,700 clear ones) its ranges are within a block of one another and the largest
# share 1.01x the mean.
MESSAGE_BLOCK_BYTES = 256 << 10


class ReleasedGroup(NamedTuple):
    """Messages of one group of a crowd bucket released together (one output file): rows
    grouped by crowd in ``crowd_order`` (``crowds`` with ``crowd_rows`` rows each), each crowd's
    in random order. The file holds only fields a ShuffledMessage carries: no origin, event time
    or instance."""

    key: BucketKey
    group: int
    window_end: int
    crowds: tuple[tuple[str, str, str | None], ...]
    crowd_rows: tuple[int, ...]
    payloads: pa.Array
    crcs: np.ndarray

    @property
    def messages(self) -> int:
        return len(self.payloads)


class CrowdTable(NamedTuple):
    """ReleasedCrowd records (``schemas/released_crowd.avsc``) of one bucket, in crowd_order."""

    key: BucketKey
    records: tuple[dict[str, Any], ...]


def shuffled_columns(group: ReleasedGroup) -> dict[str, Any]:
    """ShuffledMessage columns of a released group (each crowd's fields repeated over its rows)."""
    lengths = np.asarray(group.crowd_rows, dtype=np.int64)

    # Each row's crowd (rows come crowd after crowd): one take per field, no object per row.
    crowd_of_row = pa.array(np.repeat(np.arange(len(group.crowds)), lengths))

    def repeated(position: int) -> pa.Array:
        values = pa.array([crowd[position] for crowd in group.crowds], type=pa.string())
        return values.take(crowd_of_row)

    return {
        "schema_version": SCHEMA_VERSION,
        "window_start": int(group.key[0]),
        "window_end": group.window_end,
        "channel": repeated(0),
        "recipe_id": repeated(1),
        "crowd_id": repeated(2),
        "payload": group.payloads,
        "payload_crc32c": group.crcs,
    }


def _binary(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Rows ``data[offsets[i]:offsets[i + 1]]`` as an Arrow large_binary array (no copy)."""
    return pa.Array.from_buffers(
        pa.large_binary(),
        offsets.size - 1,
        [None, pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int64)), pa.py_buffer(data)],
    )


def shuffled_message_rows(group: ReleasedGroup) -> tuple[np.ndarray, np.ndarray]:
    """Avro binary of a group's ShuffledMessage records, ``(bytes, row offsets)``: the bytes
    ``encode_rows`` gives for :func:`shuffled_columns`, with each crowd's leading fields
    (schema version, window, channel, recipe, crowd ID) encoded once and repeated over its rows
    (an Avro record is its fields' encodings back to back), then each row's payload and CRC."""
    schema = schema_json("shuffled_message")
    rows, crowds = group.messages, len(group.crowds)
    if not rows or not crowds:
        return encode_rows(schema, shuffled_columns(group), rows)
    names = [field["name"] for field in schema["fields"]]
    split = names.index("payload")
    leading = {
        "schema_version": SCHEMA_VERSION,
        "window_start": int(group.key[0]),
        "window_end": group.window_end,
        **{
            name: pa.array([crowd[position] for crowd in group.crowds], type=pa.string())
            for position, name in enumerate(("channel", "recipe_id", "crowd_id"))
        },
    }
    if names[:split] != list(leading) or names[split:] != ["payload", "payload_crc32c"]:
        raise RuntimeError(f"ShuffledMessage fields changed: {names}")
    heads = _binary(*encode_rows({**schema, "fields": schema["fields"][:split]}, leading, crowds))
    crowd_of_row = np.repeat(np.arange(crowds), np.asarray(group.crowd_rows))
    return encode_rows(
        {**schema, "fields": schema["fields"][split:]},
        {"payload": group.payloads, "payload_crc32c": group.crcs},
        rows,
        prefix=heads,
        prefix_index=crowd_of_row,
    )


def message_file(group: ReleasedGroup, codec: str = "null") -> bytes:
    """The ShuffledMessage container file of a released group, in blocks of about
    :data:`MESSAGE_BLOCK_BYTES`."""
    schema = schema_json("shuffled_message")
    return encode_encoded_container(
        schema, *shuffled_message_rows(group), codec, block_bytes=MESSAGE_BLOCK_BYTES
    )


def _index_name(path: str) -> str:
    """``index/<dir>-<file>.json`` of a release file's relative path."""
    return f"{INDEX_DIR}/{path.replace('/', '-').replace('.avro', '.json')}"


def _publish(
    output_dir: str,
    private_dir: str,
    path: str,
    content: bytes,
    records: int,
    run_id: str | None = None,
    **totals: int,
) -> dict[str, Any]:
    atomic_files.publish_bytes(output_dir, path, content)
    entry = release_format.FileEntry(
        path, len(content), records, hashlib.sha256(content).hexdigest()
    ).to_json()
    entry.update(totals)
    if run_id is not None:  # the commit lists only the entries of its own run
        entry["run_id"] = run_id
    atomic_files.publish_bytes(private_dir, _index_name(path), json.dumps(entry).encode())
    return entry


class WriteShuffledMessages(beam.PTransform):
    """ReleasedGroup -> one ShuffledMessage Avro file each (``messages/<stem>-g<group>.avro``),
    and its release-index entry in the private directory; outputs the index entries."""

    def __init__(
        self, output_dir: str, private_dir: str, codec: str = "null", run_id: str | None = None
    ) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._private_dir = private_dir
        self._codec = codec
        self._run_id = run_id

    def expand(self, released: beam.PCollection) -> beam.PCollection:
        output_dir, private_dir, codec = self._output_dir, self._private_dir, self._codec
        run_id = self._run_id

        def write(group: ReleasedGroup) -> dict[str, Any]:
            content = message_file(group, codec)
            path = message_file_path(group.key, group.group)
            return _publish(output_dir, private_dir, path, content, group.messages, run_id)

        return released | "WriteMessageFile" >> beam.Map(write)


def crowd_table_totals(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Crowds released and withheld and respondents released of a crowd table."""
    totals = dict.fromkeys(CROWD_TOTALS, 0)
    for record in records:
        if record["status"] == "released":
            totals["crowds_released"] += 1
            totals["respondents_released"] += int(record["respondents_released"])
        else:
            totals["crowds_withheld"] += 1
    return totals


class WriteCrowdTables(beam.PTransform):
    """CrowdTable -> ``crowds/<stem>.avro`` (ReleasedCrowd records) and its index entry (with
    :data:`CROWD_TOTALS`); outputs the index entries."""

    def __init__(self, output_dir: str, private_dir: str, run_id: str | None = None) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._private_dir = private_dir
        self._run_id = run_id

    def expand(self, tables: beam.PCollection) -> beam.PCollection:
        output_dir, private_dir, run_id = self._output_dir, self._private_dir, self._run_id
        schema = parsed_schema("released_crowd")

        def write(table: CrowdTable) -> dict[str, Any]:
            sink = io.BytesIO()
            fastavro.writer(sink, schema, table.records, codec="null", sync_marker=_SYNC)
            return _publish(
                output_dir,
                private_dir,
                crowd_table_path(table.key),
                sink.getvalue(),
                len(table.records),
                run_id,
                **crowd_table_totals(table.records),
            )

        return tables | "WriteCrowdTable" >> beam.Map(write)


# A fixed sync marker: a crowd table's bytes depend on its records only (a retried bundle
# writes the same file).
_SYNC = hashlib.sha256(b"esa crowd table").digest()[:16]


def read_index(private_dir: str) -> list[dict[str, Any]]:
    """The release-index entries the run wrote (one per release file), by path."""
    pattern = FileSystems.join(private_dir, INDEX_DIR, "*.json")
    entries = []
    for metadata in FileSystems.match([pattern])[0].metadata_list:
        with FileSystems.open(metadata.path) as handle:
            entries.append(json.loads(handle.read()))
    return sorted(entries, key=lambda entry: entry["path"])


def commit_record(
    instance: int | None,
    recipes: Iterable[str],
    parameters: Mapping[str, Any],
    entries: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """The ``esa-release/2`` commit record (SPEC) of a run from its release index only: every
    file's FileEntry, and the totals summed over the files (records over message files; crowds
    and respondents over crowd tables). ``instance`` None: one run served every instance."""
    files, totals = [], dict.fromkeys(("records_released", *CROWD_TOTALS), 0)
    for entry in entries:
        files.append({name: entry[name] for name in ("path", "bytes", "records", "sha256")})
        if entry["path"].startswith(f"{MESSAGES_DIR}/"):
            totals["records_released"] += int(entry["records"])
        else:
            for name in CROWD_TOTALS:
                totals[name] += int(entry[name])
    return {
        "format": RELEASE_FORMAT,
        "instance": instance,
        "recipes": sorted(recipes),
        "parameters": dict(parameters),
        "files": files,
        **totals,
    }


MANIFEST_DIR = "manifest"


class WriteManifests(beam.PTransform):
    """(BucketKey, CrowdManifest rows) per bucket -> DIR/manifest/window_start=<ms>/<stem>.avro,
    one file per bucket with its crowds only, under a name fixed by the bucket (a retried
    bundle replaces it, ``transforms.common.atomic_files``). A bucket of a window is decided once, also
    in streaming mode (late panes are dead-lettered before), so names never collide."""

    def __init__(self, output_dir: str, streaming: bool = False) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._streaming = streaming

    def expand(self, manifests: beam.PCollection) -> beam.PCollection:
        output_dir = self._output_dir
        schema = parsed_schema("manifest")

        def write(element: tuple[BucketKey, Iterable[tuple]]) -> str:
            key, rows = element
            records = [manifest_dict(row) for row in rows]
            return atomic_files.publish(
                output_dir,
                f"{MANIFEST_DIR}/window_start={int(key[0])}/{bucket_stem(key)}.avro",
                lambda sink: fastavro.writer(sink, schema, records, codec="deflate"),
            )

        return manifests | "WriteManifestFile" >> beam.Map(write)


class WriteMetrics(beam.PTransform):
    """Count dicts -> DIR/metrics.json (:func:`metrics_summary`).

    Streaming mode rewrites the file with the running totals after every update.
    """

    def __init__(self, output_dir: str, streaming: bool = False) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._streaming = streaming

    def expand(self, counts: beam.PCollection) -> beam.PCollection:
        output_dir = self._output_dir

        def write(total: dict[str, int]) -> dict[str, Any]:
            summary = metrics_summary(total)
            path = FileSystems.join(output_dir, "metrics.json")
            with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                handle.write(json.dumps(summary, indent=2, sort_keys=True).encode())
            return summary

        if self._streaming:
            counts = counts | "RunningTotals" >> beam.WindowInto(
                beam_window.GlobalWindows(),
                trigger=beam_trigger.Repeatedly(beam_trigger.AfterCount(1)),
                accumulation_mode=beam_trigger.AccumulationMode.ACCUMULATING,
            )
        combine = beam.CombineGlobally(SumCounts())
        if self._streaming:
            combine = combine.without_defaults()
        return counts | "SumCounts" >> combine | "WriteMetricsFile" >> beam.Map(write)

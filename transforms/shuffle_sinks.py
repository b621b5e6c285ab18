"""Sinks of the shuffler: released message files, the release index and commit, private outputs.

Release (``--output DIR``, SPEC: release layout): ``messages/<name>.avro`` ShuffledMessage files
with DETERMINISTIC names (:func:`message_file_name`: window, a digest of the crowd key and the
group index), so a retried bundle overwrites its file instead of adding one, written to
``_temporary/`` first and renamed when complete (``transforms.atomic_files``); then
``_COMMIT.json``, written last by the driver from the release index (:func:`commit_record`,
``schemas/release.py``).

Shuffler-private (``--private-output PDIR``): ``index/<name>.json`` (one entry per message file:
bytes, records, SHA-256, computed from the bytes written), ``dead_letter/*.avro`` (names from a
digest of their content), ``manifest/window_start=<ms>/part-*.avro`` and ``metrics.json``.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
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
from schemas import release as release_format
from schemas.avro.container import encode_container
from transforms import atomic_files, avro_io
from transforms.combiners import SumCounts
from transforms.shuffle_config import metrics_summary
from transforms.shuffle_steps import manifest_dict, manifest_row

INDEX_DIR = "index"


class ReleasedGroup(NamedTuple):
    """Messages of one crowd released together, in their release order (one output file).

    ``key`` = (window_start, instance, channel, recipe, crowd) names the file; the file itself
    holds only fields a ShuffledMessage carries: no origin, event time or instance.
    """

    key: tuple[int, int, str, str, str | None]
    group: int
    window_end: int
    payloads: pa.Array
    crcs: np.ndarray

    @property
    def messages(self) -> int:
        return len(self.payloads)


def message_file_name(key: Sequence[Any], group: int) -> str:
    """``messages/<window_start>-<digest>-<group>.avro``: the same for the same crowd and group
    in every attempt (the digest covers window, instance, channel, recipe and crowd ID)."""
    digest = hashlib.sha256(json.dumps(list(key), separators=(",", ":")).encode()).hexdigest()
    return f"messages/{int(key[0])}-{digest[:24]}-g{int(group):05d}.avro"


def shuffled_columns(group: ReleasedGroup) -> dict[str, Any]:
    """ShuffledMessage columns of a released group (constants for the crowd's fields)."""
    window_start, _instance, channel, recipe_id, crowd_id = group.key
    return {
        "schema_version": SCHEMA_VERSION,
        "window_start": window_start,
        "window_end": group.window_end,
        "channel": channel,
        "recipe_id": recipe_id,
        "crowd_id": crowd_id,
        "payload": group.payloads,
        "payload_crc32c": group.crcs,
    }


class WriteShuffledMessages(beam.PTransform):
    """ReleasedGroup -> one ShuffledMessage Avro file each, and its release-index entry in the
    private directory; outputs the index entries (dicts of ``schemas.release.FileEntry``)."""

    def __init__(self, output_dir: str, private_dir: str, codec: str = "null") -> None:
        super().__init__()
        self._output_dir = output_dir
        self._private_dir = private_dir
        self._codec = codec

    def expand(self, released: beam.PCollection) -> beam.PCollection:
        output_dir, private_dir, codec = self._output_dir, self._private_dir, self._codec

        def write(group: ReleasedGroup) -> dict[str, Any]:
            name = message_file_name(group.key, group.group)
            content = encode_container(
                schema_json("shuffled_message"), shuffled_columns(group), group.messages, codec
            )
            atomic_files.publish_bytes(output_dir, name, content)
            entry = release_format.FileEntry(
                name, len(content), group.messages, hashlib.sha256(content).hexdigest()
            ).to_json()
            index_name = name.split("/")[-1].replace(".avro", ".json")
            atomic_files.publish_bytes(
                private_dir, f"{INDEX_DIR}/{index_name}", json.dumps(entry).encode()
            )
            return entry

        return released | "WriteMessageFile" >> beam.Map(write)


def read_index(private_dir: str) -> list[dict[str, Any]]:
    """The release-index entries the run wrote (one per message file)."""
    pattern = FileSystems.join(private_dir, INDEX_DIR, "*.json")
    entries = []
    for metadata in FileSystems.match([pattern])[0].metadata_list:
        with FileSystems.open(metadata.path) as handle:
            entries.append(json.loads(handle.read()))
    return sorted(entries, key=lambda entry: entry["path"])


def _ms(value: Any) -> int:
    """Milliseconds of a timestamp-millis field (fastavro reads it as an aware datetime)."""
    if hasattr(value, "timestamp"):
        return round(value.timestamp() * 1000)
    return int(value)


def commit_crowd(manifest: Mapping[str, Any], with_instance: bool) -> dict[str, Any]:
    """A crowd of the commit record from its (private) manifest: a withheld crowd states no
    counts; a released one the distinct respondents and messages it released."""
    released = manifest["status"] == "RELEASED"
    crowd = {
        "window_start_ms": _ms(manifest["window_start"]),
        "window_end_ms": _ms(manifest["window_end"]),
        "channel": manifest["channel"],
        "recipe_id": manifest["recipe_id"],
        "crowd_id": manifest["crowd_id"],
        "status": "released" if released else "withheld",
        "respondents_released": (
            int(manifest["respondents"]) - int(manifest["respondents_deleted"])
            if released
            else None
        ),
        "messages_released": int(manifest["messages_released"]) if released else 0,
    }
    if with_instance:
        crowd["instance"] = int(manifest["shuffler_instance"])
    return crowd


def commit_record(
    instance: int | None,
    recipes: Iterable[str],
    parameters: Mapping[str, Any],
    manifests: Iterable[Mapping[str, Any]],
    files: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """The ``esa-release/1`` commit record (SPEC) of a run. When one run served every instance
    (``instance`` None), each crowd also states its ``instance``."""

    def order(manifest: Mapping[str, Any]) -> tuple[Any, ...]:
        return (
            _ms(manifest["window_start"]),
            int(manifest["shuffler_instance"]),
            manifest["channel"],
            manifest["recipe_id"],
            manifest["crowd_id"] or "",
        )

    # Each manifest becomes its small commit crowd as it is read (``manifests`` may be a stream
    # of a run's whole manifest files): only those, with their order keys, are held and sorted.
    keyed = [(order(m), commit_crowd(m, instance is None)) for m in manifests]
    keyed.sort(key=lambda pair: pair[0])
    crowds = [crowd for _, crowd in keyed]
    del keyed
    files = list(files)  # the entries are not changed: no copy per file
    return {
        "format": release_format.RELEASE_FORMAT,
        "instance": instance,
        "recipes": sorted(recipes),
        "parameters": dict(parameters),
        "crowds": crowds,
        "files": files,
        "records_released": sum(int(entry["records"]) for entry in files),
    }


def _content_name(letters: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for letter in letters:
        digest.update(f"{letter['stage']}|{letter['reason']}|{letter['source']}\n".encode())
    return f"part-{digest.hexdigest()[:32]}.avro"


class WriteDeadLetters(beam.PTransform):
    """Lists of dead letters -> DIR/dead_letter/part-<digest>.avro files (named by content, so a
    retried bundle overwrites its file)."""

    def __init__(self, output_dir: str) -> None:
        super().__init__()
        self._output_dir = output_dir

    def expand(self, letters: beam.PCollection) -> beam.PCollection:
        output_dir = self._output_dir

        def write(batch: list[dict[str, Any]]) -> str:
            path = FileSystems.join(output_dir, "dead_letter", _content_name(batch))
            avro_io.write_avro(path, parsed_schema("dead_letter"), batch)
            return path

        return letters | "WriteDeadLetterFile" >> beam.Map(write)


MANIFEST_DIR = "manifest"
# Manifests of one window are split over this many part files by a hash of the crowd key, so
# that no worker holds every crowd's manifest (issue: no whole-dataset gathers).
MANIFEST_PARTS = 16


def manifest_part(record: Mapping[str, Any], parts: int = MANIFEST_PARTS) -> int:
    """The part file of a crowd's manifest (stable across workers and runs)."""
    key = [record[k] for k in ("shuffler_instance", "channel", "recipe_id", "crowd_id")]
    return zlib.crc32(json.dumps(key).encode()) % parts


class WriteManifests(beam.PTransform):
    """CrowdManifests (dicts or ``shuffle_steps.manifest_row`` tuples, which cross the grouping)
    -> DIR/manifest/window_start=<ms>/part-SSSSS-of-NNNNN.avro: per window
    :data:`MANIFEST_PARTS` parts by crowd (:func:`manifest_part`), each written by one worker with
    its own crowds only, under a name fixed by window and part (a retried bundle replaces it,
    ``transforms.atomic_files``).

    In streaming mode a part of a window is written as the window is released, named
    part-SSSSS-<digest of its content>.avro (a late pane never replaces an earlier one).
    """

    def __init__(self, output_dir: str, streaming: bool = False) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._streaming = streaming

    def expand(self, manifests: beam.PCollection) -> beam.PCollection:
        output_dir, streaming = self._output_dir, self._streaming
        schema = parsed_schema("manifest")

        def by_part(manifest: Any) -> tuple[tuple[int, int], tuple]:
            row = manifest_row(manifest) if isinstance(manifest, Mapping) else tuple(manifest)
            record = manifest_dict(row)
            return (record["window_start"], manifest_part(record)), row

        def write_part(element: tuple[tuple[int, int], Iterable[tuple]]) -> str:
            (window_start, part), rows = element
            records = _sorted_manifests(manifest_dict(row) for row in rows)
            if streaming:
                content = json.dumps(records, sort_keys=True, default=str).encode()
                name = f"part-{part:05d}-{hashlib.sha256(content).hexdigest()[:32]}.avro"
            else:
                name = f"part-{part:05d}-of-{MANIFEST_PARTS:05d}.avro"
            return atomic_files.publish(
                output_dir,
                f"{MANIFEST_DIR}/window_start={window_start}/{name}",
                lambda sink: fastavro.writer(sink, schema, records, codec="deflate"),
            )

        return (
            manifests
            | "KeyByWindowAndPart" >> beam.Map(by_part)
            | "GroupByWindowAndPart" >> beam.GroupByKey()
            | "WriteManifestPart" >> beam.Map(write_part)
        )


def _sorted_manifests(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    def order(record: dict[str, Any]) -> tuple[Any, ...]:
        return (
            record["window_start"],
            record["shuffler_instance"],
            record["channel"],
            record["recipe_id"],
            record["crowd_id"] or "",
        )

    return sorted(records, key=order)


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

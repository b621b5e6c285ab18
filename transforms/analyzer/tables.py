"""The analyzer's result tables: Arrow schemas and per-crowd tables of ``histograms.parquet``
and ``longitudinal.parquet``, and :class:`WriteTableBatches`, which writes them as Parquet
datasets (one part file per shard of crowd buckets, at most about :data:`ROWS_PER_PART` rows and
:data:`CROWDS_PER_PART` crowds each, so no worker or driver holds every crowd's table); rows
reach it as compressed Arrow IPC batches (:func:`pack_table`).
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.analyzer import arithmetic
from transforms.common import atomic_files

if TYPE_CHECKING:
    from transforms.analyzer.analyze import AnalysisConfig

# Crowd tables are split over part files of about this many rows each, and of at most about
# this many crowds each (reports and notes go to the same parts: a part is written by one worker
# holding all of its crowds' rows and reports, so its size must not grow with the crowds).
ROWS_PER_PART = 1_000_000
CROWDS_PER_PART = 1_000
_TIME = pa.timestamp("ms", tz="UTC")


def histogram_schema(config: AnalysisConfig) -> pa.Schema:
    """Columns of histograms.parquet (``truth`` only when the simulation's truth is known)."""
    fields = [
        pa.field("window_start", _TIME),
        pa.field("window_end", _TIME),
        pa.field("channel", pa.string()),
        pa.field("recipe_id", pa.string()),
        pa.field("crowd", pa.string()),
        pa.field("bucket", pa.int64()),
        pa.field("estimate", pa.float64()),
        pa.field("stderr", pa.float64()),
        pa.field("raw_count", pa.int64()),
        pa.field("n", pa.float64()),
    ]
    if config.postprocessed_column:
        fields.append(pa.field(config.postprocessed_column, pa.float64()))
    if config.truth:
        fields.append(pa.field("truth", pa.float64()))
    return pa.schema(fields)


def longitudinal_schema(config: AnalysisConfig) -> pa.Schema:
    """Columns of longitudinal.parquet."""
    fields = [
        pa.field("channel", pa.string()),
        pa.field("recipe_id", pa.string()),
        pa.field("crowd", pa.string()),
        pa.field("round_start", _TIME),
        pa.field("period", pa.int32()),
        pa.field("window_start", _TIME),
        pa.field("window_end", _TIME),
        pa.field("estimate", pa.float64()),
        pa.field("stderr", pa.float64()),
        pa.field("error_bound", pa.float64()),
        pa.field("n", pa.float64()),
        pa.field("n_period", pa.float64()),
    ]
    if config.truth:
        fields.append(pa.field("truth", pa.float64()))
    return pa.schema(fields)


def histogram_table(
    result: arithmetic.HistogramResult,
    config: AnalysisConfig,
    truth: np.ndarray | None,
    schema: pa.Schema | None = None,
) -> pa.Table:
    """histograms.parquet rows of one crowd (``schema``: ``histogram_schema(config)``, given by
    a caller that makes many tables)."""
    rows = result.buckets.size
    _, start, end, channel, recipe_id, crowd_id = result.key
    columns: dict[str, Any] = {
        "window_start": pa.array(np.full(rows, start, dtype=np.int64), type=_TIME),
        "window_end": pa.array(np.full(rows, end, dtype=np.int64), type=_TIME),
        "channel": pa.array([channel] * rows, pa.string()),
        "recipe_id": pa.array([recipe_id] * rows, pa.string()),
        "crowd": pa.array([crowd_id] * rows, pa.string()),
        "bucket": pa.array(result.buckets, pa.int64()),
        "estimate": pa.array(result.estimate, pa.float64()),
        "stderr": pa.array(result.stderr, pa.float64()),
        "raw_count": pa.array(result.raw_count, pa.int64())
        if result.raw_count is not None
        else pa.nulls(rows, pa.int64()),
        "n": pa.array(np.full(rows, result.respondents), pa.float64()),
    }
    if config.postprocessed_column:
        columns[config.postprocessed_column] = (
            pa.array(result.postprocessed, pa.float64())
            if result.postprocessed is not None
            else pa.nulls(rows, pa.float64())
        )
    if config.truth:
        columns["truth"] = (
            pa.array(truth, pa.float64()) if truth is not None else pa.nulls(rows, pa.float64())
        )
    return pa.table(columns, schema=schema or histogram_schema(config))


def histogram_rows_table(
    rows: arithmetic.HistogramRows,
    config: AnalysisConfig,
    truth: Mapping[int, np.ndarray],
    schema: pa.Schema | None = None,
) -> pa.Table:
    """histograms.parquet rows of many crowds (``arithmetic.HistogramRows``) as one table: crowd
    i's rows are what :func:`histogram_table` makes of ``rows.result(i)``, built column by column
    from the stacked matrices. ``truth``: row -> the dense truth of each crowd that has one (the
    others' truth is null, as in their own tables)."""
    crowds, domain = rows.estimate.shape
    if not crowds:
        return (schema or histogram_schema(config)).empty_table()
    size = crowds * domain
    keys = rows.keys

    def repeated(values: Sequence, dtype: Any) -> np.ndarray:
        return np.repeat(np.array(values, dtype=dtype), domain)

    # Each crowd's strings converted once, then repeated per bucket by Arrow (no Python object
    # per row).
    crowd_of_row = pa.array(np.repeat(np.arange(crowds, dtype=np.int64), domain))

    def strings(values: Sequence) -> pa.Array:
        return pa.array(values, pa.string()).take(crowd_of_row)

    _, starts, ends, channels, recipe_ids, crowd_ids = zip(*keys, strict=True)
    columns: dict[str, Any] = {
        "window_start": pa.array(repeated(starts, np.int64), type=_TIME),
        "window_end": pa.array(repeated(ends, np.int64), type=_TIME),
        "channel": strings(channels),
        "recipe_id": strings(recipe_ids),
        "crowd": strings(crowd_ids),
        "bucket": pa.array(np.tile(np.arange(domain, dtype=np.int64), crowds), pa.int64()),
        "estimate": pa.array(rows.estimate.ravel(), pa.float64()),
        "stderr": pa.array(rows.stderr.ravel(), pa.float64()),
        "raw_count": pa.array(rows.raw_count.ravel(), pa.int64())
        if rows.raw_count is not None
        else pa.nulls(size, pa.int64()),
        "n": pa.array(np.repeat(rows.respondents, domain), pa.float64()),
    }
    if config.postprocessed_column:
        columns[config.postprocessed_column] = (
            pa.array(rows.postprocessed.ravel(), pa.float64())
            if rows.postprocessed is not None
            else pa.nulls(size, pa.float64())
        )
    if config.truth:
        if not truth:
            columns["truth"] = pa.nulls(size, pa.float64())
        else:
            values = np.zeros((crowds, domain))
            missing = np.ones((crowds, domain), dtype=bool)
            for row, dense in truth.items():
                values[row], missing[row] = dense, False
            columns["truth"] = pa.array(values.ravel(), pa.float64(), mask=missing.ravel())
    return pa.table(columns, schema=schema or histogram_schema(config))


def longitudinal_table(
    result: arithmetic.LongitudinalResult, config: AnalysisConfig, truth: np.ndarray | None
) -> pa.Table:
    """longitudinal.parquet rows of one round: one per period t = 1..d."""
    rows = result.periods
    _, _, _, channel, recipe_id, crowd_id = result.key
    starts = result.window_starts()
    columns: dict[str, Any] = {
        "channel": pa.array([channel] * rows, pa.string()),
        "recipe_id": pa.array([recipe_id] * rows, pa.string()),
        "crowd": pa.array([crowd_id] * rows, pa.string()),
        "round_start": pa.array(np.full(rows, result.round_start, dtype=np.int64)).cast(_TIME),
        "period": pa.array(np.arange(1, rows + 1, dtype=np.int32)),
        "window_start": pa.array(starts).cast(_TIME),
        "window_end": pa.array(starts + result.window_ms).cast(_TIME),
        "estimate": pa.array(result.estimate, pa.float64()),
        "stderr": pa.array(result.stderr, pa.float64()),
        "error_bound": pa.array(np.full(rows, result.bound), pa.float64()),
        "n": pa.array(np.full(rows, result.respondents), pa.float64()),
        "n_period": pa.array(result.respondents_per_period, pa.float64()),
    }
    if config.truth:
        columns["truth"] = (
            pa.array(truth, pa.float64()) if truth is not None else pa.nulls(rows, pa.float64())
        )
    return pa.table(columns, schema=longitudinal_schema(config))


_SORT_COLUMNS = ("channel", "recipe_id", "crowd", "window_start", "round_start", "bucket", "period")


def sorted_rows(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """``table.sort_by`` ascending by the columns ``names`` (a stable sort, nulls last), as one
    ``np.lexsort`` of integer keys: a string column's key is each value's rank among the
    column's distinct values (sorted by Arrow, as ``sort_by`` compares them), so only those
    are compared as strings. Other columns must be integers or timestamps (else, or with
    nulls in them, ``sort_by`` itself)."""
    keys = []
    for name in reversed(names):  # lexsort's last key is its first
        column = table.column(name).combine_chunks()
        if pa.types.is_string(column.type):
            encoded = pc.dictionary_encode(column)
            order = pc.array_sort_indices(encoded.dictionary).to_numpy()
            rank = np.empty(len(order) + 1, dtype=np.int64)
            rank[order] = np.arange(len(order))
            rank[-1] = len(order)  # a null after every string
            keys.append(rank[encoded.indices.fill_null(len(order)).to_numpy()])
        elif (pa.types.is_integer(column.type) or pa.types.is_timestamp(column.type)) and (
            not column.null_count
        ):
            keys.append(column.cast(pa.int64()).to_numpy())
        else:
            return table.sort_by([(n, "ascending") for n in names])
    return table.take(np.lexsort(keys))


def shard_of(key: tuple, shards: int) -> int:
    """The part file of a crowd or a crowd bucket: a stable hash of its key (the same on every
    worker and run)."""
    return zlib.crc32(repr(tuple(key)).encode()) % max(1, int(shards))


def part_path(directory: str, shard: int, shards: int) -> str:
    return FileSystems.join(directory, f"part-{shard:05d}-of-{shards:05d}.parquet")


# Batches crossing a grouping are compressed whole with LZ4 (frame format), one call per batch:
# the 795 batches (77.6 MB) of bench_crowds' 99,518-crowd analysis compress and decompress in
# about 40% of zstd's time at level 1 (400 of them, two runs: 34-36 ms against 83-98 ms), at
# about twice its size (19% of the bytes against 11%); zstd was a third of Arrow IPC's
# per-buffer compression and of zlib at its fastest level.
_BATCH_CODEC = pa.Codec("lz4")
_SIZE = struct.Struct("<Q")


def compress_batch(data: bytes) -> bytes:
    """``data`` LZ4-compressed after its length (read back by :func:`decompress_batch`)."""
    return _SIZE.pack(len(data)) + _BATCH_CODEC.compress(data, asbytes=True)


def decompress_batch(batch: bytes) -> bytes:
    """The bytes :func:`compress_batch` compressed."""
    (size,) = _SIZE.unpack_from(batch)
    return _BATCH_CODEC.decompress(
        memoryview(batch)[_SIZE.size :], decompressed_size=size, asbytes=True
    )


def pack_table(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream, compressed (:func:`compress_batch`; read back by
    :func:`unpack_table`): what crosses a grouping is then bytes, not Arrow buffers and
    wrappers, and a runner that keeps grouped values in memory (Beam's FnApiRunner) holds a
    fraction of the rows' bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return compress_batch(sink.getvalue().to_pybytes())


def unpack_table(data: bytes) -> pa.Table:
    """The table of a :func:`pack_table` stream."""
    with pa.ipc.open_stream(pa.py_buffer(decompress_batch(data))) as reader:
        return reader.read_all()


# Batches spilled by the estimates (``spill_batches``) live under this directory of the analysis's
# output, which the driver removes once the pipeline has finished, on success and on failure.
SPILL_DIR = "_batches"
# A bucket's batches are spilled together, one file per bucket, or per this many bytes of them
# when a bucket's outputs weigh more (how much of a bucket's output its worker holds at once).
SPILL_FILE_BYTES = 8 << 20


class SpilledBatch(NamedTuple):
    """Where :func:`spill_batches` put one batch: ``size`` bytes at ``offset`` of ``path``."""

    path: str
    offset: int
    size: int


def spill_batches(directory: str, name: str, batches: Sequence[bytes]) -> list[SpilledBatch]:
    """Write several batches' bytes one after another to ``directory/name`` (write-then-rename,
    ``atomic_files``: a retried bundle rewrites the same name) and return where each is, which
    then crosses a grouping instead of the bytes: on a runner that holds grouped values in
    memory (FnApiRunner) what a grouping holds no longer grows with the rows. One file for all
    the batches of a bucket: creating a file costs more than writing a batch's few kilobytes
    (0.3-0.5 ms a file on a virtual disk: 475 files, 0.25 s of an analysis of 99,518 crowds,
    written in 160 files instead)."""
    path = atomic_files.publish_bytes(directory, name, b"".join(batches))
    sizes = [len(batch) for batch in batches]
    ends = itertools.accumulate(sizes)
    return [SpilledBatch(path, end - size, size) for end, size in zip(ends, sizes, strict=True)]


def load_batch(batch: bytes | SpilledBatch) -> bytes:
    """The bytes of a batch: ``batch`` itself, or what :func:`spill_batches` wrote (an I/O
    error naming the file when it holds less)."""
    if isinstance(batch, bytes):
        return batch
    path, offset, size = batch
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.seek(offset)
        data = handle.read(size)
    if len(data) != size:
        raise OSError(f"{path}: a spilled batch of {size} bytes at {offset} holds {len(data)}")
    return data


def write_part(
    directory: str,
    shard: int,
    shards: int,
    tables: Iterable[pa.Table | bytes | SpilledBatch],
    schema: pa.Schema,
) -> str:
    """One part file: the shard's crowd tables (or :func:`pack_table` bytes of them, or where
    :func:`spill_batches` spilled such bytes), sorted (an
    empty table with the schema if none). Named by shard index, so a retried bundle overwrites
    its own file; written to ``directory/_temporary/`` and renamed when complete
    (``transforms.common.atomic_files``)."""
    tables = [t if isinstance(t, pa.Table) else unpack_table(load_batch(t)) for t in tables]
    tables = [table for table in tables if table.num_rows]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if table.num_rows:
        table = sorted_rows(table, [n for n in _SORT_COLUMNS if n in table.column_names])
    name = part_path(directory, shard, shards).rsplit("/", 1)[-1]
    # encoded in memory (the table is held whole anyway), then written at once: Parquet's many
    # small writes through a Python file object cost more than the copy
    encoded = pa.BufferOutputStream()
    pq.write_table(table, encoded)
    return atomic_files.publish(directory, name, lambda sink: sink.write(encoded.getvalue()))


class WriteParts(beam.PTransform):
    """Several datasets' (part, value) pairs -> their part files: ``writers[i](part, values)``
    writes part ``part`` of dataset i (the i-th input) from its values and returns the file's
    path, for EVERY part in ``range(shards)`` of every dataset, empty ones included, so each part
    file is written (and a retry rewrites it) whatever the data. One grouping by part serves
    them all (a grouping costs a few runner stages whatever it carries): the worker of a part
    writes that part of each dataset, holding only the part's values (paths of spilled batches,
    in the analysis), and one marker per part asks for it."""

    def __init__(self, writers: Sequence[Callable[[int, list], str]], shards: int) -> None:
        super().__init__()
        if int(shards) < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self._writers, self._shards = tuple(writers), int(shards)

    def expand(self, streams: tuple[beam.PCollection, ...]) -> beam.PCollection:
        writers, shards = self._writers, self._shards
        if len(streams) != len(writers):
            raise ValueError(f"{len(streams)} datasets for {len(writers)} writers")
        pipeline = streams[0].pipeline
        # (dataset index, value) for a value; (None, None) marks a part as wanted.
        every = pipeline | "PartIndices" >> beam.Create(
            [(shard, (None, None)) for shard in range(shards)],
            reshuffle=False,  # a few small elements: one more grouping would cost more
        )
        keyed = [
            stream
            | f"KeyParts{index}"
            >> beam.MapTuple(lambda shard, value, index=index: (shard, (index, value)))
            for index, stream in enumerate(streams)
        ]

        def write(shard: int, tagged: Iterable[tuple[int | None, Any]]) -> list[str]:
            values: list[list] = [[] for _ in writers]
            for index, value in tagged:
                if index is not None:
                    values[index].append(value)
            return [writer(shard, own) for writer, own in zip(writers, values, strict=True)]

        return (
            (every, *keyed)
            | "AllParts" >> beam.Flatten()
            | "GroupParts" >> beam.GroupByKey()
            | "WriteParts" >> beam.FlatMapTuple(write)
        )


# A bucket's estimated rows are sent to their part every this many rows (a small Arrow table
# costs kilobytes of buffers and wrappers whatever its rows, so rows travel in batches).
ROWS_PER_BATCH = 1 << 16


def concat_compact(tables: list[pa.Table]) -> pa.Table:
    """``tables`` (one schema) as one table with one chunk per column."""
    return pa.concat_tables(tables).combine_chunks()


class WriteTableBatches(beam.PTransform):
    """(part, Arrow table or :func:`pack_table` bytes) -> ``directory/part-SSSSS-of-NNNNN.parquet``: each part is written by
    one worker holding only its own batches (:func:`write_part`, sorted); every part in
    ``range(shards)`` exists (empty ones too), so the directory always reads as one table with
    ``schema``."""

    def __init__(self, directory: str, schema: pa.Schema, shards: int) -> None:
        super().__init__()
        if int(shards) < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self._directory, self._schema, self._shards = directory, schema, int(shards)

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        return (batches,) | WriteParts([self.writer()], self._shards)

    def writer(self) -> Callable[[int, list], str]:
        """What writes one part (:class:`WriteParts`' writer)."""
        directory, schema, shards = self._directory, self._schema, self._shards
        return lambda shard, tables: write_part(directory, shard, shards, tables, schema)


def table_parts(rows: int, rows_per_part: int = ROWS_PER_PART) -> int:
    """Part files for about ``rows`` rows (at least one)."""
    return max(1, math.ceil(max(0, int(rows)) / max(1, int(rows_per_part))))


def analysis_parts(rows: int, crowds: int, crowds_per_part: int = CROWDS_PER_PART) -> int:
    """Part files of an analysis of about ``rows`` table rows and ``crowds`` crowds: at most
    about :data:`ROWS_PER_PART` rows and ``crowds_per_part`` crowds each (at least one)."""
    by_crowds = math.ceil(max(0, int(crowds)) / max(1, int(crowds_per_part)))
    return max(table_parts(rows), by_crowds)

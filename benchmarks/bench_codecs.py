"""Codec throughput, each against a baseline measured in the same run on the same data.

- Payloads: the vectorized codec of ``schemas.payloads`` against fastavro's per-record
  ``schemaless_writer``/``schemaless_reader``; ``crc32c_many`` against one
  ``google_crc32c.value`` call per payload.
- Container files: our reader (``schemas.avro.reader``) against polars' ``read_avro`` on the
  same Report and ShuffledMessage files. polars is adopted only if it is faster and keeps every
  guarantee of ours; the note of each row says what polars does with a corrupt block, a
  truncated file and a block whose header understates its record count (checked in the run).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import fastavro
import google_crc32c
import numpy as np
import pyarrow as pa

from privacy.rng import seeded_generator
from schemas import SCHEMA_VERSION, payloads, schema_json
from schemas.avro import varint
from schemas.avro.container import ByteStream, encode_container
from schemas.avro.crc32c import crc32c_many
from schemas.avro.reader import ColumnBatch, read_container_bytes


def _best_rate(function: Callable[[], object], items: int, repeats: int) -> float:
    """Items per second of the fastest of ``repeats`` runs (the machine is shared and noisy)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return items / best


def _messages(kind: str, n: int) -> dict[str, np.ndarray]:
    rng = seeded_generator(2024)
    columns = {
        "bucket": rng.integers(0, 4096, n),
        "fragment": rng.integers(1, 5, n),
        "period": rng.integers(1, 17, n),
        "node": rng.integers(0, 31, n),
        "sign": np.where(rng.random(n) < 0.5, -1, 1),
        "row": rng.integers(0, 1024, n),
        "column": rng.integers(0, 65536, n),
    }
    return {name: columns[name] for name in payloads.LAYOUTS[kind].field_names}


def _rows_for(kind: str, n: int, n_baseline: int, repeats: int) -> list[dict]:
    fields = _messages(kind, n)
    schema = payloads.payload_record_schema(kind)
    tag = payloads.PAYLOAD_KINDS[kind]
    subset = {name: values[:n_baseline].tolist() for name, values in fields.items()}
    records = [
        {"kind": tag, **{name: subset[name][i] for name in subset}} for i in range(n_baseline)
    ]

    def fastavro_encode() -> list[bytes]:
        out = []
        for record in records:
            buffer = io.BytesIO()
            fastavro.schemaless_writer(buffer, schema, record)
            out.append(buffer.getvalue())
        return out

    encoded_list = fastavro_encode()

    def fastavro_decode() -> list[dict]:
        return [fastavro.schemaless_reader(io.BytesIO(item), schema, None) for item in encoded_list]

    def vector_encode() -> payloads.EncodedPayloads:
        return payloads.encode_payloads(kind, fields, count=n)

    def vector_encode_bytes() -> list[bytes]:
        return payloads.encode_payloads(kind, fields, count=n).to_list()

    encoded = vector_encode()
    as_bytes = encoded.to_list()

    def vector_decode_buffer() -> payloads.DecodedPayloads:
        return payloads.decode_payloads(encoded)

    def vector_decode_bytes() -> payloads.DecodedPayloads:
        return payloads.decode_payloads(as_bytes)

    def crc_loop() -> list[int]:
        return [google_crc32c.value(item) for item in as_bytes]

    def crc_vector() -> np.ndarray:
        return crc32c_many(encoded)

    assert payloads.decode_payloads(as_bytes).valid.all()
    assert crc_vector().tolist() == crc_loop()
    encode_baseline = _best_rate(fastavro_encode, n_baseline, repeats)
    decode_baseline = _best_rate(fastavro_decode, n_baseline, repeats)
    crc_baseline = _best_rate(crc_loop, n, repeats)
    measured = [
        (
            "encode",
            "to one buffer + offsets",
            _best_rate(vector_encode, n, repeats),
            encode_baseline,
        ),
        (
            "encode",
            "to a list of bytes",
            _best_rate(vector_encode_bytes, n, repeats),
            encode_baseline,
        ),
        (
            "decode",
            "from one buffer + offsets",
            _best_rate(vector_decode_buffer, n, repeats),
            decode_baseline,
        ),
        (
            "decode",
            "from a list of bytes",
            _best_rate(vector_decode_bytes, n, repeats),
            decode_baseline,
        ),
        ("crc32c", "crc32c_many over one buffer", _best_rate(crc_vector, n, repeats), crc_baseline),
    ]
    baselines = {
        "encode": "fastavro.schemaless_writer per record",
        "decode": "fastavro.schemaless_reader per record",
        "crc32c": "google_crc32c.value per payload",
    }
    return [
        {
            "benchmark": f"payload_{operation}_{kind}",
            "metric": "messages_per_s",
            "value": value,
            "baseline": baseline,
            "ratio": value / baseline,
            "note": f"{how}, n={n}; baseline: {baselines[operation]} (n={n_baseline if operation != 'crc32c' else n})",
        }
        for operation, how, value, baseline in measured
    ]


def _container_columns(schema: str, n: int) -> dict[str, object]:
    """Columns of ``n`` realistic records of a message schema (24-byte payloads)."""
    rng = seeded_generator(7)
    payloads_array = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(24), n, [None, pa.py_buffer(rng.bytes(24 * n))]
    ).cast(pa.binary())
    columns: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "channel": "location_heatmap",
        "recipe_id": "image_grid_onehot@1",
        "crowd_id": pa.array(np.where(rng.random(n) < 0.5, "de-CH", None), type=pa.string()),
        "payload": payloads_array,
        "payload_crc32c": crc32c_many(payloads_array),
    }
    if schema == "report":
        origins = pa.array(np.char.add("device-", rng.integers(0, 10**9, n).astype(str)))
        columns |= {
            "shuffler_instance": 0,
            "min_crowd_size": 100,
            "origin": origins,
            "event_time": 1_700_006_400_000 + rng.integers(0, 86_400_000, n),
        }
    else:
        columns |= {"window_start": 1_700_006_400_000, "window_end": 1_700_092_800_000}
    return columns


def _polars_outcomes(polars: Any, data: bytes) -> str:
    """What polars does with a corrupt block, a truncated file and an understated count."""
    sync = fastavro.reader(io.BytesIO(data))._header["sync"]
    start = data.index(sync) + 16  # the first block; the third one starts after two more syncs
    for _ in range(2):
        start = data.index(sync, start) + 16
    total = sum(block.num_records for block in fastavro.block_reader(io.BytesIO(data)))
    stream = ByteStream(io.BytesIO(data))
    stream.skip(start)
    count = stream.read_long()
    after_count = stream.position
    size = stream.read_long()
    data_start = stream.position
    corrupt = bytearray(data)
    corrupt[data_start + size // 2 : data_start + size // 2 + 40] = b"\xff" * 40
    understated = data[:start] + varint.encode_long(count - 1) + data[after_count:]
    outcomes = []
    for name, content, records in (
        ("corrupt block", bytes(corrupt), None),
        ("truncated file", data[: len(data) // 2], None),
        ("understated count", understated, total),
    ):
        try:
            height = polars.read_avro(io.BytesIO(content)).height
        except Exception as error:  # noqa: BLE001 - the outcome is what we measure
            outcomes.append(f"{name}: raises {type(error).__name__} (whole file lost)")
            continue
        lost = "" if records is None else f", {records - height} record(s) lost silently"
        outcomes.append(f"{name}: reads {height} records{lost}")
    return "; ".join(outcomes)


def _reader_rows(n: int, repeats: int) -> list[dict]:
    try:
        import polars
    except ImportError:
        return [{"benchmark": "avro_read", "metric": "skipped", "note": "polars not installed"}]
    rows = []
    for schema in ("report", "shuffled_message"):
        columns = _container_columns(schema, n)
        for codec in ("null", "deflate"):
            data = encode_container(schema_json(schema), columns, n, codec, 64_000)

            def ours(data: bytes = data) -> int:
                items = read_container_bytes(data)
                return sum(item.rows for item in items if isinstance(item, ColumnBatch))

            def theirs(data: bytes = data) -> int:
                return polars.read_avro(io.BytesIO(data)).height

            assert ours() == theirs() == n
            value, baseline = _best_rate(ours, n, repeats), _best_rate(theirs, n, repeats)
            rows.append(
                {
                    "benchmark": f"avro_read_{schema}_{codec}",
                    "metric": "records_per_s",
                    "value": value,
                    "baseline": baseline,
                    "ratio": value / baseline,
                    "note": f"schemas.avro.reader vs polars {polars.__version__} read_avro, "
                    f"n={n}; polars on damage: {_polars_outcomes(polars, data)}",
                }
            )
    return rows


def run(quick: bool) -> list[dict]:
    n, n_baseline, repeats = (20_000, 5_000, 1) if quick else (1_000_000, 100_000, 3)
    rows = []
    for kind in ("bucket", "tree_node"):
        rows.extend(_rows_for(kind, n, n_baseline, repeats))
    rows.extend(_reader_rows(50_000 if quick else 2_000_000, 2 if quick else 3))
    return rows


if __name__ == "__main__":
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(
            f"{row['benchmark']:32s} {row['value']:12.4g} vs {row['baseline']:12.4g} "
            f"x{row['ratio']:7.2f}  {row['note']}"
        )

"""Payload codec throughput: the vectorized codec of ``schemas.payloads`` against fastavro's
per-record ``schemaless_writer``/``schemaless_reader``, and ``crc32c_many`` against one
``google_crc32c.value`` call per payload, all measured in the same run on the same messages."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import fastavro
import google_crc32c
import numpy as np

from privacy.rng import seeded_generator
from schemas import payloads
from schemas.avro.crc32c import crc32c_many


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


def run(quick: bool) -> list[dict]:
    n, n_baseline, repeats = (20_000, 5_000, 1) if quick else (1_000_000, 100_000, 3)
    rows = []
    for kind in ("bucket", "tree_node"):
        rows.extend(_rows_for(kind, n, n_baseline, repeats))
    return rows


if __name__ == "__main__":
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(
            f"{row['benchmark']:32s} {row['value']:12.4g} vs {row['baseline']:12.4g} "
            f"x{row['ratio']:7.2f}  {row['note']}"
        )

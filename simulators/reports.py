"""Report records (``schemas/report.avsc``) of one shuffler instance as columns, and their Avro
binary encoding with numpy (pure: no Beam, no files).

:func:`encode_report_records` writes the same bytes fastavro writes (checked by the tests with
fastavro and the Apache reference library), because building one Python dict per message would
cost more than everything else together; ``schemas.avro.container.ContainerWriter`` frames them
(Avro 1.11 specification, "Object Container Files").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from schemas import SCHEMA_VERSION
from schemas.avro.varint import encode_bytes, encode_long, varint_lengths, varint_matrix, zigzag
from schemas.payloads import EncodedPayloads

__all__ = ["ReportBatch", "report_prefix", "encode_report_records"]


@dataclass(frozen=True, eq=False)
class ReportBatch:
    """Report records (``schemas/report.avsc``) of one shuffler instance, as columns.

    ``origin`` holds fixed-width ASCII origin strings as an ``(n, w)`` uint8 array; ``payloads``
    the Avro-binary payloads (``schemas.payloads.EncodedPayloads``) and ``payload_crc32c`` their
    CRC32C. Fields that are the same for every record of a recipe are scalars.
    """

    shuffler_instance: int
    channel: str
    recipe_id: str
    min_crowd_size: int
    origin: np.ndarray
    event_time_ms: np.ndarray
    payloads: EncodedPayloads
    payload_crc32c: np.ndarray
    crowd_id: str | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        n = len(self.payloads)
        if self.origin.ndim != 2 or self.origin.shape[0] != n:
            raise ValueError(f"origin must be an (n, width) array for {n} records")
        if self.event_time_ms.shape != (n,) or self.payload_crc32c.shape != (n,):
            raise ValueError(f"event_time_ms and payload_crc32c must have {n} entries")

    def __len__(self) -> int:
        return len(self.payloads)

    def to_arrow(self) -> pa.RecordBatch:
        """The records as one Arrow RecordBatch, one column per Report field (Avro ``int`` as
        int32, ``long`` and timestamps as int64, ``bytes`` as binary), built without per-record
        Python."""
        n = len(self)
        width = self.origin.shape[1]
        origin = np.ascontiguousarray(self.origin).view(f"S{width}").ravel()
        columns = {
            "schema_version": pa.array(np.full(n, self.schema_version, np.int32)),
            "shuffler_instance": pa.array(np.full(n, self.shuffler_instance, np.int32)),
            "channel": _constant_strings(self.channel, n),
            "recipe_id": _constant_strings(self.recipe_id, n),
            "crowd_id": pa.nulls(n, pa.string())
            if self.crowd_id is None
            else _constant_strings(self.crowd_id, n),
            "min_crowd_size": pa.array(np.full(n, self.min_crowd_size, np.int32)),
            "origin": pa.array(origin, pa.binary(width)).cast(pa.binary()).cast(pa.string()),
            "event_time": pa.array(self.event_time_ms.astype(np.int64)),
            "payload": self.payloads.to_arrow().cast(pa.binary()),
            "payload_crc32c": pa.array(self.payload_crc32c.astype(np.int64)),
        }
        return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))

    def to_records(self) -> list[dict[str, Any]]:
        """The records as dicts (per-record Python: for tests and small batches only)."""
        origins = [row.tobytes().decode("ascii") for row in self.origin]
        return [
            {
                "schema_version": self.schema_version,
                "shuffler_instance": self.shuffler_instance,
                "channel": self.channel,
                "recipe_id": self.recipe_id,
                "crowd_id": self.crowd_id,
                "min_crowd_size": self.min_crowd_size,
                "origin": origin,
                "event_time": int(event_time),
                "payload": payload,
                "payload_crc32c": int(crc),
            }
            for origin, event_time, payload, crc in zip(
                origins,
                self.event_time_ms.tolist(),
                self.payloads.to_list(),
                self.payload_crc32c.tolist(),
                strict=True,
            )
        ]


def _constant_strings(text: str, n: int) -> pa.Array:
    """``n`` copies of ``text`` as an Arrow string array, from buffers."""
    data = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data * n))


def report_prefix(batch: ReportBatch) -> bytes:
    """The bytes every record of ``batch`` starts with: the fields before ``origin``."""
    crowd = b"\x00" if batch.crowd_id is None else b"\x02" + encode_bytes(batch.crowd_id)
    return (
        encode_long(batch.schema_version)
        + encode_long(batch.shuffler_instance)
        + encode_bytes(batch.channel)
        + encode_bytes(batch.recipe_id)
        + crowd
        + encode_long(batch.min_crowd_size)
    )


def encode_report_records(batch: ReportBatch) -> EncodedPayloads:
    """Avro binary of every record of ``batch`` (field order of ``report.avsc``), in one buffer.

    Vectorized over records: each field gets a fixed-width slot in an ``(n, width)`` byte matrix
    (constant fields one broadcast prefix, varints one column per byte position, payload bytes
    one masked assignment); a mask of the bytes in use then packs the rows into the records.
    """
    n = len(batch)
    origin_width = batch.origin.shape[1]
    head = np.frombuffer(report_prefix(batch) + encode_long(origin_width), dtype=np.uint8)
    payload_lengths = batch.payloads.lengths
    zigzagged = [
        zigzag(batch.event_time_ms),
        zigzag(payload_lengths),
        zigzag(batch.payload_crc32c.astype(np.int64)),
    ]
    lengths = [varint_lengths(z) for z in zigzagged]
    event_slot, length_slot, crc_slot = (
        varint_matrix(z, length) for z, length in zip(zigzagged, lengths, strict=True)
    )
    payload_width = int(payload_lengths.max(initial=0))
    slots = [
        (head.size, None),
        (origin_width, None),
        (event_slot.shape[1], lengths[0]),
        (length_slot.shape[1], lengths[1]),
        (payload_width, payload_lengths),
        (crc_slot.shape[1], lengths[2]),
    ]
    matrix = np.empty((n, sum(width for width, _ in slots)), dtype=np.uint8)
    used = np.ones(matrix.shape, dtype=bool)
    column = 0
    for (width, used_bytes), content in zip(
        slots, (head, batch.origin, event_slot, length_slot, None, crc_slot), strict=True
    ):
        region = slice(column, column + width)
        if used_bytes is not None:
            used[:, region] = np.arange(width) < used_bytes[:, None]
        if content is None:  # payload bytes fill their slot's used part in row-major order
            matrix[:, region][used[:, region]] = batch.payloads.data
        else:
            matrix[:, region] = content
        column += width
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(used.sum(axis=1), out=offsets[1:])
    return EncodedPayloads(matrix[used], offsets)

"""A hostile-input corpus for the Avro reader, generated (never checked in as blobs).

Files are written with Apache's reference ``avro`` library (and fastavro where the reference
library refuses to write what a hostile writer would), then damaged byte by byte. Every case
knows how many records its bytes hold, so a test can check that the reader accounts for each
of them: records read + records in dead-letter chunks == records held, or some chunk says that
nobody can know (``records is None``).
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import avro.datafile
import avro.io
import avro.schema
import fastavro
import numpy as np

from schemas import crc32c, schema_json
from schemas.avro.container import SYNC_SIZE, frame_block
from schemas.avro.varint import encode_long

T0 = 1_700_006_400_000


@dataclass(frozen=True)
class Case:
    """A file's bytes and what reading it must give."""

    name: str
    data: bytes
    held: int  # records whose bytes (or block header) are in the file
    exact: bool = True  # False: the reader may answer "unknown" for some chunk
    readable: bool = False  # True: every record must be read, none dead-lettered
    expect: dict[str, Any] | None = None  # the reader schema passed to the reader


def report(index: int, rng: np.random.Generator) -> dict[str, Any]:
    payload = rng.bytes(int(rng.integers(1, 40)))
    return {
        "schema_version": 1,
        "shuffler_instance": int(index % 2),
        "channel": "test",
        "recipe_id": "test@1",
        "crowd_id": None if index % 3 else f"crowd-{index % 5}",
        "min_crowd_size": 1,
        "origin": f"device-{index}",
        "event_time": T0 + index,
        "payload": payload,
        "payload_crc32c": crc32c(payload),
    }


def reports(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [report(index, rng) for index in range(count)]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_AS_PYTHON = {  # what the reference library wants for values of these logical types
    "timestamp-millis": lambda v: _EPOCH + dt.timedelta(milliseconds=v),
    "timestamp-micros": lambda v: _EPOCH + dt.timedelta(microseconds=v),
    "date": lambda v: dt.date(1970, 1, 1) + dt.timedelta(days=v),
}


def _for_apache(schema: Any, record: Any) -> Any:
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return record
    out = dict(record)
    for field in schema["fields"]:
        kind = field["type"]
        logical = kind.get("logicalType") if isinstance(kind, dict) else None
        if logical in _AS_PYTHON and isinstance(out.get(field["name"]), int):
            out[field["name"]] = _AS_PYTHON[logical](out[field["name"]])
    return out


def apache_file(schema: Any, records: list[Any], codec: str = "null", block: int = 0) -> bytes:
    """A container file written by the reference library (``block`` records per block)."""
    records = [_for_apache(schema, record) for record in records]
    sink = io.BytesIO()
    parsed = avro.schema.parse(json.dumps(schema))
    writer = avro.datafile.DataFileWriter(sink, avro.io.DatumWriter(), parsed, codec=codec)
    for index, record in enumerate(records):
        writer.append(record)
        if block and (index + 1) % block == 0:
            writer.sync()
    writer.flush()
    data = sink.getvalue()
    writer.close()
    return data


def fastavro_file(schema: Any, records: list[Any], codec: str = "null", sync: int = 2000) -> bytes:
    sink = io.BytesIO()
    fastavro.writer(sink, fastavro.parse_schema(copy.deepcopy(schema)), records, codec=codec,
                    sync_interval=sync)  # fmt: skip
    return sink.getvalue()


@dataclass(frozen=True)
class Block:
    """Where a block sits in a file: offset, its header's length, data size, record count."""

    offset: int
    header: int
    size: int
    count: int

    @property
    def end(self) -> int:
        return self.offset + self.header + self.size + SYNC_SIZE


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), position


def blocks(data: bytes) -> list[Block]:
    """Every block of a well-formed container file (found by its sync markers)."""
    sync = fastavro.reader(io.BytesIO(data))._header["sync"]
    position = data.index(sync) + SYNC_SIZE
    found = []
    while position < len(data):
        count, after_count = _varint(data, position)
        size, after_size = _varint(data, after_count)
        found.append(Block(position, after_size - position, size, count))
        position = after_size + size + SYNC_SIZE
        assert data[position - SYNC_SIZE : position] == sync
    return found


def with_count(data: bytes, block: Block, count: int) -> bytes:
    """``data`` with ``block``'s record count replaced (the rest of the block unchanged)."""
    head = encode_long(count) + encode_long(block.size)
    return data[: block.offset] + head + data[block.offset + block.header :]


def report_schema(**changes: Any) -> dict[str, Any]:
    """The Report schema with some field types replaced (None removes a field), or fields
    added (names not in the schema)."""
    schema = copy.deepcopy(schema_json("report"))
    fields = []
    for field in schema["fields"]:
        if field["name"] in changes:
            if changes[field["name"]] is None:
                continue
            field = {**field, "type": changes[field["name"]]}
        fields.append(field)
    names = {field["name"] for field in schema["fields"]}
    fields += [{"name": name, "type": kind} for name, kind in changes.items() if name not in names]
    schema["fields"] = fields
    return schema


def raw_file(schema_text: bytes, codec: str, frames: list[tuple[int, bytes]]) -> bytes:
    """A container with any schema text and codec name: blocks given as (count, data)."""
    sync = bytes(range(16))
    body = encode_long(2) + encode_long(11) + b"avro.schema" + encode_long(len(schema_text))
    body += schema_text + encode_long(10) + b"avro.codec" + encode_long(len(codec)) + codec.encode()
    head = b"Obj\x01" + body + encode_long(0) + sync
    return head + b"".join(frame_block(count, data, sync) for count, data in frames)


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------


def schema_cases(seed: int) -> Iterator[Case]:
    """Writer schemas from plausible to hostile, read with and without an expected schema."""
    expect = schema_json("report")
    base = reports(60, seed)
    rng = np.random.default_rng(seed)

    def variant(name: str, changes: dict[str, Any], values: Callable[[dict, int], dict],
                readable_with_expect: bool, readable_alone: bool = True) -> Iterator[Case]:  # fmt: skip
        schema = report_schema(**changes)
        records = [values(dict(record), index) for index, record in enumerate(base)]
        for record in records:
            for field, kind in changes.items():
                if kind is None:
                    record.pop(field, None)
        data = apache_file(schema, records, block=25)
        yield Case(f"{name}/alone", data, len(records), readable=readable_alone)
        yield Case(f"{name}/expect", data, len(records), readable=readable_with_expect,
                   expect=expect)  # fmt: skip

    yield from variant("union-mixed", {"channel": ["string", "long"]},
                       lambda r, i: {**r, "channel": i if i % 2 else "test"}, False, False)  # fmt: skip
    yield from variant("union-strings", {"channel": ["string", "long"]}, lambda r, i: r, False)
    yield from variant("union-null-first", {"channel": ["null", "string"]}, lambda r, i: r, False)
    yield from variant("int-to-long", {"schema_version": "long"}, lambda r, i: r, False)
    yield from variant("promoted", {"payload_crc32c": "int"},
                       lambda r, i: {**r, "payload_crc32c": r["payload_crc32c"] % 2**31}, True)  # fmt: skip
    nested = {"type": "record", "name": "Extra", "fields": [
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attributes", "type": {"type": "map", "values": "long"}},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["R", "G"]}},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    ]}  # fmt: skip
    extra = {"tags": ["a"], "attributes": {"k": 1}, "colour": "G", "digest": b"\x00\x01\x02\x03"}
    yield from variant("nested-extra", {"extra": nested}, lambda r, i: {**r, "extra": extra}, True)
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "long"}, {"name": "next", "type": ["null", "Node"]}]}  # fmt: skip
    chain = {"value": 1, "next": {"value": 2, "next": None}}
    yield from variant("recursive-extra", {"tree": node}, lambda r, i: {**r, "tree": chain}, True)
    yield from variant("recursive-in-place", {"channel": node},
                       lambda r, i: {**r, "channel": chain}, False)  # fmt: skip
    yield from variant("missing-origin", {"origin": None}, lambda r, i: r, False)
    yield from variant("missing-crowd", {"crowd_id": None}, lambda r, i: r, True)
    yield from variant("enum-channel", {"channel": {"type": "enum", "name": "C", "symbols":
                       ["test", "other"]}}, lambda r, i: r, False)  # fmt: skip
    micros = {"type": "long", "logicalType": "timestamp-micros"}
    yield from variant("timestamp-micros", {"event_time": micros},
                       lambda r, i: {**r, "event_time": r["event_time"] * 1000}, False)  # fmt: skip
    local = {"type": "long", "logicalType": "local-timestamp-millis"}
    yield from variant("local-timestamp", {"event_time": local}, lambda r, i: r, False)
    date = {"type": "int", "logicalType": "date"}
    yield from variant("date-version", {"schema_version": date}, lambda r, i: r, True)
    uuid = {"type": "string", "logicalType": "uuid"}
    yield from variant("uuid-origin", {"origin": uuid},
                       lambda r, i: {**r, "origin": "12345678-1234-5678-1234-567812345678"}, True)  # fmt: skip
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
    yield from variant("decimal-extra", {"amount": decimal},
                       lambda r, i: {**r, "amount": __import__("decimal").Decimal("1.25")}, True)  # fmt: skip
    # Top-level types other than a record.
    for name, schema, values in (
        ("top-string", "string", [f"s{i}" for i in range(30)]),
        ("top-array", {"type": "array", "items": "long"}, [[i, i + 1] for i in range(30)]),
        ("top-null", "null", [None] * 30),
    ):
        data = apache_file(schema, values, block=10)
        yield Case(f"{name}/alone", data, len(values), readable=True)
        yield Case(f"{name}/expect", data, len(values), expect=expect)
    # Headers no library would write: a schema that is not JSON, not Avro, or a strange codec.
    good = fastavro_file(schema_json("report"), base[:20], sync=500)
    frames = [(block.count, good[block.offset + block.header : block.end - SYNC_SIZE])
              for block in blocks(good)]  # fmt: skip
    for name, text, codec in (
        ("schema-not-json", b"{not json", "null"),
        ("schema-not-avro", b'{"type": "record", "name": "X", "fields": [{"name": 1}]}', "null"),
        ("schema-deep", b"[" * 5000 + b"]" * 5000, "null"),
        ("codec-unknown", json.dumps(schema_json("report")).encode(), "zstandard-9000"),
        ("codec-lz4", json.dumps(schema_json("report")).encode(), "lz4"),
    ):
        yield Case(name, raw_file(text, codec, frames), 20)
    del rng


def block_cases(seed: int) -> Iterator[Case]:
    """A good Report file cut, flipped, duplicated and lied about."""
    rng = np.random.default_rng(seed)
    records = reports(400, seed)
    for codec in ("null", "deflate"):
        data = apache_file(schema_json("report"), records, codec=codec, block=50)
        found = blocks(data)
        total = sum(block.count for block in found)
        yield Case(f"{codec}/intact", data, total, readable=True)
        # Truncations: inside the header, at a block boundary, in a block's count, data, sync.
        third = found[3]
        cuts = {
            "in-header": (found[0].offset // 2, 0, False),
            "at-boundary": (third.offset, sum(b.count for b in found[:3]), True),
            "in-count": (third.offset + 1, sum(b.count for b in found[:3]), False),
            "in-data": (
                third.offset + third.header + third.size // 2,
                sum(b.count for b in found[:4]),
                True,
            ),  # fmt: skip
            "in-sync": (third.end - 5, sum(b.count for b in found[:4]), True),
        }
        for name, (cut, held, exact) in cuts.items():
            yield Case(f"{codec}/truncated-{name}", data[:cut], held, exact=exact)
        for position in rng.integers(found[0].offset, len(data), 4):
            cut = int(position)
            held = sum(b.count for b in found if b.offset + b.header <= cut)
            exact = all(not (b.offset < cut < b.offset + b.header) for b in found)
            yield Case(f"{codec}/truncated-at-{cut}", data[:cut], held, exact=exact)
        # Record counts that lie: one fewer, one more, absurdly many.
        for name, count in (("understated", third.count - 1), ("overstated", third.count + 1),
                            ("zero", 0), ("huge", 2**27), ("absurd", 2**60)):  # fmt: skip
            lied = with_count(data, third, count)
            yield Case(f"{codec}/count-{name}", lied, total, exact=name != "absurd")
        # A huge declared size in a small file (allocation must stay bounded by the file).
        huge = data[: third.offset] + encode_long(third.count) + encode_long(2**29)
        huge += data[third.offset + third.header :]
        yield Case(f"{codec}/size-huge", huge, total, exact=False)
        yield Case(
            f"{codec}/size-huge-last", huge[: found[4].offset], sum(b.count for b in found[:4])
        )
        # Sync markers: one flipped byte, then eight.
        damaged = bytearray(data)
        damaged[third.end - 3] ^= 0x40
        yield Case(f"{codec}/sync-one-byte", bytes(damaged), total)
        damaged = bytearray(data)
        for offset in range(third.end - 16, third.end - 8):
            damaged[offset] ^= 0xFF
        yield Case(f"{codec}/sync-eight-bytes", bytes(damaged), total, exact=False)
        # Flipped bytes anywhere in the blocks (seeded).
        for trial in range(6):
            damaged = bytearray(data)
            for position in rng.integers(found[0].offset, len(data), 1 + trial % 3):
                damaged[int(position)] ^= int(rng.integers(1, 256))
            yield Case(f"{codec}/flipped-{trial}", bytes(damaged), total, exact=False)
        # A block repeated: Avro has no block numbers, so both copies are read and counted.
        second = found[1]
        duplicated = data[: second.end] + data[second.offset : second.end] + data[second.end :]
        yield Case(f"{codec}/duplicated-block", duplicated, total + second.count, readable=True)
    # Files that are no Avro container at all.
    for name, data in (
        ("empty", b""),
        ("magic-only", b"Obj\x01"),
        ("text", b"channel,recipe\ntest,test@1\n" * 20),
        ("parquet-like", b"PAR1" + rng.bytes(300) + b"PAR1"),
        ("random", rng.bytes(5000)),
        ("avro-json", json.dumps(records[:3], default=str).encode()),
        ("metadata-huge-length", b"Obj\x01" + encode_long(1) + encode_long(2**29) + b"k" * 100),
        ("metadata-absurd-length", b"Obj\x01" + encode_long(1) + encode_long(2**62) + b"k"),
        ("metadata-huge-count", b"Obj\x01" + encode_long(2**60) + b"\x02k\x02v" * 50),
    ):
        yield Case(f"not-avro/{name}", data, 0, exact=False)


def all_cases(seed: int = 20261124) -> list[Case]:
    return [*schema_cases(seed), *block_cases(seed)]

"""Avro binary of flat records -> Arrow columns, checked against fastavro (schemas/avro/decode.py)."""

from __future__ import annotations

import io

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from schemas import schema_json
from schemas.avro import decode
from schemas.avro.columns import records_to_batch
from schemas.avro.decode import decode_flat_blocks, flat_layout
from schemas.avro.reader import read_container_bytes
from schemas.avro.schema import strip_logical_types
from schemas.avro.varint import encode_bytes, encode_long
from tests.schemas.avro.test_reader import _split

FLAT_SCHEMA = {
    "type": "record",
    "name": "Flat",
    "namespace": "test",
    "fields": [
        {"name": "tag", "type": "int"},
        {"name": "small", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "text", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "maybe_text", "type": ["null", "string"]},
        {"name": "maybe_long", "type": ["long", "null"]},
        {"name": "ratio", "type": "float"},
        {"name": "precise", "type": "double"},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["R", "G", "B"]}},
        {
            "name": "maybe_colour",
            "type": ["null", {"type": "enum", "name": "Shade", "symbols": ["LIGHT", "DARK"]}],
        },
    ],
}
_EDGE_INTS = [0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -(2**31)]
_EDGE_LONGS = [0, -1, 2**62, -(2**63), 2**63 - 1, 1_700_006_400_000]
_TEXT_LENGTHS = [0, 1, 63, 64, 200, 8191, 8192, 20_000]


@pytest.fixture(autouse=True, params=["numpy", "native"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test once with the numpy steps and once with the compiled walk (esa_avro_blocks,
    which ``make venv`` installs): both must give fastavro's rows and refuse the same bytes."""
    if request.param == "numpy":
        monkeypatch.setattr(decode, "_native", None)
    else:
        assert decode._native is not None, "esa_avro_blocks is not installed (make venv)"
    return request.param


def _flat_records(count: int, seed: int) -> list[dict]:
    """Records with every edge the encoding has: multi-byte and negative varints, lengths whose
    varint takes 1, 2 and 3 bytes, non-ASCII text, nulls in both union orders."""
    rng = np.random.default_rng(seed)
    records = []
    for index in range(count):
        text_length = int(rng.choice(_TEXT_LENGTHS, p=[0.2, 0.3, 0.2, 0.1, 0.1, 0.04, 0.03, 0.03]))
        records.append(
            {
                "tag": 1,
                "small": _EDGE_INTS[index % len(_EDGE_INTS)],
                "big": _EDGE_LONGS[index % len(_EDGE_LONGS)],
                "when": 1_700_006_400_000 + int(rng.integers(0, 86_400_000)),
                "text": ("é€x" * text_length)[:text_length],
                "blob": rng.bytes(int(rng.integers(0, 100))),
                "maybe_text": None if index % 3 == 0 else f"crowd-{index % 7}",
                "maybe_long": None if index % 4 == 1 else int(rng.integers(-(2**40), 2**40)),
                "ratio": float(np.float32(rng.normal())),
                "precise": float(rng.normal()),
                "colour": "RGB"[index % 3],
                "maybe_colour": None if index % 5 == 0 else ("LIGHT", "DARK")[index % 2],
            }
        )
    return records


def _container(records: list[dict], codec: str, sync_interval: int) -> bytes:
    buffer = io.BytesIO()
    schema = fastavro.parse_schema(FLAT_SCHEMA)
    fastavro.writer(buffer, schema, records, codec=codec, sync_interval=sync_interval)
    return buffer.getvalue()


def _blocks(data: bytes) -> list[tuple[bytes, int]]:
    """Decompressed contents and record counts of every block of a container file."""
    return [
        (block.bytes_.getvalue(), block.num_records)
        for block in fastavro.block_reader(io.BytesIO(data))
    ]


def _fastavro_batch(contents: list[bytes]) -> pa.RecordBatch:
    """The reference: fastavro's records of the blocks (logical types stripped) as a batch."""
    stripped = strip_logical_types(FLAT_SCHEMA)
    parsed = fastavro.parse_schema(stripped)
    stream = io.BytesIO(b"".join(contents))
    records = []
    while stream.tell() < len(stream.getbuffer()):
        records.append(fastavro.schemaless_reader(stream, parsed, None))
    return records_to_batch(records, stripped)


def _fast_batch(contents: list[bytes], counts: list[int]) -> pa.RecordBatch | None:
    layout = flat_layout(strip_logical_types(FLAT_SCHEMA))
    return decode_flat_blocks(layout, contents, counts)


def test_flat_layout_covers_flat_schemas_only() -> None:
    layout = flat_layout(strip_logical_types(FLAT_SCHEMA))
    assert [field.kind for field in layout] == [
        "int", "int", "long", "long", "string", "bytes", "string", "long", "float", "double",
        "enum", "enum",
    ]  # fmt: skip
    assert flat_layout(schema_json("report")) is not None
    nested = {"type": "record", "name": "N", "fields": [{"name": "a", "type": {"type": "array", "items": "int"}}]}  # fmt: skip
    assert flat_layout(nested) is None
    three_way = {"type": "record", "name": "U", "fields": [{"name": "u", "type": ["null", "int", "string"]}]}  # fmt: skip
    assert flat_layout(three_way) is None


@pytest.mark.parametrize(("codec", "sync_interval"), [("null", 2000), ("deflate", 400_000)])
def test_vectorized_decoding_equals_fastavro(codec: str, sync_interval: int) -> None:
    # Small blocks (many per group) and a few large ones (long chains through one block).
    records = _flat_records(3000, seed=1)
    data = _container(records, codec, sync_interval)
    blocks = _blocks(data)
    contents, counts = [c for c, _ in blocks], [n for _, n in blocks]
    fast = _fast_batch(contents, counts)
    assert fast is not None  # the vectorized path decoded it (no fallback)
    expected = _fastavro_batch(contents)
    assert fast.schema == expected.schema
    assert fast.equals(expected)
    assert fast.column("text").to_pylist() == [r["text"] for r in records]
    assert fast.column("when").to_pylist() == [r["when"] for r in records]
    # The file reader gives the same rows in batches.
    batches, chunks = _split(list(read_container_bytes(data, "f", 1000)))
    assert not chunks
    assert pa.Table.from_batches([b.columns for b in batches]).equals(
        pa.Table.from_batches([expected])
    )


def test_vectorized_decoding_rejects_what_it_cannot_vouch_for() -> None:
    records = _flat_records(600, seed=2)
    blocks = _blocks(_container(records, "null", 4000))
    contents, counts = [c for c, _ in blocks], [n for _, n in blocks]
    assert _fast_batch(contents, counts) is not None
    # A count that does not match the records in the block.
    assert _fast_batch(contents, [counts[0] + 1, *counts[1:]]) is None
    assert _fast_batch(contents, [counts[0] - 1, *counts[1:]]) is None
    assert _fast_batch(contents, [10**12, *counts[1:]]) is None  # no array of that size
    # Trailing bytes after the last record of a block.
    assert _fast_batch([contents[0] + b"\x00", *contents[1:]], counts) is None
    # Invalid UTF-8 in a string (fastavro rejects it too).
    text_record = [r for r in records if r["text"]][0]
    broken = _container([dict(text_record, text="x" * 10)], "null", 4000)
    ((content, count),) = _blocks(broken)
    position = content.index(b"x" * 10)
    assert _fast_batch([content[:position] + b"\xff" + content[position + 1 :]], [count]) is None


def test_vectorized_decoding_never_disagrees_with_fastavro_on_damaged_bytes() -> None:
    records = _flat_records(200, seed=3)
    blocks = _blocks(_container(records, "null", 3000))
    contents, counts = [c for c, _ in blocks], [n for _, n in blocks]
    rng = np.random.default_rng(4)
    decoded = rejected = 0
    for _ in range(100):
        block = int(rng.integers(len(contents)))
        damaged = bytearray(contents[block])
        damaged[int(rng.integers(len(damaged)))] = int(rng.integers(256))
        trial = [*contents[:block], bytes(damaged), *contents[block + 1 :]]
        fast = _fast_batch(trial, counts)
        if fast is None:
            rejected += 1
            continue
        # Whatever it accepts, fastavro reads the same way, record for record.
        decoded += 1
        assert fast.equals(_fastavro_batch(trial))
    assert decoded > 0 and rejected > 0


def test_unselective_record_beginnings_still_decode_correctly() -> None:
    # The first field takes many values, so record beginnings do not single out records; the
    # reader still returns fastavro's rows (vectorized or not).
    records = _flat_records(2000, seed=5)
    for index, record in enumerate(records):
        record["tag"] = (index * 7919) % 5000 - 2500
    data = _container(records, "deflate", 50_000)
    blocks = _blocks(data)
    contents = [c for c, _ in blocks]
    expected = _fastavro_batch(contents)
    fast = _fast_batch(contents, [n for _, n in blocks])
    assert fast is None or fast.equals(expected)
    batches, chunks = _split(list(read_container_bytes(data)))
    assert not chunks
    assert pa.Table.from_batches([b.columns for b in batches]).equals(
        pa.Table.from_batches([expected])
    )


@pytest.mark.parametrize("constant", range(len(FLAT_SCHEMA["fields"]) + 1))
def test_leading_fields_equal_in_every_record_decode_as_fastavro_does(constant: int) -> None:
    """The first ``constant`` fields hold the same value in every record (decoded once, the
    bytes compared), the rest vary; then two records that were not sampled (``_record_starts``
    guesses the shared fields from the first records of the first blocks) differ in the last
    of them."""
    records = _flat_records(600, seed=constant)
    names = [field["name"] for field in FLAT_SCHEMA["fields"]][:constant]
    for record in records:
        record.update({name: records[0][name] for name in names})
        record["text"] = record["text"][:3]  # small records: blocks of many, few of them sampled
    for changed in ([], [records[-1], records[450]] if constant else []):
        for record in changed:  # a record that breaks the run of equal bytes
            record[names[-1]] = records[1][names[-1]]
        blocks = _blocks(_container(records, "null", 2000))
        contents = [content for content, _ in blocks]
        fast = _fast_batch(contents, [count for _, count in blocks])
        assert fast is not None and fast.equals(_fastavro_batch(contents))


def test_record_by_record_walk_ends_where_the_vectorized_one_does() -> None:
    """``_sample_beginnings`` walks one big block record by record in Python: on any bytes
    (random, mostly short varints, tiny values) each step ends where ``_skip_record`` ends."""
    layout = flat_layout(strip_logical_types(FLAT_SCHEMA))
    rng = np.random.default_rng(6)
    for trial in range(3000):
        size = int(rng.integers(1, 200))
        data = rng.integers(0, 256, size=size, dtype=np.uint8)
        if trial % 3 == 0:
            data[rng.random(size) < 0.6] &= 0x7F
        if trial % 4 == 0:
            data[:] = rng.integers(0, 5, size=size)
        buf = np.concatenate([data, np.zeros(16, dtype=np.uint8)])
        start = int(rng.integers(0, size + 3))
        vectorized = int(decode._skip_record(layout, buf, np.array([start]), size)[0])
        assert decode._skip_record_at(layout, memoryview(buf), start, size) == vectorized


def _records_sharing_leading_fields(seed: int) -> tuple[list[dict], bytes]:
    """800 records whose first four fields are the same in all (short texts), and those
    fields' 12 encoded bytes: the pattern the decoder looks for."""
    records = _flat_records(800, seed=seed)
    names = [field["name"] for field in FLAT_SCHEMA["fields"]][:4]
    for record in records:
        record.update({name: records[0][name] for name in names})
        record["text"] = record["text"][:3]
    return records, _blocks(_container(records[:1], "null", 10**6))[0][0][:12]


def test_a_payload_holding_the_shared_fields_bytes_still_decodes_as_fastavro_does() -> None:
    """One big block (the walk goes record by record) whose records share their first four
    fields, and some blobs that hold those four fields' bytes followed by more record-like
    bytes: candidates inside a record hold the shared pattern, so the quick check that the
    pattern's holders are exactly the records fails and the chain is followed as always."""
    records, shared = _records_sharing_leading_fields(seed=7)
    for record in records[5::40]:
        record["blob"] = shared + record["blob"][:20] + shared
    blocks = _blocks(_container(records, "null", 10**7))
    assert len(blocks) == 1
    contents = [content for content, _ in blocks]
    fast = _fast_batch(contents, [count for _, count in blocks])
    assert fast is not None and fast.equals(_fastavro_batch(contents))


def test_candidates_no_block_starts_at_and_no_candidate_ends_at_are_dropped() -> None:
    """``_reached``: a stray candidate (7) is dropped even where its own record would end on a
    real one (10); the block's start (0) and every position a candidate ends at are kept."""
    positions = np.array([0, 5, 7, 10, 12])
    following = np.array([5, 99, 10, 12, 20])
    reached = decode._reached(positions, following, np.array([0]))
    assert reached.tolist() == [True, True, False, True, True]


def test_stray_candidates_are_dropped_without_following_the_chain() -> None:
    """Blobs that begin with the shared fields' bytes (as a report's random payload bytes now
    and then do) are candidates that hold the pattern; the records are what is left once those
    that nothing ends at are dropped, found without pointer doubling, and decode as fastavro."""
    records, shared = _records_sharing_leading_fields(seed=8)
    for record in records[5::40]:
        record["blob"] = record["blob"][:3] + shared + record["blob"][:20]
    blocks = _blocks(_container(records, "null", 5000))
    contents = [content for content, _ in blocks]
    counts = [count for _, count in blocks]
    sizes = np.array([len(content) for content in contents])
    buf = np.frombuffer(b"".join(contents) + bytes(16), dtype=np.uint8)
    block_starts = np.cumsum(sizes) - sizes
    layout = flat_layout(strip_logical_types(FLAT_SCHEMA))
    chains = []
    real_is_chain = decode._is_chain

    def is_chain(positions, *rest):
        chains.append(positions.size)
        return real_is_chain(positions, *rest)

    decode._is_chain = is_chain
    try:
        found = decode._record_starts(layout, buf, int(sizes.sum()), block_starts, np.array(counts))
    finally:
        decode._is_chain = real_is_chain
    assert found is not None and found[0].size == len(records)
    assert chains == [len(records) + len(records[5::40]), len(records)]  # strays, then dropped
    fast = _fast_batch(contents, counts)
    assert fast is not None and fast.equals(_fastavro_batch(contents))


def test_a_stray_chain_inside_a_payload_falls_back_to_following_the_chain() -> None:
    """A blob holding two whole records back to back: the second one's start is where the
    first ends, so it survives the drop and the count is one over; the chain is then followed
    by pointer doubling as before, and the rows are still fastavro's."""
    records = _flat_records(600, seed=9)
    names = [field["name"] for field in FLAT_SCHEMA["fields"]][:4]
    for record in records:
        record.update({name: records[0][name] for name in names})
        record["text"] = record["text"][:3]
    one = _blocks(_container([dict(records[1], blob=b"")], "null", 10**6))[0][0]
    for record in records[7::50]:
        record["blob"] = b"\x01" + one + one
    blocks = _blocks(_container(records, "null", 4000))
    contents = [content for content, _ in blocks]
    fast = _fast_batch(contents, [count for _, count in blocks])
    assert fast is not None and fast.equals(_fastavro_batch(contents))


def test_pattern_positions_are_every_place_the_pattern_begins() -> None:
    """``_pattern_positions`` against a byte-by-byte search: overlapping occurrences, one at
    the very start, ones whose first 8 bytes match but not the rest, and one running into the
    padding (not an occurrence in the data, though its first bytes are there)."""
    rng = np.random.default_rng(10)
    pattern = np.frombuffer(b"\x02\x02\x02\x02\x02\x02\x02\x02\x02\x07\x01", dtype=np.uint8)
    data = rng.integers(0, 4, size=3000).astype(np.uint8)
    for at in (0, 17, 18, 500, 2000):
        data[at : at + pattern.size] = pattern
    data[900 : 900 + 10] = pattern[:10]  # the first 10 bytes only
    data[-9:] = pattern[:9]  # runs past the data's end
    buf = np.concatenate([data, np.zeros(16, dtype=np.uint8)])
    expected = [
        at
        for at in range(data.size - pattern.size + 1)
        if np.array_equal(data[at : at + pattern.size], pattern)
    ]
    assert decode._pattern_positions(buf, data.size, pattern).tolist() == expected
    assert 17 not in expected and 18 in expected  # the second write overlaps the first


def test_strings_skip_the_utf8_check_only_when_every_byte_is_ascii() -> None:
    """A string column of ASCII bytes only is valid UTF-8 as it is; one byte of 0x80 or more
    (here a lone continuation byte) sends the column through Arrow's full check, which
    refuses it as fastavro would."""
    assert decode._is_ascii(pa.py_buffer(b"")) and decode._is_ascii(pa.py_buffer(b"ab\x7f"))
    assert not decode._is_ascii(pa.py_buffer(b"ab\x80"))
    records = [dict(record, text="plain") for record in _flat_records(50, seed=11)]
    ((content, count),) = _blocks(_container(records, "null", 10**6))
    fast = _fast_batch([content], [count])
    assert fast is not None and fast.equals(_fastavro_batch([content]))
    position = content.index(b"plain")
    broken = content[:position] + b"\x80" + content[position + 1 :]
    assert _fast_batch([broken], [count]) is None


@pytest.mark.parametrize(
    "value",
    [
        pa.array(["location_heatmap"]),
        pa.array([""]),
        pa.array(["é€"]),
        pa.array([b"\x00\xff"], pa.binary()),
        pa.array([None], pa.string()),
        pa.array([-(2**31)], pa.int32()),
        pa.array([2**63 - 1], pa.int64()),
        pa.array([None], pa.int64()),
        pa.array([1.5], pa.float32()),
        pa.array([-0.1], pa.float64()),
    ],
)
def test_a_repeated_leading_value_is_what_pa_repeat_gives(value: pa.Array) -> None:
    repeated = decode._repeated(value, 1000)
    repeated.validate(full=True)
    assert repeated.type == value.type and repeated.equals(pa.repeat(value[0], 1000))
    assert decode._repeated(value, 0).equals(pa.repeat(value[0], 0))


def test_a_pattern_of_fewer_fields_is_the_chain_when_the_sampled_records_share_more() -> None:
    """Records grouped as a release file of two recipes is: the first ones (all sampled) also
    share a fifth field that later records do not, so the five-field pattern lies at fewer
    positions than there are records; the four-field one is the chain, taken (and its
    fields decoded once, the fifth not compared again) without following candidates, and the
    rows are fastavro's."""
    records, _ = _records_sharing_leading_fields(seed=10)
    for index, record in enumerate(records):
        record["text"] = "same" if index < 100 else f"t{index}"
    blocks = _blocks(_container(records, "null", 10**7))
    assert len(blocks) == 1
    contents = [content for content, _ in blocks]
    counts = [count for _, count in blocks]
    size = len(contents[0])
    buf = np.frombuffer(contents[0] + bytes(16), dtype=np.uint8)
    layout = flat_layout(strip_logical_types(FLAT_SCHEMA))
    real_candidates = decode._candidates

    def no_candidates(*args):
        raise AssertionError("the pattern chain was not found")

    decode._candidates = no_candidates
    try:
        found = decode._record_starts(layout, buf, size, np.array([0]), np.array(counts))
    finally:
        decode._candidates = real_candidates
    assert found is not None and found[0].size == len(records)
    assert found[1] == 4 and found[3] == 4  # four fields shared; the fifth is proven not to be
    fast = _fast_batch(contents, counts)
    assert fast is not None and fast.equals(_fastavro_batch(contents))


@pytest.mark.parametrize("decoder", ["numpy"], indirect=True)  # the numpy steps' guess
def test_a_wrong_guess_of_record_starts_is_refuted_by_decoding_and_the_starts_are_followed(
    decoder: str,
) -> None:
    """One record lacks the four shared leading fields (its timestamp differs) and one blob
    holds their bytes: the pattern lies at exactly as many positions as there are records, one
    at the block's start, so they are decoded as a guess; decoding refutes them (a record does
    not end where the next guessed one starts), the chain is then followed as always, and the
    rows are fastavro's."""
    records, shared = _records_sharing_leading_fields(seed=11)
    records[300]["when"] += 1
    records[500]["blob"] = shared + records[500]["blob"][:20]
    blocks = _blocks(_container(records, "null", 10**7))
    assert len(blocks) == 1
    contents = [content for content, _ in blocks]
    decoded = []
    real_decode_records = decode._decode_records

    def decode_records(fields, buf, found, *rest):
        decoded.append(found[4])  # whether the starts were a guess
        return real_decode_records(fields, buf, found, *rest)

    decode._decode_records = decode_records
    try:
        fast = _fast_batch(contents, [count for _, count in blocks])
    finally:
        decode._decode_records = real_decode_records
    assert decoded == [True, False]
    assert fast is not None and fast.equals(_fastavro_batch(contents))


_EDGE_SCHEMA = {
    "type": "record",
    "name": "Edge",
    "fields": [
        {"name": "small", "type": "int"},
        {"name": "maybe_text", "type": ["null", "string"]},
        {"name": "colour", "type": {"type": "enum", "name": "C", "symbols": ["R", "G"]}},
        {"name": "ratio", "type": "float"},
    ],
}


def _edge_record(small: bytes, branch: bytes, text: bytes, colour: bytes, ratio: bytes) -> bytes:
    return small + branch + text + colour + ratio


_VALID = (encode_long(5), encode_long(1), encode_bytes("é"), encode_long(1), bytes(4))


@pytest.mark.parametrize(
    ("part", "value"),  # which of _VALID's parts is replaced, and by what
    [
        (0, b"\xff" * 10 + b"\x01"),  # a varint of 11 bytes
        (0, encode_long(2**31)),  # an int past 32 bits
        (1, encode_long(2)),  # a union branch that is neither null nor the string
        (3, encode_long(2)),  # an enum index past the symbols
        (3, encode_long(-1)),
        (3, encode_long(1) + bytes(4) + encode_long(5)),  # a record too long for the count
        (3, b""),  # ... or too short
        (4, b"\x00\x00"),  # the float cut short at the block's end
    ],
)
def test_both_paths_refuse_invalid_records_and_accept_the_valid_ones(
    part: int, value: bytes
) -> None:
    layout = flat_layout(_EDGE_SCHEMA)
    valid = _edge_record(*_VALID)
    assert decode_flat_blocks(layout, [valid * 3], [3]) is not None
    invalid = list(_VALID)
    invalid[part] = value
    assert decode_flat_blocks(layout, [valid * 2 + _edge_record(*invalid)], [3]) is None


def test_both_paths_refuse_a_string_that_is_not_utf8_or_runs_past_its_block() -> None:
    layout = flat_layout(_EDGE_SCHEMA)
    valid = _edge_record(*_VALID)
    bad_text = _edge_record(encode_long(5), encode_long(1), b"\x02\xc3\x28", *_VALID[3:])
    assert decode_flat_blocks(layout, [valid + bad_text], [2]) is None
    long_text = _edge_record(encode_long(5), encode_long(1), encode_long(40) + b"ab", *_VALID[3:])
    # The length runs into the next block's bytes: each block is read on its own.
    assert decode_flat_blocks(layout, [valid + long_text, valid * 8], [2, 8]) is None
    null_text = _edge_record(encode_long(-7), encode_long(0), b"", *_VALID[3:])
    batch = decode_flat_blocks(layout, [null_text + valid], [2])
    assert batch is not None
    assert batch.to_pylist() == [
        {"small": -7, "maybe_text": None, "colour": "G", "ratio": 0.0},
        {"small": 5, "maybe_text": "é", "colour": "G", "ratio": 0.0},
    ]

"""The vectorized payload codec agrees with fastavro byte for byte and flags bad payloads."""

from __future__ import annotations

import io

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from privacy.messages import MessageBatch
from privacy.randomizers import build_randomizer
from privacy.rng import seeded_generator
from schemas import payloads

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def random_field_values(rng: np.random.Generator, avro_type: str, n: int) -> np.ndarray:
    """Values spread over every varint length, including the extremes of the Avro type."""
    low, high = INT32 if avro_type == "int" else INT64
    bits = rng.integers(0, 32 if avro_type == "int" else 64, size=n)
    magnitude = rng.integers(0, 2**62, size=n, dtype=np.int64) >> (62 - np.minimum(bits, 62))
    values = np.where(rng.random(n) < 0.5, -magnitude, magnitude)
    values[:4] = [low, high, 0, -1]
    return np.clip(values, low, high)


def fastavro_encode(kind: str, record: dict) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, payloads.payload_record_schema(kind), record)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", list(payloads.PAYLOAD_KINDS))
def test_encoding_matches_fastavro_and_decodes_back(kind: str) -> None:
    rng = seeded_generator(payloads.PAYLOAD_KINDS[kind])
    layout = payloads.LAYOUTS[kind]
    n = 300
    fields = {name: random_field_values(rng, t, n) for name, t in layout.fields}
    encoded = payloads.encode_payloads(kind, fields, count=n)
    as_bytes = encoded.to_list()
    for i in range(n):
        record = {"kind": layout.tag, **{name: int(fields[name][i]) for name in fields}}
        assert as_bytes[i] == fastavro_encode(kind, record)
        decoded_by_fastavro = fastavro.schemaless_reader(
            io.BytesIO(as_bytes[i]), payloads.payload_record_schema(kind), None
        )
        assert decoded_by_fastavro == record
    decoded = payloads.decode_payloads(as_bytes, check_values=False)
    assert decoded.valid.all() and (decoded.kind == layout.tag).all()
    for name in fields:
        assert np.array_equal(decoded.columns[name], fields[name])


def test_decoding_reads_payloads_written_by_fastavro() -> None:
    rng = seeded_generator(3)
    records = [
        {"kind": 4, "fragment": int(f), "bucket": int(b)}
        for f, b in zip(rng.integers(1, 5, 200), rng.integers(0, 2**40, 200), strict=True)
    ]
    written = [fastavro_encode("fragment_bucket", r) for r in records]
    decoded = payloads.decode_payloads(written, allowed_kinds=["fragment_bucket"])
    assert decoded.valid.all()
    assert decoded.columns["bucket"].tolist() == [r["bucket"] for r in records]
    assert decoded.columns["fragment"].tolist() == [r["fragment"] for r in records]


def test_malformed_payloads_are_flagged_per_message_not_raised() -> None:
    good = payloads.encode_payloads("signed_bucket", {"bucket": [5], "sign": [-1]}).to_list()[0]
    cases = {
        "ok": good,
        "empty": b"",
        "truncated_varint": good[:1] + b"\x80",
        "missing_fields": good[:2],
        "trailing_bytes": good + b"\x02",
        "unknown_kind": b"\x0e\x02\x02",  # tag 7
        "unexpected_kind": b"\x02\x02",  # a valid bucket payload in a signed_bucket crowd
        "non_canonical_varint": b"\x06\x8a\x00\x01",  # bucket 5 written in two bytes
        "overlong_varint": b"\x06" + b"\xff" * 10 + b"\x01" + b"\x01",
        "int_out_of_range": b"\x06\x0a" + bytes([0x80, 0x80, 0x80, 0x80, 0x10]),  # sign = 2**31
        "value_out_of_range": b"\x06\x0a\x04",  # sign = +2
    }
    decoded = payloads.decode_payloads(
        list(cases.values()), allowed_kinds=["signed_bucket", payloads.CENSUS]
    )
    assert decoded.reason_names().tolist() == list(cases)
    assert decoded.valid.tolist() == [True] + [False] * (len(cases) - 1)
    assert decoded.columns["sign"].tolist() == [-1] + [0] * (len(cases) - 1)
    assert decoded.kind.tolist() == [3] + [-1] * (len(cases) - 1)


def test_a_truncated_payload_does_not_swallow_its_neighbour() -> None:
    # The first payload ends inside a varint; the second must still decode on its own.
    decoded = payloads.decode_payloads([b"\x02\x80", b"\x02\x0a"])
    assert decoded.reason_names().tolist() == ["truncated_varint", "ok"]
    assert decoded.columns["bucket"].tolist() == [0, 5]


def test_empty_payloads_anywhere_do_not_shift_their_neighbours() -> None:
    items = [b"", b"", b"\x02\x0a", b"", b"\x02\x8a\x01", b""]
    decoded = payloads.decode_payloads(items)
    assert decoded.reason_names().tolist() == ["empty", "empty", "ok", "empty", "ok", "empty"]
    assert decoded.columns["bucket"].tolist() == [0, 0, 5, 0, 69, 0]


def test_limits_bound_indices() -> None:
    encoded = payloads.encode_payloads("bucket", {"bucket": [0, 9, 10]})
    decoded = payloads.decode_payloads(encoded, limits={"bucket": 10})
    assert decoded.valid.tolist() == [True, True, False]
    assert decoded.reason_counts() == {"ok": 2, "value_out_of_range": 1}


def test_retired_census_payloads_are_one_byte_and_never_confused_with_data() -> None:
    census = payloads.encode_payloads(payloads.CENSUS, {}, count=3)
    assert census.to_list() == [b"\x00"] * 3
    mixed = census.to_list() + payloads.encode_payloads("bucket", {"bucket": [0]}).to_list()
    decoded = payloads.decode_payloads(mixed, allowed_kinds=[payloads.CENSUS, "bucket"])
    assert decoded.is_kind(payloads.CENSUS).tolist() == [True, True, True, False]
    assert decoded.is_kind("bucket").tolist() == [False, False, False, True]


@pytest.mark.parametrize(
    ("name", "params", "make_values"),
    [
        (
            "one_hot_rappor",
            {"domain_size": 64, "epsilon": 2.0},
            lambda rng: rng.integers(0, 64, 500),
        ),
        (
            "count_mean_sketch",
            {"num_hashes": 16, "width": 256, "epsilon": 3.0, "hash_seed": 5, "domain_size": 900},
            lambda rng: rng.integers(0, 900, 500),
        ),
        (
            "report_fragmented",
            {"backstop_epsilon": 4.0, "fragment_epsilon": 1.5, "fragments": 4, "domain_size": 32},
            lambda rng: rng.integers(0, 32, 300),
        ),
        (
            "longitudinal",
            {"periods": 8, "max_changes": 2, "epsilon": 2.0},
            lambda rng: np.repeat(rng.integers(0, 2, (200, 1)), 8, axis=1),
        ),
    ],
)
def test_message_batches_round_trip(name: str, params: dict, make_values) -> None:
    rng = seeded_generator(17)
    randomizer = build_randomizer(name, params)
    batch = randomizer.randomize(make_values(rng), rng)
    assert len(batch) > 0
    encoded = payloads.encode_randomized(batch, randomizer)
    decoded = payloads.decode_for(randomizer, encoded)
    assert decoded.valid.all()
    width = getattr(randomizer, "width", None)
    columns = payloads.message_columns(decoded, randomizer.payload_kind, width)
    for column, values in columns.items():
        assert np.array_equal(values, getattr(batch, column)), column
        assert values.dtype == getattr(batch, column).dtype, column


def test_signed_bucket_batches_round_trip() -> None:
    batch = MessageBatch(
        respondent=[0, 0, 1],
        bucket=[3, 2**40, 0],
        sign=[1, -1, -1],
        fragment=[0, 0, 0],
        period=[0] * 3,
    )
    decoded = payloads.decode_payloads(payloads.encode_message_batch(batch, "signed_bucket"))
    columns = payloads.message_columns(decoded, "signed_bucket")
    assert columns["bucket"].tolist() == [3, 2**40, 0]
    assert columns["sign"].tolist() == [1, -1, -1]


def test_containers_convert_between_lists_and_arrow() -> None:
    items = [b"\x02\x04", b"", b"\x00", b"\x02\x80\x01"]
    encoded = payloads.EncodedPayloads.from_list(items)
    assert encoded.to_list() == items
    arrow = encoded.to_arrow()
    assert arrow.to_pylist() == items
    sliced = pa.array(items + [None], type=pa.binary()).slice(1)
    assert payloads.EncodedPayloads.from_arrow(sliced).to_list() == items[1:] + [b""]
    with pytest.raises(ValueError, match="offsets"):
        payloads.EncodedPayloads(np.zeros(2, np.uint8), np.array([0, 3]))


def test_encoder_refuses_bad_fields() -> None:
    with pytest.raises(ValueError, match="missing"):
        payloads.encode_payloads("sketch", {"row": [1]})
    with pytest.raises(ValueError, match="32 bits"):
        payloads.encode_payloads("sketch", {"row": [2**31], "column": [0]})
    with pytest.raises(ValueError, match="unknown payload kind"):
        payloads.encode_payloads("histogram", {"bucket": [0]})


def fastavro_verdict(item: bytes) -> dict | None:
    """The record fastavro reads from ``item`` when the codec should accept it: a known kind tag,
    every byte used, and re-encoding gives the same bytes (canonical); None otherwise."""
    if not item:
        return None
    try:
        tag = fastavro.schemaless_reader(io.BytesIO(item), {"type": "int"}, None)
        kind = payloads.KIND_NAMES[tag] if 0 <= tag < len(payloads.KIND_NAMES) else None
        if kind is None:
            return None
        buffer = io.BytesIO(item)
        record = fastavro.schemaless_reader(buffer, payloads.payload_record_schema(kind), None)
    except Exception:  # noqa: BLE001 - any failure means fastavro cannot read it
        return None
    if buffer.tell() != len(item) or fastavro_encode(kind, record) != item:
        return None
    return record


def test_mutated_payloads_are_accepted_exactly_when_fastavro_reads_them_canonically() -> None:
    rng = seeded_generator(99)
    originals = []
    for kind, layout in payloads.LAYOUTS.items():
        fields = {name: random_field_values(rng, t, 60) for name, t in layout.fields}
        originals += payloads.encode_payloads(kind, fields, count=60).to_list()
    mutated = []
    for item in originals:
        choice = rng.integers(4)
        if choice == 0 and len(item) > 1:
            item = item[: rng.integers(1, len(item))]
        elif choice == 1:
            item = item + bytes(rng.integers(0, 256, rng.integers(1, 3)).astype(np.uint8))
        elif choice == 2:
            position = int(rng.integers(len(item)))
            item = item[:position] + bytes([int(rng.integers(256))]) + item[position + 1 :]
        mutated.append(item)
    decoded = payloads.decode_payloads(mutated, check_values=False)
    accepted = 0
    for i, item in enumerate(mutated):
        record = fastavro_verdict(item)
        assert decoded.valid[i] == (record is not None), (item, decoded.reason_names()[i])
        if record is not None:
            accepted += 1
            assert decoded.kind[i] == record["kind"]
            for name, value in record.items():
                if name != "kind":
                    assert decoded.columns[name][i] == value
    assert 0 < accepted < len(mutated)

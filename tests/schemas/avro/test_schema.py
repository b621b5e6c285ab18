"""Writer schemas against the schema a reader expects (schemas/avro/schema.py)."""

from __future__ import annotations

import pytest

from schemas import schema_json
from schemas.avro.schema import min_record_bytes, named_types, resolution_problem
from tests.schemas.avro.hostile.corpus import report_schema

REPORT = schema_json("report")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        ({"extra": {"type": "array", "items": "string"}}, None),
        ({"crowd_id": None}, None),  # the reader has a default
        ({"crowd_id": "string"}, None),  # a writer without nulls fills a nullable reader field
        ({"payload_crc32c": "int"}, None),  # int is promoted to long
        ({"event_time": "long"}, None),  # no logical type: the reader's applies
        ({"origin": {"type": "string", "logicalType": "uuid"}}, None),
        ({"origin": None}, "field 'origin' is missing"),
        ({"channel": ["string", "long"]}, "field 'channel' union [string, long] has a branch"),
        ({"channel": ["null", "string"]}, "field 'channel' union [null, string] has a branch"),
        ({"schema_version": "long"}, "field 'schema_version' is long, not int"),
        ({"payload": "string"}, "field 'payload' is string, not bytes"),
        ({"crowd_id": ["null", "long"]}, "field 'crowd_id' is long, not string"),
        (
            {"event_time": {"type": "long", "logicalType": "timestamp-micros"}},
            "field 'event_time' logical type timestamp-micros where timestamp-millis",
        ),
    ],
)
def test_resolution(changes: dict, problem: str | None) -> None:
    found = resolution_problem(report_schema(**changes), REPORT)
    assert found == problem if problem is None else found.startswith(problem)


def test_named_references_and_top_level_types() -> None:
    schema = report_schema(
        kind={"type": "enum", "name": "esa.Kind", "symbols": ["A"]}, channel="esa.Kind"
    )
    assert "Kind" in named_types(schema) and "esa.Kind" in named_types(schema)
    assert resolution_problem(schema, REPORT).startswith("field 'channel' is enum")
    assert (
        resolution_problem("string", REPORT) == "the file holds string values, not Report records"
    )
    assert resolution_problem(["null", "string"], REPORT).startswith("the file holds [null")


def test_min_record_bytes() -> None:
    assert min_record_bytes(REPORT) == 10  # one byte per field at least
    assert min_record_bytes("null") == 0
    assert min_record_bytes({"type": "record", "name": "E", "fields": []}) == 0
    recursive = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "double"}, {"name": "next", "type": ["null", "Node"]}]}  # fmt: skip
    assert min_record_bytes(recursive) == 9
    assert min_record_bytes({"type": "fixed", "name": "F", "size": 4}) == 4

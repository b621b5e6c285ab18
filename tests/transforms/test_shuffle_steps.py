"""The shuffler's step helpers and sinks (shuffle_steps, shuffle_sinks, shuffle_config) without a
pipeline, and the message sink's retry behaviour on a small one."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from schemas import release as rel
from schemas.avro.reader import read_container_bytes
from tests.transforms import report_factory as rf
from transforms import avro_io
from transforms import shuffle_core as core
from transforms import shuffle_sinks as sinks
from transforms import shuffle_spill as spill
from transforms import shuffle_steps as steps
from transforms.shuffle_config import metrics_summary

KEY = np.arange(1, 67, dtype=np.uint64) | np.uint64(1)


def _item(records: list[dict], first_record: int = 0) -> avro_io.ColumnBatch:
    batch = next(read_container_bytes(rf.report_bytes(records))).columns
    return avro_io.ColumnBatch("in.avro", first_record, batch)


def test_key_rows_sorts_by_crowd_and_hash_and_drops_the_origin() -> None:
    records = rf.crowd(6, 2, prefix="a") + rf.crowd(4, 1, prefix="b", crowd_id="x")
    batch = _item(records).columns
    keyed = steps.key_rows(batch, 100, core.WindowSpec(), KEY)
    assert keyed.rows.schema == spill.REPORT_SPILL_SCHEMA
    assert "origin" not in keyed.rows.schema.names  # the spill never holds a plaintext origin
    assert [key[4] for key in keyed.keys] == [None, "x"]
    assert keyed.keys[0][:4] == (rf.T0, 0, rf.CHANNEL, rf.RECIPE)
    assert np.diff(keyed.starts).tolist() == [12, 4]
    hashes = keyed.rows.column("origin_hash").to_numpy()
    for begin, end in zip(keyed.starts[:-1], keyed.starts[1:], strict=True):
        assert np.all(np.diff(hashes[begin:end].astype(np.float64)) >= 0)
    # Each spilled row still knows its input record and hashes its own origin.
    index = keyed.rows.column("record_index").to_numpy() - 100
    origins = pa.array([records[i]["origin"] for i in index])
    assert np.array_equal(hashes, core.origin_hashes(origins, KEY))
    assert keyed.rows.column("payload").to_pylist() == [records[i]["payload"] for i in index]


def test_rejected_and_spilled_dead_letters_say_where_the_record_is() -> None:
    item = _item([rf.report("a"), rf.report("b", crc=5), rf.report("c", recipe_id="no@1")], 10)
    reasons = core.validate_reports(item.columns, rf.rules())
    letters = steps.rejected_dead_letters(item, reasons, rf.rules())
    assert [(letter["reason"], letter["source"]) for letter in letters] == [
        ("crc_mismatch", "in.avro#record=11"),
        ("unknown_recipe", "in.avro#record=12"),
    ]
    keyed = steps.key_rows(item.columns, 10, core.WindowSpec(), KEY)
    rows = keyed.rows.append_column(spill.PIECE_INDEX, pa.array([0, 0, 0]))
    spilled = steps.spilled_dead_letters(keyed.keys[0], rows, ["in.avro"], "s", "late_data", "d")
    record = json.loads(spilled[0]["original_record"])
    assert "origin" not in record and int(record["origin_hash"], 16) > 0
    assert {letter["source"] for letter in spilled} == {f"in.avro#record={i}" for i in (10, 11, 12)}


def test_message_file_names_are_deterministic_and_distinct() -> None:
    key = (rf.T0, 0, "ch", "r@1", None)
    name = sinks.message_file_name(key, 3)
    assert name == sinks.message_file_name(list(key), 3)
    assert name.startswith(f"messages/{rf.T0}-") and name.endswith("-g00003.avro")
    others = {
        sinks.message_file_name(key, 4),
        sinks.message_file_name((rf.T0, 1, "ch", "r@1", None), 3),  # another instance
        sinks.message_file_name((rf.T0, 0, "ch", "r@1", "c"), 3),
    }
    assert name not in others and len(others) == 3


def test_a_retried_write_overwrites_and_the_release_commits(tmp_path: Path) -> None:
    """The same group written twice (a retried bundle) leaves one file and one index entry."""
    key = (rf.T0, 0, rf.CHANNEL, rf.RECIPE, "c")
    payloads = pa.array([b"a", b"bb", b"ccc"])
    group = sinks.ReleasedGroup(key, 0, rf.T0 + rf.DAY_MS, payloads, np.zeros(3, np.int64))
    output, private = tmp_path / "out", tmp_path / "out.private"
    with beam.Pipeline(options=PipelineOptions(runner="FnApiRunner")) as pipeline:
        _ = (
            pipeline
            | beam.Create([group, group])
            | sinks.WriteShuffledMessages(str(output), str(private))
        )
    assert len(list((output / "messages").iterdir())) == 1
    files = sinks.read_index(str(private))
    assert len(files) == 1 and files[0]["records"] == 3
    manifest = {
        "window_start": rf.T0,
        "window_end": rf.T0 + rf.DAY_MS,
        "shuffler_instance": 0,
        "channel": rf.CHANNEL,
        "recipe_id": rf.RECIPE,
        "crowd_id": "c",
        "respondents": 3,
        "respondents_deleted": 1,
        "status": "RELEASED",
        "messages_released": 3,
    }
    withheld = dict(manifest, crowd_id="w", status="WITHHELD", messages_released=0)
    record = sinks.commit_record(
        0, [rf.RECIPE], {"crowd_threshold": 2}, [withheld, manifest], files
    )
    rel.write_commit(str(output), record)
    verified = rel.verify_release(str(output))
    assert verified.records == 3
    assert [(c["crowd_id"], c["respondents_released"]) for c in verified.commit["crowds"]] == [
        ("c", 2),
        ("w", None),
    ]


def test_metrics_add_up_in_records_with_presence_and_refuse_unknown_counts() -> None:
    counts = {"read": 20, "released": 8, "deleted": 2, "withheld": 3, "presence": 5}
    counts["rejected:crc_mismatch"] = 2
    summary = metrics_summary(counts)
    assert summary["adds_up"] and summary["accounted"] == 20 and summary["presence"] == 5
    unknown = metrics_summary({**counts, "unknown_records:unreadable_file": 1})
    assert not unknown["adds_up"] and unknown["chunks_of_unknown_records"] == {"unreadable_file": 1}
    assert not metrics_summary(dict(counts, read=21))["adds_up"]

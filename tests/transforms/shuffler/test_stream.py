"""The streaming shuffler's pure parts: window names, the watermark policy, staging a file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fastavro
import pytest

from tests.transforms import report_factory as rf
from transforms.shuffler import report_rows, stream

DAY = rf.DAY_MS
SPEC = report_rows.WindowSpec(period_ms=DAY)


def test_window_names_round_trip_and_refuse_others() -> None:
    assert stream.window_name(1_704_067_200_000) == "window=20240101T000000Z"
    assert stream.window_name(1_704_067_200_250) == "window=20240101T000000.250Z"
    for start in (0, 1_704_067_200_000, 1_704_067_200_250, 253_402_214_400_000):
        assert stream.parse_window_name(stream.window_name(start)) == start
    for name in (
        "window=2024",
        "instance=0",
        "window=20240101T000000.5Z",
        "window=20241301T000000Z",
    ):
        assert stream.parse_window_name(name) is None


def _notice(source: str, *windows: tuple[int, int], max_event: int | None = None):
    staged = tuple(
        stream.StagedRows(start, f"/s/{source}-{start}", rows) for start, rows in windows
    )
    if max_event is None:
        max_event = max(start for start, _ in windows) + 1
    return stream.FileNotice(source, sum(r for _, r in windows), max_event, staged)


def test_windows_close_when_the_watermark_passes_their_end_plus_the_lateness() -> None:
    state = stream.OpenWindows(period_ms=DAY, allowed_lateness_ms=3_600_000)
    t0 = rf.T0
    assert state.add(_notice("a", (t0, 5))) == []
    assert state.advance() == [] and state.watermark_ms == t0 + 1
    # The next day's first report: the watermark is within the lateness of day 0's end.
    state.add(_notice("b", (t0 + DAY, 3), max_event=t0 + DAY + 10))
    assert state.advance() == []
    # An hour later day 0 closes, with both of its files' rows; day 1 stays open.
    state.add(_notice("c", (t0, 2), (t0 + DAY, 4), max_event=t0 + DAY + 3_600_000))
    closed = state.advance()
    assert [window.window_start for window in closed] == [t0]
    assert [source for _, source, _ in closed[0].staged] == ["a", "c"]
    assert list(state.open) == [t0 + DAY]  # nothing is kept of the closed window
    # Rows of the closed window in a later poll are late; the open window takes its rows.
    late = state.add(_notice("d", (t0, 7), (t0 + DAY, 1)))
    assert [(item.window_start, item.rows) for item in late] == [(t0, 7)]
    assert [source for _, source, _ in state.open[t0 + DAY]] == ["b", "c", "d"]
    assert [window.window_start for window in state.close_all()] == [t0 + DAY]
    assert state.open == {}


def test_a_poll_never_makes_its_own_rows_late() -> None:
    """Files of one poll in any order: the watermark moves only after the poll (``advance``)."""
    t0 = rf.T0
    for order in (["day1", "day0"], ["day0", "day1"]):
        state = stream.OpenWindows(period_ms=DAY, allowed_lateness_ms=0)
        notices = {"day0": _notice("day0", (t0, 3)), "day1": _notice("day1", (t0 + DAY, 3))}
        assert all(state.add(notices[name]) == [] for name in order)
        closed = state.advance()
        assert [window.window_start for window in closed] == [t0]


def _layout(tmp_path: Path) -> stream.StreamLayout:
    return stream.StreamLayout(str(tmp_path / "out"), str(tmp_path / "out.private"))


def test_staging_splits_valid_rows_by_window_and_dead_letters_the_rest(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    records = (
        rf.crowd(4, 2)
        + rf.crowd(3, 1, prefix="next", event_time=rf.T0 + DAY + 5)
        + [rf.report("bad", crc=1), rf.report("other", instance=9)]
    )
    source = rf.write_reports(tmp_path / "a.avro", records)
    notice = stream.stage_report_file(source, rf.rules(), SPEC, layout, 1000)
    assert notice.records == 13 and notice.max_event_ms == rf.T0 + DAY + 5
    assert [(s.window_start, s.rows) for s in notice.staged] == [(rf.T0, 8), (rf.T0 + DAY, 3)]
    staged = [list(fastavro.reader(open(s.path, "rb"))) for s in notice.staged]
    assert sorted(r["payload"] for r in staged[0]) == sorted(r["payload"] for r in records[:8])
    assert {r["origin"] for r in staged[1]} == {"next-0", "next-1", "next-2"}
    digest = stream.file_digest(source)
    ingest = json.loads(Path(layout.ingest, digest + ".json").read_text())
    assert ingest["records"] == 13
    assert ingest["counts"] == {"rejected:crc_mismatch": 1, "rejected:instance_out_of_range": 1}
    assert ingest["windows"] == {
        stream.window_name(rf.T0): 8,
        stream.window_name(rf.T0 + DAY): 3,
    }
    letters = list(fastavro.reader(open(Path(layout.ingest, digest + ".avro"), "rb")))
    assert sorted(letter["reason"] for letter in letters) == [
        "crc_mismatch",
        "instance_out_of_range",
    ]


def test_rows_of_committed_windows_are_skipped_or_dead_lettered_late(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    made_of = rf.write_reports(tmp_path / "a.avro", rf.crowd(4, 1))
    arrived_late = rf.write_reports(tmp_path / "b.avro", rf.crowd(2, 1, prefix="late"))
    release = layout.release(rf.T0)
    os.makedirs(release)
    Path(release, "_COMMIT.json").write_text("{}")
    stream.write_json(layout.inputs_record(rf.T0), {"inputs": [made_of]})
    # The file the committed window was made of (read again after a restart): skipped.
    notice = stream.stage_report_file(made_of, rf.rules(), SPEC, layout, 1000)
    assert notice.staged == () and notice.max_event_ms is not None
    assert not os.path.exists(layout.late(rf.T0))
    # Another file with rows of that window: dead-lettered late_data, counted, twice is once.
    for _ in range(2):
        notice = stream.stage_report_file(arrived_late, rf.rules(), SPEC, layout, 1000)
        assert notice.staged == ()
    late = sorted(os.listdir(layout.late(rf.T0)))
    assert late == [stream.file_digest(arrived_late) + ext for ext in (".avro", ".json")]
    letters = list(fastavro.reader(open(Path(layout.late(rf.T0), late[0]), "rb")))
    assert [letter["reason"] for letter in letters] == ["late_data", "late_data"]
    assert json.loads(Path(layout.late(rf.T0), late[1]).read_text())["rows"] == 2


def test_late_staged_rows_are_dead_lettered_and_removed(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    source = rf.write_reports(tmp_path / "a.avro", rf.crowd(3, 2))
    notice = stream.stage_report_file(source, rf.rules(), SPEC, layout, 1000)
    (staged,) = notice.staged
    assert stream.dead_letter_late(layout, staged, source) == 6
    assert not os.path.exists(staged.path)
    counts = json.loads(Path(layout.late(rf.T0), stream.file_digest(source) + ".json").read_text())
    assert counts == {"source": source, "rows": 6}


@pytest.mark.parametrize("garbage", [b"not avro at all", b""])
def test_unreadable_files_are_dead_lettered_at_ingest(tmp_path: Path, garbage: bytes) -> None:
    layout = _layout(tmp_path)
    path = tmp_path / "x.avro"
    path.write_bytes(garbage)
    notice = stream.stage_report_file(str(path), rf.rules(), SPEC, layout, 1000)
    assert notice.staged == () and notice.max_event_ms is None
    ingest = json.loads(Path(layout.ingest, stream.file_digest(str(path)) + ".json").read_text())
    assert any(name.startswith("unknown_records:") for name in ingest["counts"])


def test_the_default_lateness_is_one_window() -> None:
    from pipelines.stream_shuffle import allowed_lateness_ms

    assert allowed_lateness_ms(None, "1d") == DAY and allowed_lateness_ms(None, "6h") == DAY // 4
    assert allowed_lateness_ms("0", "1d") == 0 and allowed_lateness_ms("30s", "1d") == 30_000
    # With it, a file holding the next day's reports closes nothing yet.
    state = stream.OpenWindows(period_ms=DAY, allowed_lateness_ms=allowed_lateness_ms(None, "1d"))
    state.add(_notice("a", (rf.T0, 1), (rf.T0 + DAY, 1), max_event=rf.T0 + DAY + 5))
    assert state.advance() == [] and state.add(_notice("b", (rf.T0, 2))) == []
    state.add(_notice("c", (rf.T0 + 2 * DAY, 1)))
    assert [window.window_start for window in state.advance()] == [rf.T0]


def test_the_follower_on_a_test_stream_closes_windows_per_poll(tmp_path: Path) -> None:
    """``FollowReports`` on Beam's TestStream (DirectRunner): two polls, each a batch of file
    paths at one processing time; the watermark timers decide after each whole poll."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue

    layout = _layout(tmp_path)
    day0 = rf.write_reports(tmp_path / "day0.avro", rf.crowd(4, 1))
    day1 = rf.write_reports(
        tmp_path / "day1.avro", rf.crowd(3, 1, prefix="d1", event_time=rf.T0 + DAY + 9)
    )
    late = rf.write_reports(tmp_path / "late.avro", rf.crowd(2, 1, prefix="late"))
    hidden = rf.write_reports(tmp_path / ".partial.avro", rf.crowd(2, 1, prefix="half"))
    polls = (
        TestStream()
        .add_elements([TimestampedValue(day1, 10), TimestampedValue(day0, 10)])  # one poll
        .advance_watermark_to(11)
        .add_elements([TimestampedValue(late, 12), TimestampedValue(hidden, 12)])
        .advance_watermark_to_infinity()
    )
    pipeline = beam.Pipeline(options=PipelineOptions(streaming=True))
    _ = pipeline | polls | stream.FollowReports(rf.rules(), SPEC, 0, layout, 1000)
    pipeline.run().wait_until_finish()

    closed = {
        path.name: json.loads(path.read_text())
        for path in Path(layout.root, "closed").glob("*.json")
    }
    # Day 0 closed after the first poll with its file (read after day 1's in the same poll);
    # day 1 when the input ended; the late file's rows dead-lettered; the hidden file unread.
    day0_record = closed[stream.window_name(rf.T0) + ".json"]
    assert [source for _, source, _ in day0_record["staged"]] == [day0]
    day1_record = closed[stream.window_name(rf.T0 + DAY) + ".json"]
    assert [source for _, source, _ in day1_record["staged"]] == [day1]
    late_counts = json.loads(
        Path(layout.late(rf.T0), stream.file_digest(late) + ".json").read_text()
    )
    assert late_counts["rows"] == 2
    assert json.loads(Path(layout.watermark).read_text())["final"] is True
    ingested = {json.loads(p.read_text())["source"] for p in Path(layout.ingest).glob("*.json")}
    assert ingested == {day0, day1, late}

"""The streaming shuffler's follower: report files as they appear -> closed event-time windows.

A streaming shuffler (``esa shuffle --streaming``, pipelines/stream_shuffle.py) runs this Beam
streaming pipeline (on Prism) beside a driver that commits each closed window with the batch
shuffler's own pipeline (transforms/shuffler/shuffle.py): validation, per-origin caps, distinct
respondents, thresholds, Algorithm 3 deletion, the uniform permutation and the signed commit are
the same code in both modes, run on exactly the window's records.

    MatchContinuously(--input)            new files, each once (files appear by atomic rename)
    | StageReportFile                     read, validate, split the valid rows by event-time
                                          window into staged files; invalid rows dead-lettered
    | CloseWindows (stateful, one key)    the watermark policy (``OpenWindows``)
    | WriteCloseRecords / DeadLetterLate  one close record per closed window; late rows
                                          dead-lettered ``late_data``

**Watermark policy** (``OpenWindows``): the watermark is the largest event time seen in the
input, advanced only once Beam's own watermark (MatchContinuously's, the wall-clock time of a
poll) has passed the poll that brought the file, i.e. after every file of that poll was read,
whatever order the runner processed them in. A window [s, e) closes once watermark >= e +
allowed lateness, and every open window closes when the input ends. Event time, not the wall
clock: device event times may lie anywhere relative to the shuffler's clock (a simulation of
2024-01-01 run today), and Beam's wall-clock watermark would declare such data late at once.
Rows of a window that closed before their file's poll are dead-lettered ``late_data``; a file
never makes its own rows late. Only open windows are held in state (a list of staged file paths
each): a closed window leaves nothing behind.

Private layout under ``<private>/stream/`` (``StreamLayout``): ``staging/<window>/`` staged rows
(Report Avro, written then renamed), ``closed/<window>.json`` close records, ``ingest/`` one
record per input file (records read, rejected by reason, rows per window) with its dead letters,
``late/<window>/`` late rows' dead letters and counts, ``inputs/<window>.json`` the input files a
committed window was made of, ``watermark.json`` the last watermark.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import fastavro
import numpy as np
import pyarrow as pa
from apache_beam.coders import PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow

from schemas import parsed_schema, schema_json
from schemas.avro.container import encode_container
from schemas.dead_letters import dead_letter
from schemas.windows import parse_window_name, window_name  # noqa: F401 - re-exported
from transforms.common import atomic_files, avro_io
from transforms.common.json_files import write_json
from transforms.shuffler import report_rows
from transforms.shuffler.config import REJECTED_PREFIX, STAGE_READ, STAGE_WINDOW, UNKNOWN_PREFIX
from transforms.shuffler.steps import rejected_dead_letters

STREAM_DIR = "stream"
# A writer's in-progress file (``.name`` or ``_name``, renamed when complete) is never read.
_IN_PROGRESS = (".", "_")


def file_digest(path: str) -> str:
    """The name an input file's staged, ingest and late files share (its path's SHA-256)."""
    return hashlib.sha256(path.encode()).hexdigest()[:24]


@dataclasses.dataclass(frozen=True)
class StreamLayout:
    """Where a streaming shuffler keeps its private files (see the module docstring)."""

    output: str  # the instance's release root: one esa-release/2 per window=<start>/
    private: str

    @property
    def root(self) -> str:
        return os.path.join(self.private, STREAM_DIR)

    def release(self, start_ms: int) -> str:
        return os.path.join(self.output, window_name(start_ms))

    def window_private(self, start_ms: int) -> str:
        return os.path.join(self.private, window_name(start_ms))

    def committed(self, start_ms: int) -> bool:
        return os.path.isfile(os.path.join(self.release(start_ms), "_COMMIT.json"))

    def staging(self, start_ms: int) -> str:
        return os.path.join(self.root, "staging", window_name(start_ms))

    def batch(self, start_ms: int) -> str:
        return os.path.join(self.root, "batch", window_name(start_ms))

    def close_record(self, start_ms: int) -> str:
        return os.path.join(self.root, "closed", window_name(start_ms) + ".json")

    def inputs_record(self, start_ms: int) -> str:
        return os.path.join(self.root, "inputs", window_name(start_ms) + ".json")

    def late(self, start_ms: int) -> str:
        return os.path.join(self.root, "late", window_name(start_ms))

    @property
    def ingest(self) -> str:
        return os.path.join(self.root, "ingest")

    @property
    def watermark(self) -> str:
        return os.path.join(self.root, "watermark.json")

    def window_inputs(self, start_ms: int) -> frozenset[str]:
        """The input files a committed window was made of (empty if none recorded)."""
        try:
            with open(self.inputs_record(start_ms)) as handle:
                return frozenset(json.load(handle)["inputs"])
        except FileNotFoundError:
            return frozenset()


# ---------------------------------------------------------------------------------------------
# Staging one input file (pure but for its file writes)
# ---------------------------------------------------------------------------------------------


class StagedRows(typing.NamedTuple):
    window_start: int
    path: str  # a staged Report Avro file of this window's rows of one input file
    rows: int


class FileNotice(typing.NamedTuple):
    """What staging one input file found: the closer's input."""

    source: str
    records: int  # records read (the readable ones; unknown chunks are flagged in ingest)
    max_event_ms: int | None  # the largest event time of a valid row (None: none)
    staged: tuple[StagedRows, ...]  # rows of windows not yet committed


def _late_letters(
    rows: pa.RecordBatch, source: str, start_ms: int, indexes: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    detail = f"arrived after window {window_name(start_ms)} was closed"
    records = rows.to_pylist()
    where = range(len(records)) if indexes is None else indexes
    return [
        dead_letter(
            STAGE_WINDOW,
            report_rows.LATE_DATA,
            detail,
            f"{source}#record={i}",
            original_record=record,
        )
        for i, record in zip(where, records, strict=True)
    ]


def write_late(layout: StreamLayout, start_ms: int, source: str, letters: list[dict]) -> None:
    """Late rows of ``source`` for a closed window: dead letters and a count, each named by the
    input file (a re-read after a restart replaces them, never adds)."""
    directory = layout.late(start_ms)
    name = file_digest(source)
    atomic_files.publish(
        directory,
        name + ".avro",
        lambda sink: fastavro.writer(sink, parsed_schema("dead_letter"), letters),
    )
    write_json(os.path.join(directory, name + ".json"), {"source": source, "rows": len(letters)})
    atomic_files.remove_temporary(directory)


def stage_report_file(
    source: str,
    rules: report_rows.ValidationRules,
    window: report_rows.WindowSpec,
    layout: StreamLayout,
    batch_records: int,
) -> FileNotice:
    """Read ``source``; dead-letter what cannot be read or fails validation (as the batch
    shuffler would, same reasons); split the valid rows by event-time window: rows of a window
    already committed are skipped when this file is one it was made of (a re-read after a
    restart) and dead-lettered ``late_data`` otherwise; the rest are staged, one file per window.
    Writes ``ingest/<digest>.json`` (records read, rejected by reason, rows per window)."""
    digest = file_digest(source)
    counts: dict[str, int] = {}
    letters: list[dict[str, Any]] = []
    parts: dict[int, list[pa.RecordBatch]] = {}
    records, max_event = 0, None
    for item in avro_io.read_avro_batches(source, batch_records, schema_json("report")):
        if isinstance(item, avro_io.UnreadableChunk):
            if item.records is None:
                counts[UNKNOWN_PREFIX + item.reason] = (
                    counts.get(UNKNOWN_PREFIX + item.reason, 0) + 1
                )
            key = REJECTED_PREFIX + item.reason
            counts[key] = counts.get(key, 0) + (item.records or 0)
            records += item.records or 0
            letters.append(item.dead_letter(STAGE_READ))
            continue
        records += item.rows
        reasons = report_rows.validate_reports(item.columns, rules)
        letters.extend(rejected_dead_letters(item, reasons, rules))
        for code in np.unique(reasons[reasons != report_rows.VALID]).tolist():
            key = REJECTED_PREFIX + report_rows.REASONS[code]
            counts[key] = counts.get(key, 0) + int(np.count_nonzero(reasons == code))
        valid = np.flatnonzero(reasons == report_rows.VALID)
        if not valid.size:
            continue
        rows = item.columns.take(pa.array(valid))
        event_time = rows.column("event_time").to_numpy().astype(np.int64)
        max_event = max(int(event_time.max()), max_event if max_event is not None else -(2**63))
        starts = report_rows.window_starts(event_time, window)
        for start in np.unique(starts).tolist():
            parts.setdefault(start, []).append(rows.filter(pa.array(starts == start)))
    windows: dict[str, int] = {}
    staged = []
    for start, batches in sorted(parts.items()):
        rows = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
        windows[window_name(start)] = rows.num_rows
        if layout.committed(start):
            if source not in layout.window_inputs(start):
                write_late(layout, start, source, _late_letters(rows, source, start))
            continue
        columns = {name: rows.column(name) for name in rows.schema.names}
        content = encode_container(parsed_schema("report"), columns, rows.num_rows, "null")
        directory = layout.staging(start)
        path = atomic_files.publish_bytes(directory, digest + ".avro", content)
        atomic_files.remove_temporary(directory)
        staged.append(StagedRows(start, path, rows.num_rows))
    if letters:
        atomic_files.publish(
            layout.ingest,
            digest + ".avro",
            lambda sink: fastavro.writer(sink, parsed_schema("dead_letter"), letters),
        )
        atomic_files.remove_temporary(layout.ingest)
    write_json(
        os.path.join(layout.ingest, digest + ".json"),
        {"source": source, "records": records, "counts": counts, "windows": windows},
    )
    return FileNotice(source, records, max_event, tuple(staged))


# ---------------------------------------------------------------------------------------------
# The watermark policy (pure)
# ---------------------------------------------------------------------------------------------


class ClosedWindow(typing.NamedTuple):
    window_start: int
    staged: tuple[tuple[str, str, int], ...]  # (staged path, input file, rows)


@dataclasses.dataclass
class OpenWindows:
    """The closer's state: open windows and the event-time watermark (see the module docstring).

    ``add`` takes a file's notice (rows of windows already closed come back as late);
    ``advance`` moves the watermark to the largest event time seen so far and returns the
    windows it closes; ``close_all`` closes every open window (the input ended)."""

    period_ms: int
    allowed_lateness_ms: int
    watermark_ms: int | None = None
    seen_max_ms: int | None = None
    open: dict[int, list[tuple[str, str, int]]] = dataclasses.field(default_factory=dict)

    def is_closed(self, start_ms: int) -> bool:
        return (
            self.watermark_ms is not None
            and self.watermark_ms >= start_ms + self.period_ms + self.allowed_lateness_ms
        )

    def add(self, notice: FileNotice) -> list[StagedRows]:
        late = []
        for staged in notice.staged:
            if self.is_closed(staged.window_start):
                late.append(staged)
            else:
                self.open.setdefault(staged.window_start, []).append(
                    (staged.path, notice.source, staged.rows)
                )
        if notice.max_event_ms is not None:
            self.seen_max_ms = max(notice.max_event_ms, self.seen_max_ms or notice.max_event_ms)
        return late

    def advance(self) -> list[ClosedWindow]:
        if self.seen_max_ms is not None:
            self.watermark_ms = max(self.seen_max_ms, self.watermark_ms or self.seen_max_ms)
        closing = sorted(start for start in self.open if self.is_closed(start))
        return [ClosedWindow(start, tuple(self.open.pop(start))) for start in closing]

    def close_all(self) -> list[ClosedWindow]:
        closing = sorted(self.open)
        return [ClosedWindow(start, tuple(self.open.pop(start))) for start in closing]


class Advance(typing.NamedTuple):
    """What one step of the closer decided: the windows it closed and the watermark after it
    (``final``: the input ended and every open window was closed)."""

    closed: tuple[ClosedWindow, ...]
    watermark_ms: int | None
    final: bool


# ---------------------------------------------------------------------------------------------
# Beam: the follower's steps
# ---------------------------------------------------------------------------------------------


@beam.typehints.with_output_types(typing.Any)
class StageReportFile(beam.DoFn):
    """File metadata (or a path) -> (0, FileNotice) for the closer; in-progress names skipped."""

    def __init__(
        self,
        rules: report_rows.ValidationRules,
        window: report_rows.WindowSpec,
        layout: StreamLayout,
        batch_records: int,
    ) -> None:
        self._rules, self._window, self._layout = rules, window, layout
        self._batch_records = batch_records

    def process(self, file: Any) -> Iterator[Any]:
        path = file if isinstance(file, str) else file.path
        if os.path.basename(path).startswith(_IN_PROGRESS):
            return
        yield (
            0,
            stage_report_file(path, self._rules, self._window, self._layout, self._batch_records),
        )


_STATE = ReadModifyWriteStateSpec("open_windows", PickleCoder())
_POLL = TimerSpec("poll", TimeDomain.WATERMARK)
_END = TimerSpec("end", TimeDomain.WATERMARK)
_STATE_PARAM = beam.DoFn.StateParam(_STATE)
_POLL_PARAM = beam.DoFn.TimerParam(_POLL)
_END_PARAM = beam.DoFn.TimerParam(_END)


@beam.typehints.with_output_types(typing.Any)
class CloseWindows(beam.DoFn):
    """(0, FileNotice) -> Advance elements and late StagedRows (tagged ``late``), by
    ``OpenWindows``. A watermark timer at each notice's poll time advances the event-time
    watermark once that poll's files are all in; a timer at the end of the global window closes
    every open window when the input ends."""

    def __init__(self, period_ms: int, allowed_lateness_ms: int) -> None:
        self._period_ms = period_ms
        self._allowed_lateness_ms = allowed_lateness_ms

    def _state(self, state: Any) -> OpenWindows:
        return state.read() or OpenWindows(self._period_ms, self._allowed_lateness_ms)

    def process(
        self,
        element: tuple[int, FileNotice],
        timestamp=beam.DoFn.TimestampParam,
        state=_STATE_PARAM,
        poll=_POLL_PARAM,
        end=_END_PARAM,
    ) -> Iterator[Any]:
        windows = self._state(state)
        for late in windows.add(element[1]):
            yield beam.pvalue.TaggedOutput("late", (late, element[1].source))
        state.write(windows)
        poll.set(timestamp)
        end.set(GlobalWindow().max_timestamp())

    @on_timer(_POLL)
    def on_poll(self, state=_STATE_PARAM) -> Iterator[Any]:
        if state.read() is None:  # after the end: nothing is open, nothing to advance
            return
        windows = self._state(state)
        closed = windows.advance()
        state.write(windows)
        yield Advance(tuple(closed), windows.watermark_ms, False)

    @on_timer(_END)
    def on_end(self, state=_STATE_PARAM) -> Iterator[Any]:
        windows = self._state(state)
        windows.advance()
        closed = windows.close_all()
        state.clear()
        yield Advance(tuple(closed), windows.watermark_ms, True)


def write_advance(layout: StreamLayout, advance: Advance) -> None:
    """Close records of the windows an Advance closed, then the watermark (in that order: a
    reader of the watermark finds every close record it implies)."""
    for closed in advance.closed:
        write_json(
            layout.close_record(closed.window_start),
            {
                "window_start_ms": closed.window_start,
                "staged": [list(item) for item in closed.staged],
            },
        )
    write_json(layout.watermark, {"watermark_ms": advance.watermark_ms, "final": advance.final})


def dead_letter_late(layout: StreamLayout, staged: StagedRows, source: str) -> int:
    """Dead-letter a staged file whose window closed before its poll (``late_data``), then
    remove it; returns the rows."""
    rows = []
    for item in avro_io.read_avro_batches(staged.path, 1 << 30, schema_json("report")):
        if isinstance(item, avro_io.UnreadableChunk):
            raise OSError(f"{staged.path}: staged rows unreadable: {item.detail}")
        rows.append(item.columns)
    table = pa.Table.from_batches(rows).combine_chunks().to_batches()
    batch = table[0] if table else pa.RecordBatch.from_pylist([], schema=pa.schema([]))
    letters = _late_letters(batch, source, staged.window_start) if table else []
    write_late(layout, staged.window_start, source, letters)
    os.remove(staged.path)
    return len(letters)


class FollowReports(beam.PTransform):
    """PCollection of input file metadata -> nothing: close records, watermark, dead letters and
    staged rows are written to the ``StreamLayout`` (the driver commits closed windows)."""

    def __init__(
        self,
        rules: report_rows.ValidationRules,
        window: report_rows.WindowSpec,
        allowed_lateness_ms: int,
        layout: StreamLayout,
        batch_records: int,
    ) -> None:
        super().__init__()
        self._rules, self._window, self._layout = rules, window, layout
        self._allowed_lateness_ms = allowed_lateness_ms
        self._batch_records = batch_records

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        layout = self._layout
        closed = (
            files
            | "StageReportFile"
            >> beam.ParDo(StageReportFile(self._rules, self._window, layout, self._batch_records))
            | "CloseWindows"
            >> beam.ParDo(
                CloseWindows(self._window.period_ms, self._allowed_lateness_ms)
            ).with_outputs("late", main="advances")
        )
        late: Callable[[tuple[StagedRows, str]], int] = lambda item: dead_letter_late(  # noqa: E731
            layout, *item
        )
        _ = closed.late | "DeadLetterLate" >> beam.Map(late)
        return closed.advances | "WriteCloseRecords" >> beam.Map(
            lambda advance: write_advance(layout, advance)
        )

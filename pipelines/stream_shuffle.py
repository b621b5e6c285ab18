"""``esa shuffle --streaming``: a shuffler instance that follows its input folder and commits a
signed release per event-time window.

    esa shuffle --streaming --input 'reports/instance=0/*.avro' --output shuffled/instance=0 \\
        --instance 0 [--signing-key KEY] [--window 1d] [--allowed-lateness 0] \\
        [--watch-interval 10] [--watch-for SECONDS] [--runner=PrismRunner ...]

Two parts (transforms/shuffler/stream.py has the details and the watermark policy):

- a Beam **streaming** pipeline (Prism by default: ``make engines`` builds it; Beam's other local
  runners cannot follow files, see the README) that follows ``--input`` with
  ``fileio.MatchContinuously`` until ``--watch-for`` seconds have passed, stages each new file's
  valid rows by event-time window, and closes a window once the event-time watermark passes its
  end plus ``--allowed-lateness`` (every open window when the input ends);
- this driver, which commits every closed window as soon as its close record appears: the batch
  shuffler (pipelines/shuffle.py, on FnApiRunner) over exactly the window's staged rows, into
  ``OUTPUT/window=<start>/`` (an ``esa-release/2`` with its own signed ``_COMMIT.json``) and
  ``PDIR/window=<start>/`` (its dead letters, manifests, metrics).

``OUTPUT/_STREAM.json`` says how far the instance got (``committed_through_ms``: every window
ending by then that holds data of this instance is committed; ``finished``), so that the
streaming analyzer need not wait for windows an instance has no data for.

Restart: start the same command again. Committed windows stay as they are (never redone); what
was staged, closed or half-committed but not committed is discarded and made again from the input
files, which are all read again: rows of committed windows are skipped when the window was made
of their file, dead-lettered ``late_data`` otherwise (named by input file, so a second reading
replaces rather than adds). ``--overwrite`` starts over from nothing.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.utils.timestamp import Timestamp

from pipelines.commandline import shuffler_key_flags
from pipelines.commandline.flags import parse_lateness_ms
from pipelines.commandline.main import UsageError
from pipelines.commandline.shuffle_options import ShuffleOptions
from pipelines.engines import runners as engines
from pipelines.engines.new_pipeline import new_pipeline
from schemas.release import commit as release_format
from transforms.shuffler import report_rows, stream
from transforms.shuffler.config import REJECTED_PREFIX, UNKNOWN_PREFIX, ShuffleConfig

PROGRESS_FILE = "_STREAM.json"
METRICS_FILE = "metrics.json"


# Runners that cannot follow a folder (measured with Beam 2.77 here; README, Streaming).
CANNOT_FOLLOW = {
    "DirectRunner": "returns after 0.3 s having read nothing",
    "SwitchingDirectRunner": "returns after 0.3 s having read nothing",
    "BundleBasedDirectRunner": "refuses MatchContinuously (its Watch GroupByKey is not replaced)",
    "FnApiRunner": "runs bounded pipelines only",
    "FlinkRunner": "Beam 2.62's Flink job server polls once and ends the job (no residual of the "
    "Python splittable DoFn is resumed)",
}


def streaming_runner(options: PipelineOptions) -> PipelineOptions:
    """``options`` on Prism when no runner was named (the only local runner here that follows
    files); a runner known not to follow files is refused."""
    standard = options.view_as(StandardOptions)
    if standard.runner is not None:
        name = (
            standard.runner if isinstance(standard.runner, str) else type(standard.runner).__name__
        )
        reason = CANNOT_FOLLOW.get(name.rsplit(".", 1)[-1])
        if reason:
            raise UsageError(f"--streaming cannot follow files on --runner={name}: it {reason}")
        return options
    try:
        flags = engines.runner_flags("prism")
    except FileNotFoundError as error:
        raise UsageError(f"--streaming runs on Prism by default: {error}") from None
    given = options.get_all_options(drop_default=True, retain_unknown_options=True)
    given.pop("runner", None)
    return PipelineOptions([*flags, "--streaming"], **given)


def allowed_lateness_ms(lateness: str | None, window: str) -> int:
    """``--allowed-lateness`` in ms; by default one window: a window is final once the input
    has moved a whole window past its end (reports uploaded a window late, or a file holding
    two windows' reports, still count)."""
    if lateness is None:
        return report_rows.parse_duration_ms(window)
    return parse_lateness_ms(lateness)


def _refuse_foreign(layout: stream.StreamLayout, overwrite: bool) -> None:
    for path, flag in ((layout.output, "--output"), (layout.private, "--private-output")):
        if os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"{flag} {path!r} is a file, not a directory")
    if os.path.isfile(os.path.join(layout.output, release_format.COMMIT_FILE)) and not overwrite:
        raise UsageError(
            f"--output {layout.output!r} holds a batch release; pass --overwrite to replace it"
        )
    if overwrite:
        for path in (layout.output, layout.private):
            if os.path.isdir(path):
                shutil.rmtree(path)
        return
    if os.path.isdir(layout.output):
        stray = [
            name
            for name in os.listdir(layout.output)
            if name != PROGRESS_FILE and stream.parse_window_name(name) is None
        ]
        if stray:
            raise UsageError(
                f"--output {layout.output!r} holds {stray[0]!r}, which no streaming shuffler "
                "writes; pass --overwrite to replace it"
            )


def recover(layout: stream.StreamLayout) -> list[int]:
    """Discard what a killed run left uncommitted (staged rows, close records, half-written
    windows' inputs records and batch folders), keeping committed windows; returns the starts of
    the committed windows."""
    root = layout.root
    for name in ("staging", "batch", "closed"):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if os.path.exists(layout.watermark):
        os.remove(layout.watermark)
    committed = []
    names = os.listdir(layout.output) if os.path.isdir(layout.output) else []
    for name in sorted(names):
        start = stream.parse_window_name(name)
        if start is not None and layout.committed(start):
            committed.append(start)
    for path in glob.glob(os.path.join(root, "inputs", "*.json")):
        start = stream.parse_window_name(os.path.basename(path)[: -len(".json")])
        if start is None or start not in committed:
            os.remove(path)
    return committed


class WindowCommitter:
    """Commits closed windows with the batch shuffler (pipelines/shuffle.py) and keeps
    ``OUTPUT/_STREAM.json`` current."""

    def __init__(
        self,
        layout: stream.StreamLayout,
        values: Mapping[str, Any],
        shuffle_window: Callable[[PipelineOptions], dict[str, Any]],
        runner_flags: list[str],
    ) -> None:
        self._layout = layout
        self._values = dict(values)
        self._shuffle_window = shuffle_window
        self._runner_flags = runner_flags
        self.committed: list[dict[str, Any]] = []

    def commit_window(self, record: Mapping[str, Any]) -> dict[str, Any]:
        layout, start = self._layout, int(record["window_start_ms"])
        batch = layout.batch(start)
        os.makedirs(batch, exist_ok=True)
        inputs = []
        for staged, source, _rows in record["staged"]:
            target = os.path.join(batch, os.path.basename(staged))
            if os.path.exists(staged):
                os.replace(staged, target)
            elif not os.path.exists(target):
                raise RuntimeError(f"{staged}: staged rows of {stream.window_name(start)} missing")
            inputs.append(source)
        # Which input files made the window, written before its commit: a re-read after a
        # restart skips exactly these files' rows of a committed window.
        stream.write_json(layout.inputs_record(start), {"inputs": sorted(inputs)})
        values = dict(
            self._values,
            input=os.path.join(batch, "*.avro"),
            output=layout.release(start),
            private_output=layout.window_private(start),
            overwrite=True,
        )
        started = time.time()
        summary = self._shuffle_window(PipelineOptions(self._runner_flags, **values))
        if not summary.get("adds_up"):
            raise RuntimeError(
                f"{layout.window_private(start)}/metrics.json: the records do not add up"
            )
        shutil.rmtree(batch, ignore_errors=True)
        os.remove(layout.close_record(start))
        staging = layout.staging(start)
        if os.path.isdir(staging) and not os.listdir(staging):
            os.rmdir(staging)
        line = {
            "window": stream.window_name(start),
            "window_start_ms": start,
            "read": summary["read"],
            "released": summary["released"],
            "committed_at": round(time.time(), 3),
            "commit_seconds": round(time.time() - started, 3),
        }
        self.committed.append(line)
        return line

    def commit_ready(self, finished: bool = False) -> list[dict[str, Any]]:
        """Commit every window closed so far (oldest first), then publish the progress."""
        layout = self._layout
        try:
            with open(layout.watermark) as handle:
                watermark = json.load(handle)
        except FileNotFoundError:
            watermark = {"watermark_ms": None, "final": False}
        done = []
        for path in sorted(glob.glob(os.path.join(layout.root, "closed", "*.json"))):
            with open(path) as handle:
                done.append(self.commit_window(json.load(handle)))
        stream.write_json(
            os.path.join(layout.output, PROGRESS_FILE),
            {
                "instance": self._values.get("instance"),
                "window_ms": report_rows.parse_duration_ms(self._values["window"]),
                "allowed_lateness_ms": allowed_lateness_ms(
                    self._values["allowed_lateness"], self._values["window"]
                ),
                "committed_through_ms": watermark["watermark_ms"],
                "finished": bool(finished),
            },
        )
        return done


def _read_json(path: str) -> dict[str, Any]:
    with open(path) as handle:
        return json.load(handle)


def stream_metrics(layout: stream.StreamLayout) -> dict[str, Any]:
    """The instance's balance over every input file read, per window and in total:
    rows of a window in the input = its batch run's read + its late rows, and each window's
    read = released + deleted + withheld + dead-lettered + presence; in total, read = rejected
    at ingest + the windows' rows."""
    ingest_files = sorted(glob.glob(os.path.join(layout.ingest, "*.json")))
    read, ingest_rejected, unknown = 0, {}, {}
    rows_per_window: dict[str, int] = {}
    for path in ingest_files:
        record = _read_json(path)
        read += record["records"]
        for name, value in record["counts"].items():
            if name.startswith(REJECTED_PREFIX):
                reason = name[len(REJECTED_PREFIX) :]
                ingest_rejected[reason] = ingest_rejected.get(reason, 0) + value
            elif name.startswith(UNKNOWN_PREFIX):
                unknown[name] = unknown.get(name, 0) + value
        for window, rows in record["windows"].items():
            rows_per_window[window] = rows_per_window.get(window, 0) + rows
    windows = {}
    totals = {"released": 0, "deleted": 0, "withheld": 0, "presence": 0, "dead_lettered": 0}
    late_total = 0
    for name in sorted(rows_per_window):
        start = stream.parse_window_name(name)
        late = sum(
            _read_json(path)["rows"]
            for path in glob.glob(os.path.join(layout.late(start), "*.json"))
        )
        late_total += late
        metrics_path = os.path.join(layout.window_private(start), METRICS_FILE)
        entry: dict[str, Any] = {"rows": rows_per_window[name], "late_data": late}
        if layout.committed(start) and os.path.isfile(metrics_path):
            window_metrics = _read_json(metrics_path)
            for key in ("read", "released", "deleted", "withheld", "presence", "dead_lettered"):
                entry[key] = window_metrics[key]
            for key in totals:
                totals[key] += window_metrics[key]
            entry["committed"] = True
            entry["adds_up"] = bool(
                window_metrics["adds_up"] and entry["rows"] == window_metrics["read"] + late
            )
        else:
            entry["committed"] = False
            entry["adds_up"] = entry["rows"] == late
        windows[name] = entry
    dead_lettered = sum(ingest_rejected.values()) + totals["dead_lettered"] + late_total
    accounted = (
        totals["released"]
        + totals["deleted"]
        + totals["withheld"]
        + totals["presence"]
        + dead_lettered
    )
    return {
        "read": read,
        "files_read": len(ingest_files),
        "rejected_at_ingest": ingest_rejected,
        "late_data": late_total,
        **{key: totals[key] for key in ("released", "deleted", "withheld", "presence")},
        "dead_lettered": dead_lettered,
        "accounted": accounted,
        "chunks_of_unknown_records": unknown,
        "windows": windows,
        "windows_committed": sum(1 for entry in windows.values() if entry["committed"]),
        "adds_up": read == accounted
        and not unknown
        and all(entry["adds_up"] for entry in windows.values()),
    }


def run(
    options: PipelineOptions,
    config: ShuffleConfig,
    private: str,
    shuffle_window: Callable[[PipelineOptions], dict[str, Any]],
) -> dict[str, Any]:
    """Follow ``--input`` until ``--watch-for`` ends, committing each window as it closes with
    ``shuffle_window`` (the batch shuffler's ``run``, given by pipelines/shuffle.py with the run's
    ``config`` and private directory); returns the instance's metrics (PDIR/metrics.json)."""
    shuffle_options = options.view_as(ShuffleOptions)
    if not shuffle_options.input or not shuffle_options.output:
        raise UsageError("--input and --output are required")
    streaming_options = streaming_runner(options)  # before anything is touched
    lateness_ms = allowed_lateness_ms(shuffle_options.allowed_lateness, shuffle_options.window)
    output = shuffle_options.output
    shuffler_key_flags.check_signing_key(shuffle_options.signing_key, config.rules.instance)
    layout = stream.StreamLayout(output, private)
    _refuse_foreign(layout, bool(shuffle_options.overwrite))
    os.makedirs(output, exist_ok=True)
    os.makedirs(layout.root, exist_ok=True)
    committed_before = recover(layout)

    values = {
        ShuffleOptions.dest(flag): getattr(shuffle_options, ShuffleOptions.dest(flag))
        for flag in ShuffleOptions.FLAGS
    }
    committer = WindowCommitter(layout, values, shuffle_window, ["--runner=FnApiRunner"])
    committer.commit_ready()  # publishes _STREAM.json at once: the analyzer sees the instance
    match: dict[str, Any] = {"interval": shuffle_options.watch_interval}
    if shuffle_options.watch_for is not None:
        match["stop_timestamp"] = Timestamp.now() + shuffle_options.watch_for
    started = time.monotonic()
    pipeline = new_pipeline(streaming_options)
    _ = (
        pipeline
        | "WatchInput" >> fileio.MatchContinuously(shuffle_options.input, **match)
        | "Follow"
        >> stream.FollowReports(
            config.rules, config.window, lateness_ms, layout, config.batch_records
        )
    )
    result = pipeline.run()
    poll = min(1.0, shuffle_options.watch_interval)
    while not PipelineState.is_terminal(result.state):
        committer.commit_ready()
        time.sleep(poll)
    result.wait_until_finish()
    if result.state != PipelineState.DONE:
        raise RuntimeError(f"the streaming pipeline ended {result.state}")
    committer.commit_ready(finished=True)
    summary = stream_metrics(layout)
    summary.update(
        seconds=round(time.monotonic() - started, 3),
        release=output,
        private_output=private,
        instance=shuffle_options.instance,
        commit_signed=shuffle_options.signing_key is not None,
        windows_committed_before=len(committed_before),
        committed_now=committer.committed,
    )
    stream.write_json(os.path.join(private, METRICS_FILE), summary)
    return summary

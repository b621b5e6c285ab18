"""``esa analyze --streaming``: analyze each event-time window once the shuffler instances have
committed it.

    esa analyze --streaming --input RELEASES --output DIR [--watch-interval 10]
        [--watch-for SECONDS] [--instance-timeout 120] [--instances K] [--key-ring KEYS]
        [--shuffler-keys SKEYS] [--truth SIM] ...

``RELEASES`` holds one folder per shuffler instance (``instance=<u>/``, as ``esa shuffle
--streaming`` writes them: ``window=<start>/`` releases, each with its signed ``_COMMIT.json``,
and ``_STREAM.json``, the instance's progress). Every ``--watch-interval`` seconds the analyzer
lists the commit records (they are small; what is analyzed is decided by them alone) and
analyzes a window once every expected instance (``--instances K``: 0..K-1; default every
instance folder present) has committed it, or has said in ``_STREAM.json`` that it is past the
window without data for it (``committed_through_ms`` beyond the window's end plus its lateness,
or ``finished``), or ``--instance-timeout`` seconds after the window's first commit was seen:
then the instances that have not committed are named (``missing_instances``) and n and ε_c come
from those present. A window is analyzed by the batch analyzer (pipelines/analyze.py: every
release verified against its commit record and signature first), on FnApiRunner unless
``--runner`` says otherwise, and its results are moved into DIR partitioned by window:

    DIR/histograms.parquet/window=<start>/part-*.parquet   (also longitudinal.parquet)
    DIR/reports.jsonl/window=<start>/, DIR/withheld.jsonl/window=<start>/
    DIR/pictures/window=<start>/*.png, DIR/dead_letter/window=<start>/
    DIR/windows/window=<start>.json    the window's summary, written last: the window is done
    DIR/summary.json                   every window analyzed so far (replaced atomically)

Exactly once: a window whose ``windows/`` record exists is never analyzed again, also after a
restart; a window killed half-way (no record) is cleaned and analyzed again. After
``--watch-for`` seconds the analyzer waits, at most ``--instance-timeout`` seconds, for instances
that have not said they finished, analyzes every window with a commit left, and stops.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline.analyze_options import AnalyzeOptions
from pipelines.commandline.main import UsageError
from schemas.release import commit as release_format
from schemas.windows import parse_window_name, window_name
from transforms.analyzer.analyze import HISTOGRAMS_FILE, LONGITUDINAL_FILE, SUMMARY_FILE
from transforms.analyzer.report_files import REPORTS_DIR, WITHHELD_DIR, read_reports
from transforms.common.json_files import write_json

PROGRESS_FILE = "_STREAM.json"
WINDOWS_DIR = "windows"
WORK_DIR = "_work"
# What one window's batch analysis writes, moved to DIR/<name>/window=<start>/.
PARTITIONED = (
    HISTOGRAMS_FILE,
    LONGITUDINAL_FILE,
    REPORTS_DIR,
    WITHHELD_DIR,
    "pictures",
    "dead_letter",
)
_INSTANCE = re.compile(r"instance=(\d+)$")


@dataclass
class WindowCommits:
    """What is known of one window: the instances that committed it, when first seen."""

    start_ms: int
    releases: dict[str, str] = field(default_factory=dict)  # instance folder -> release
    first_seen: float = 0.0


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (FileNotFoundError, ValueError):
        return None


def instance_folders(root: str, expected: int | None) -> list[str]:
    """The instance folders expected: ``instance=0..K-1`` with ``--instances K``, else every
    ``instance=<u>`` (or folder with a progress record) present, or ``root`` itself when it is
    one instance's folder."""
    if expected is not None:
        return [os.path.join(root, f"instance={u}") for u in range(expected)]
    if not os.path.isdir(root):
        return []
    if os.path.isfile(os.path.join(root, PROGRESS_FILE)) or any(
        parse_window_name(name) is not None for name in os.listdir(root)
    ):
        return [root]  # one instance's folder given itself
    return sorted(
        os.path.join(root, name)
        for name in os.listdir(root)
        if os.path.isdir(os.path.join(root, name))
        and (_INSTANCE.fullmatch(name) or os.path.isfile(os.path.join(root, name, PROGRESS_FILE)))
    )


def scan_commits(folders: Sequence[str], known: dict[int, WindowCommits], now: float) -> None:
    """Add the windows each instance folder has committed since the last scan to ``known``."""
    for folder in folders:
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            start = parse_window_name(name)
            if start is None:
                continue
            if not os.path.isfile(os.path.join(folder, name, release_format.COMMIT_FILE)):
                continue
            entry = known.setdefault(start, WindowCommits(start, first_seen=now))
            entry.releases.setdefault(folder, os.path.join(folder, name))


def past_window(progress: Mapping[str, Any] | None, start_ms: int) -> bool:
    """Whether an instance's progress record says it will commit nothing more for the window
    (finished, or its committed watermark is past the window's end plus its lateness)."""
    if not progress:
        return False
    if progress.get("finished"):
        return True
    through, period = progress.get("committed_through_ms"), progress.get("window_ms")
    lateness = progress.get("allowed_lateness_ms") or 0
    if not isinstance(through, int) or not isinstance(period, int):
        return False
    return through >= start_ms + period + lateness


def missing_instances(entry: WindowCommits, folders: Sequence[str]) -> tuple[list[str], list[str]]:
    """(instances that have not committed the window, those of them that still may)."""
    missing = [folder for folder in folders if folder not in entry.releases]
    waiting = [
        folder
        for folder in missing
        if not past_window(_read_json(os.path.join(folder, PROGRESS_FILE)), entry.start_ms)
    ]
    return missing, waiting


class WindowAnalyzer:
    """Analyzes one window with the batch analyzer and moves its results into place."""

    def __init__(
        self,
        output: str,
        base: Mapping[str, Any],
        analyze_window: Callable[[PipelineOptions], dict[str, Any]],
        say: Callable[[str], None],
    ) -> None:
        self._output = output
        self._analyze_window = analyze_window
        self._base = dict(base)
        self._say = say
        self.analyzed: list[dict[str, Any]] = []

    def record_path(self, start_ms: int) -> str:
        return os.path.join(self._output, WINDOWS_DIR, window_name(start_ms) + ".json")

    def done(self, start_ms: int) -> bool:
        return os.path.isfile(self.record_path(start_ms))

    def clean(self, start_ms: int) -> None:
        """Remove what a killed attempt at the window left (it has no record)."""
        name = window_name(start_ms)
        shutil.rmtree(os.path.join(self._output, WORK_DIR, name), ignore_errors=True)
        for product in PARTITIONED:
            shutil.rmtree(os.path.join(self._output, product, name), ignore_errors=True)

    def analyze(self, entry: WindowCommits, missing: Sequence[str]) -> dict[str, Any]:
        start, name = entry.start_ms, window_name(entry.start_ms)
        self.clean(start)
        work = os.path.join(self._output, WORK_DIR, name)
        values = dict(
            self._base,
            analyze_input=[entry.releases[folder] for folder in sorted(entry.releases)],
            analyze_output=work,
            analyze_overwrite=True,
        )
        started = time.time()
        summary = self._analyze_window(PipelineOptions([], **values))
        reports = read_reports(work)
        line = window_line(name, summary, reports, missing)
        for product in PARTITIONED:
            source = os.path.join(work, product)
            if os.path.exists(source):
                os.makedirs(os.path.join(self._output, product), exist_ok=True)
                os.replace(source, os.path.join(self._output, product, name))
        record = {
            "window": name,
            "window_start_ms": start,
            "instances": sorted(
                release_format.read_commit(path)["instance"] for path in entry.releases.values()
            ),
            "missing_instances": [os.path.basename(folder) for folder in missing],
            "releases": sorted(entry.releases.values()),
            "metrics": summary.get("metrics"),
            "crowds": line["crowds"],
            "first_commit_seen_at": round(entry.first_seen, 3),
            "analyzed_at": round(time.time(), 3),
            "analyze_seconds": round(time.time() - started, 3),
            "summary": {k: v for k, v in summary.items() if k not in ("pictures",)},
        }
        write_json(self.record_path(start), record)  # last: the window is done
        shutil.rmtree(work, ignore_errors=True)
        self.analyzed.append(record)
        self._say(line["text"])
        return record


def window_line(
    name: str,
    summary: Mapping[str, Any],
    reports: Mapping[str, list[dict[str, Any]]],
    missing: Sequence[str],
) -> dict[str, Any]:
    """One line per analyzed window: per crowd n, ε_c and RMSE against the truth (if given)."""
    crowds = []
    for crowd in reports["histograms"]:
        privacy, accuracy = crowd.get("privacy", {}), crowd.get("accuracy", {})
        crowds.append(
            {
                "channel": crowd.get("channel"),
                "crowd_id": crowd.get("crowd_id"),
                "n": crowd.get("respondents_effective"),
                "epsilon_central": privacy.get(
                    "epsilon_central_total", privacy.get("epsilon_central")
                ),
                "rmse": accuracy.get("rmse"),
            }
        )
    parts = [
        f"{c['channel']}{'/' + c['crowd_id'] if c['crowd_id'] else ''} n={_number(c['n'])} "
        f"eps_c={_number(c['epsilon_central'], '.3g')} rmse={_number(c['rmse'], '.4g')}"
        for c in crowds
    ] or ["no crowd released"]
    read = (summary.get("metrics") or {}).get("read", 0)
    text = f"{name}  messages {read:,}  " + "; ".join(parts)
    if missing:
        text += f"  (missing: {', '.join(os.path.basename(m) for m in missing)})"
    return {"text": text, "crowds": crowds}


def _number(value: Any, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def write_summary(output: str, analyzer: WindowAnalyzer, pending: Mapping[int, Any]) -> None:
    records = [
        _read_json(path) for path in sorted(glob.glob(os.path.join(output, WINDOWS_DIR, "*.json")))
    ]
    records = [record for record in records if record]
    write_json(
        os.path.join(output, SUMMARY_FILE),
        {
            "mode": "streaming",
            "windows_analyzed": len(records),
            "windows": [
                {
                    key: record.get(key)
                    for key in (
                        "window",
                        "window_start_ms",
                        "instances",
                        "missing_instances",
                        "crowds",
                        "metrics",
                        "analyzed_at",
                    )
                }
                for record in records
            ],
            "windows_waiting": [window_name(start) for start in sorted(pending)],
            "tables": {product: os.path.join(output, product) for product in PARTITIONED},
        },
    )


def _say(text: str) -> None:
    print(text, flush=True)


def run(
    options: PipelineOptions,
    analyze_window: Callable[[PipelineOptions], dict[str, Any]],
    say: Callable[[str], None] = _say,
) -> dict[str, Any]:
    """Follow the releases until ``--watch-for`` ends, analyzing each window with
    ``analyze_window`` (the batch analyzer's ``run``, given by pipelines/analyze.py); returns
    summary.json's content."""
    values = options.view_as(AnalyzeOptions)
    inputs = values.analyze_input or []
    if len(inputs) != 1:
        raise UsageError("--streaming takes one --input: the folder of instance=<u>/ releases")
    root, output = inputs[0], values.analyze_output
    if not output:
        raise UsageError("--output DIR is required")
    os.makedirs(output, exist_ok=True)
    if os.path.isfile(os.path.join(output, SUMMARY_FILE)) and not os.path.isdir(
        os.path.join(output, WINDOWS_DIR)
    ):
        raise UsageError(f"--output {output!r} holds a batch analysis; choose another folder")
    # Each window's batch analysis gets every option given (--streaming aside), on FnApiRunner
    # unless --runner names another.
    base = options.get_all_options(drop_default=True, retain_unknown_options=True)
    base.pop("streaming", None)
    base.setdefault("runner", "FnApiRunner")
    analyzer = WindowAnalyzer(output, base, analyze_window, say)
    timeout = values.analyze_instance_timeout
    deadline = None if values.analyze_watch_for is None else time.time() + values.analyze_watch_for
    known: dict[int, WindowCommits] = {}
    shutil.rmtree(os.path.join(output, WORK_DIR), ignore_errors=True)

    def step(final: bool) -> None:
        now = time.time()
        folders = instance_folders(root, values.analyze_instances)
        scan_commits(folders, known, now)
        for start in sorted(known):
            entry = known[start]
            if analyzer.done(start):
                del known[start]
                continue
            missing, waiting = missing_instances(entry, folders)
            if final or not waiting or now - entry.first_seen >= timeout:
                analyzer.analyze(entry, missing)
                del known[start]
        write_summary(output, analyzer, known)

    while deadline is None or time.time() < deadline:
        step(final=False)
        time.sleep(values.analyze_watch_interval)
    # The input ended: wait (at most --instance-timeout) for instances still committing.
    grace = time.time() + timeout
    while time.time() < grace:
        folders = instance_folders(root, values.analyze_instances)
        progress = [_read_json(os.path.join(folder, PROGRESS_FILE)) for folder in folders]
        step(final=False)
        if all(record and record.get("finished") for record in progress):
            break
        time.sleep(min(1.0, values.analyze_watch_interval))
    step(final=True)
    summary = _read_json(os.path.join(output, SUMMARY_FILE)) or {}
    summary["analyzed_now"] = [record["window"] for record in analyzer.analyzed]
    return summary

"""The streaming shuffler (``esa shuffle --streaming`` on Prism) against the batch shuffler.

One shuffler instance, a one-hot recipe, W windows of device time simulated once (``esa simulate
--stream``'s fleet), each window's reports in one file. Three measurements, each command in its
own process:

- **sustained messages/s**: every window's file dropped at once into the followed folder, from
  the drop to the last window's commit (Prism's start excluded: the files are dropped once the
  pipeline polls), against ``esa shuffle`` (batch, FnApiRunner) on the same files in the same run
  (its own start-up included, as a person would run it);
- **latency from a window's close to its commit**: files dropped one window every ``PACE``
  seconds; window k closes when window k+1's file appears (the watermark passes it) and is
  committed at ``committed_at`` in the shuffler's metrics (median and worst over the windows);
- **peak RSS over W windows against few** (paced runs): the shuffler's process tree (Python with
  its LOOPBACK worker, and Prism), sampled every 0.25 s.

Quick mode: 2 and 5 windows of 1,000 respondents; full mode: 5 and 50 windows of 3,000.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import simulate, stream_simulate
from pipelines.engines import runners
from schemas.windows import window_name

REPOSITORY = Path(__file__).resolve().parents[1]
PACE = 4.0  # seconds between windows in the paced runs
RECIPE = {
    "name": "bench_streaming",
    "version": 1,
    "channel": "bench_streaming",
    "randomizer": "one_hot_rappor",
    "randomizer_params": {"domain_size": 64, "epsilon": 4.0},
    "fragmentation": "attribute",
    "epsilon_local": 4.0,
    "epsilon_central_target": 4.0,
    "delta": 1e-6,
    "min_crowd_size": 50,
    "query_class": "test",
    "data_fields": ["value"],
    "shuffler_instances": 1,
    "window": "1d",
}


def _esa(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.commandline.main", *argv],
        cwd=REPOSITORY,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _tree_rss_mb(root: int) -> float:
    """Resident memory of ``root`` and all its descendants, in MB."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    parents[int(name)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        tree.update(children)
        frontier.extend(children)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024.0


def _fleet(root: Path, windows: int, respondents: int) -> tuple[list[Path], int]:
    """One report file per window (in ``root/ready``) and the number of records."""
    recipe = root / "recipe.json"
    recipe.write_text(json.dumps(RECIPE))
    options = PipelineOptions(
        ["--runner=FnApiRunner"],
        simulate_recipe=str(recipe),
        simulate_population="uniform",
        simulate_respondents=respondents,
        simulate_seed=11,
        simulate_windows=windows,
        simulate_output=str(root / "sim"),
    )
    summary = stream_simulate.prepare(options, simulate.run)
    ready = root / "ready"
    ready.mkdir()
    window_ms = int(summary["window_ms"])
    first = int(datetime.fromisoformat(summary["start"]).timestamp() * 1000)
    folder = root / "sim" / stream_simulate.FLEET_DIR / "instance=0"
    files, records = [], 0
    for window in range(windows):
        rows = stream_simulate.window_rows(folder, first + window * window_ms, window_ms)
        path = ready / f"w{window:05d}.avro"
        stream_simulate.write_atomically(path, rows)
        files.append(path)
        records += rows.num_rows
    return files, records


def _follow(root: Path, files: list[Path], paced: bool, name: str) -> dict[str, Any]:
    inbox, output = root / f"in-{name}", root / f"out-{name}" / "instance=0"
    inbox.mkdir()
    startup = 20.0
    watch_for = startup + (len(files) * PACE if paced else 10.0) + 5.0
    process = _esa(
        "shuffle", "--streaming", "--input", str(inbox / "*.avro"), "--output", str(output),
        "--instance", "0", "--recipe", str(root / "recipe.json"),
        "--watch-interval", "1", "--watch-for", str(watch_for),
    )  # fmt: skip
    began = time.time()
    peak = 0.0
    dropped: list[float] = []

    def sample() -> None:
        nonlocal peak
        peak = max(peak, _tree_rss_mb(process.pid))

    # Prism polls once its pipeline runs: the first poll stages nothing but writes no file, so
    # wait for the start-up to pass (the pipeline's own start is not what is measured).
    while time.time() - began < startup:
        sample()
        time.sleep(0.25)
    for index, path in enumerate(files):
        if paced and index:
            until = dropped[0] + index * PACE
            while time.time() < until:
                sample()
                time.sleep(0.25)
        shutil.copyfile(path, inbox / f".{path.name}")
        os.rename(inbox / f".{path.name}", inbox / path.name)
        dropped.append(time.time())
    while process.poll() is None:
        sample()
        time.sleep(0.25)
    if process.returncode != 0:
        raise RuntimeError(process.stderr.read().decode(errors="replace")[-2000:])
    metrics = json.loads((Path(f"{output}.private") / "metrics.json").read_text())
    committed = {line["window"]: line["committed_at"] for line in metrics["committed_now"]}
    first_start = metrics["committed_now"][0]["window_start_ms"]
    window_ms = 86_400_000
    latencies = []
    for index in range(len(files) - 1):  # the last window closes when the input ends
        name_k = window_name(first_start + index * window_ms)
        latencies.append(committed[name_k] - dropped[index + 1])
    return {
        "read": metrics["read"],
        "adds_up": metrics["adds_up"],
        "seconds_to_last_commit": max(committed.values()) - dropped[0],
        "latencies": latencies,
        "peak_rss_mb": peak,
        "windows": len(committed),
    }


def _batch(root: Path, files: list[Path]) -> float:
    started = time.time()
    process = _esa(
        "shuffle", "--input", str(files[0].parent / "*.avro"), "--output", str(root / "batch"),
        "--instance", "0", "--recipe", str(root / "recipe.json"),
    )  # fmt: skip
    if process.wait() != 0:
        raise RuntimeError(process.stderr.read().decode(errors="replace")[-2000:])
    return time.time() - started


def run(quick: bool) -> list[dict[str, Any]]:
    if runners.prism_binary() is None:
        return [{"benchmark": "streaming", "metric": "skipped", "note": "no Prism: make engines"}]
    few, many = (2, 5) if quick else (5, 50)
    respondents = 1_000 if quick else 3_000
    rows: list[dict[str, Any]] = []
    results = {}
    for windows in (few, many):
        root = Path(tempfile.mkdtemp(prefix="bench-streaming-"))
        try:
            files, records = _fleet(root, windows, respondents)
            if windows == few:
                burst = _follow(root, files, paced=False, name="burst")
                batch_seconds = _batch(root, files)
                rows.append(
                    {
                        "benchmark": "streaming",
                        "metric": f"sustained messages/s, {windows} windows at once",
                        "value": records / burst["seconds_to_last_commit"],
                        "baseline": records / batch_seconds,
                        "note": f"baseline: esa shuffle (batch) on the same {records:,} records, "
                        "start-up included; streaming: drop to last commit",
                    }
                )
            results[windows] = _follow(root, files, paced=True, name="paced")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    latencies = results[few]["latencies"] + results[many]["latencies"]
    rows.append(
        {
            "benchmark": "streaming",
            "metric": "seconds from a window's close to its commit (median)",
            "value": statistics.median(latencies),
            "note": f"worst {max(latencies):.2f} s over {len(latencies)} windows, one every "
            f"{PACE:g} s",
        }
    )
    rows.append(
        {
            "benchmark": "streaming",
            "metric": f"peak RSS MB, {many} windows",
            "value": results[many]["peak_rss_mb"],
            "baseline": results[few]["peak_rss_mb"],
            "note": f"baseline: {few} windows; shuffler process tree (Python + Prism)",
        }
    )
    return rows


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2))

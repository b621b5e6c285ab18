"""``make run``'s own command, timed: ``esa run`` with its defaults (image_grid_sealed, 40,000
respondents, 2 shuffler instances, sealed and signed) in a fresh process, as a user starts it.

One row: the command's wall seconds (interpreter start-up and imports included), with the stage
seconds of its run.json, the lines it printed, and the machine's cores and load average before
and after in the note. Target: under 30 s on two free cores. The size is make run's in both modes
(quick mode runs it too: it is the figure users wait for).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPOSITORY

TARGET_S = 30.0


def _load() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def run(quick: bool) -> list[dict]:
    del quick  # make run has one size
    work = Path(tempfile.mkdtemp(prefix="bench-make-run-"))
    load_before = _load()
    try:
        command = [sys.executable, "-m", "pipelines.commandline.main", "run",
                   "--output", str(work / "results"), "--overwrite"]  # fmt: skip
        started = time.perf_counter()
        process = subprocess.run(command, capture_output=True, cwd=REPOSITORY, check=False)
        wall = time.perf_counter() - started
        if process.returncode != 0:
            tail = process.stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"esa run failed ({process.returncode}): {tail}")
        lines = len(process.stdout.decode().splitlines())
        stages = json.loads((work / "results" / "run.json").read_text())["seconds"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [
        {
            "benchmark": "make_run",
            "metric": "wall_s",
            "value": wall,
            "baseline": TARGET_S,
            "ratio": wall / TARGET_S,
            "note": f"esa run with make run's defaults in a fresh process; target < {TARGET_S:g} s "
            f"on 2 free cores (ratio < 1); stages {stages}; {lines} lines printed; "
            f"{os.cpu_count()} cores, load {load_before} before, {_load()} after",
        }
    ]

"""Runs every ``benchmarks/bench_*.py`` and writes one table (``make bench``).

Each module exposes ``run(quick: bool) -> list[dict]``; a row names the benchmark, the metric, the
value, and a baseline measured in the same run (machines here are noisy, so ratios against a
same-run baseline are what we compare across commits, not absolute numbers).
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import importlib
import inspect
import json
import os
import pkgutil
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import benchmarks

COLUMNS = ("benchmark", "metric", "value", "baseline", "ratio", "note")


def discover(only: list[str] | None) -> list[str]:
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(benchmarks.__path__)
        if info.name.startswith("bench_")
    )
    if only:
        unknown = sorted(set(only) - {name.removeprefix("bench_") for name in names})
        if unknown:
            raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; have {names}")
        names = [name for name in names if name.removeprefix("bench_") in only]
    return names


def format_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(format_value(row.get(col)) for col in COLUMNS) + " |")
    return "\n".join(lines)


def _commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when files differ from it; None outside git."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(benchmarks.__file__).parent).stdout.strip()  # fmt: skip

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


class RunMeta:
    """What bench.json's ``meta`` says of a run: taken when the run starts (time, load) and
    completed when it ends (load after, commit), for ``make bench`` and for a benchmark run on
    its own (``bench_scaling --json``)."""

    def __init__(self) -> None:
        self.started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.load_before = os.getloadavg()

    def finish(self, quick: bool, only: list[str] | None, **more: object) -> dict:
        return {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "quick": quick,
            "started": self.started,
            "cores": os.cpu_count(),
            "load_before": [round(value, 2) for value in self.load_before],
            "load_after": [round(value, 2) for value in os.getloadavg()],
            "only": only,
            "commit": _commit(),
            **more,
        }


# The project's packages (setup.py's LAYERS) and the benchmarks themselves.
SOURCES = (
    "privacy",
    "schemas",
    "simulators",
    "transforms",
    "pipelines",
    "experiments",
    "benchmarks",
)


def compile_sources() -> None:
    """Byte-compiles the project's modules before anything is timed, as installing a package
    does: where ``PYTHONDONTWRITEBYTECODE`` is set Python never caches them, so every child a
    benchmark times would compile its ~90 modules again (~0.3 s of each stage on 2 cores)."""
    root = Path(__file__).resolve().parent.parent
    for package in SOURCES:
        compileall.compile_dir(root / package, quiet=1, workers=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench-results", help="directory for results")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--only", nargs="*", help="benchmark names without the bench_ prefix")
    parser.add_argument(
        "--workers",
        help="worker counts for the benchmarks that take them (bench_scaling), e.g. 1,4,16; "
        "default 1, 2 and the machine's cores",
    )
    args = parser.parse_args(argv)
    workers = [int(item) for item in args.workers.split(",")] if args.workers else None
    compile_sources()

    rows: list[dict] = []
    failures = 0
    run_meta = RunMeta()
    for name in discover(args.only):
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            extra = (
                {"workers": workers}
                if "workers" in inspect.signature(module.run).parameters
                else {}
            )
            module_rows = module.run(quick=args.quick, **extra)
        except Exception:  # one broken benchmark must not hide the others' numbers
            failures += 1
            traceback.print_exc()
            module_rows = [{"benchmark": name, "metric": "error", "note": "failed, see log"}]
        elapsed = time.perf_counter() - started
        print(f"{name}: {elapsed:.1f} s", file=sys.stderr)
        rows.extend(module_rows)

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_meta.finish(args.quick, args.only)
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    table = markdown_table(rows)
    (out / "bench.md").write_text(table + "\n")
    print(table)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

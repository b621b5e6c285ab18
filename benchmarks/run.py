"""Runs every ``benchmarks/bench_*.py`` and writes one table (``make bench``).

Each module exposes ``run(quick: bool) -> list[dict]``; a row names the benchmark, the metric, the
value, and a baseline measured in the same run (machines here are noisy, so ratios against a
same-run baseline are what we compare across commits, not absolute numbers).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import platform
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench-results", help="directory for results")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--only", nargs="*", help="benchmark names without the bench_ prefix")
    args = parser.parse_args(argv)

    rows: list[dict] = []
    failures = 0
    for name in discover(args.only):
        started = time.perf_counter()
        try:
            module_rows = importlib.import_module(f"benchmarks.{name}").run(quick=args.quick)
        except Exception:  # one broken benchmark must not hide the others' numbers
            failures += 1
            traceback.print_exc()
            module_rows = [{"benchmark": name, "metric": "error", "note": "failed, see log"}]
        elapsed = time.perf_counter() - started
        print(f"{name}: {elapsed:.1f} s", file=sys.stderr)
        rows.extend(module_rows)

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "quick": args.quick}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    table = markdown_table(rows)
    (out / "bench.md").write_text(table + "\n")
    print(table)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Append one dated row of ``make bench``'s key figures to the history table of
benchmarks/README.md, so that the figures the docs quote come from a script, never typed by hand.

    python -m benchmarks.history bench-results/bench.json [--readme benchmarks/README.md]
    python -m benchmarks.history scaling.json --scaling-table   # bench_scaling --json's rows

The row: when the benchmarks started (UTC), quick or full mode, the commit they ran (bench.json's,
else the checkout's when the row is appended), the machine's cores
and its 1-minute load average when they started, and from the rows of bench.json: the unsealed
shuffle's and analysis's throughput as a multiple of the plain fastavro read of the same files
(bench_shuffle, bench_analyze), the analyzer's crowds per second at many crowds (bench_crowds),
the multi-process DirectRunner's speed-ups at the most workers measured (bench_scaling) and
``make run``'s wall seconds (bench_make_run). A figure the run did not measure is shown as "-".
The table sits between the README's ``<!-- history:start -->`` and ``<!-- history:end -->``
lines; rows are appended, oldest first.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

START, END = "<!-- history:start -->", "<!-- history:end -->"
HEADER = (
    "| date (UTC) | mode | commit | cores | load | shuffle ÷ read | analyze ÷ read | crowds/s "
    "| scaling shuffle | scaling analyze | make run s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)
_SCALING = re.compile(r"^(shuffle|analyze)_direct_(\d+)w_messages_per_s$")


def _find(rows: list[dict], benchmark: str, metric: str) -> dict[str, Any] | None:
    return next(
        (r for r in rows if r.get("benchmark") == benchmark and r.get("metric") == metric), None
    )


def _number(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _scaling(rows: list[dict], stage: str) -> str:
    """The DirectRunner's speed-up at the most workers measured, e.g. ``1.62x (2 w)``."""
    best = None
    for row in rows:
        match = (
            _SCALING.match(str(row.get("metric", "")))
            if row.get("benchmark") == "scaling"
            else None
        )
        if match and match[1] == stage and int(match[2]) > 1 and row.get("ratio") is not None:
            if best is None or int(match[2]) > best[0]:
                best = (int(match[2]), row["ratio"])
    return "-" if best is None else f"{best[1]:.2f}x ({best[0]} w)"


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "-"


def history_row(results: dict[str, Any], commit: str | None = None) -> str:
    """One markdown row of the history table from bench.json's content."""
    meta, rows = results.get("meta", {}), results.get("rows", [])

    def ratio(benchmark: str, metric: str) -> str:
        row = _find(rows, benchmark, metric)
        return _number(row.get("ratio") if row else None)

    crowds = _find(rows, "crowds_analyze", "crowds_per_s")
    make_run = _find(rows, "make_run", "wall_s")
    load = meta.get("load_before")
    cells = [
        (meta.get("started") or "-").replace("+00:00", "").replace("T", " "),
        meta.get("mode") or ("quick" if meta.get("quick") else "full"),
        commit if commit is not None else (meta.get("commit") or _commit()),
        str(meta.get("cores", "-")),
        _number(load[0]) if load else "-",
        ratio("shuffle", "messages_per_s"),
        ratio("analyze", "messages_per_s"),
        _number(crowds.get("value") if crowds else None, 0),
        _scaling(rows, "shuffle"),
        _scaling(rows, "analyze"),
        _number(make_run.get("value") if make_run else None, 1),
    ]
    return "| " + " | ".join(cells) + " |"


def scaling_table(results: dict[str, Any], engine: str = "direct") -> str:
    """bench_scaling's rows of ``engine`` as one markdown table: a line per stage, a column
    per worker count (messages/s at 1 worker, then the speed-up against it, with each run's wall
    seconds), for the README's account of a run on another machine."""
    rows = results.get("rows", [])
    pattern = re.compile(rf"^(shuffle|analyze)_{re.escape(engine)}_(\d+)w_messages_per_s$")
    cells: dict[str, dict[int, dict]] = {}
    for row in rows:
        match = (
            pattern.match(str(row.get("metric", ""))) if row.get("benchmark") == "scaling" else None
        )
        if match and row.get("value") is not None:
            cells.setdefault(match[1], {})[int(match[2])] = row
    workers = sorted({n for stage in cells.values() for n in stage})
    lines = [
        "| stage | " + " | ".join(f"{n} worker{'s' if n > 1 else ''}" for n in workers) + " |",
        "|---|" + "---|" * len(workers),
    ]
    for stage in ("shuffle", "analyze"):
        if stage not in cells:
            continue
        texts = []
        for n in workers:
            row = cells[stage].get(n)
            wall = re.search(r"messages in ([0-9.]+) s", row.get("note", "")) if row else None
            seconds = f" ({wall[1]} s)" if wall else ""
            if row is None:
                texts.append("-")
            elif n == 1:
                texts.append(f"{row['value']:,.0f} msg/s{seconds}")
            else:
                texts.append(f"{row['ratio']:.2f}x{seconds}")
        lines.append(f"| `{stage}` | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def append_row(readme: Path, row: str) -> None:
    """Append ``row`` to the table between the START and END lines of ``readme`` (the table's
    header is written when the section is empty)."""
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme} has no {START} ... {END} section")
    head, rest = text.split(START, 1)
    body, tail = rest.split(END, 1)
    lines = [line for line in body.strip().splitlines() if line.strip()]
    if not lines:
        lines = HEADER.splitlines()
    lines.append(row)
    readme.write_text(head + START + "\n" + "\n".join(lines) + "\n" + END + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="bench.json written by make bench")
    parser.add_argument(
        "--readme", default=str(Path(__file__).with_name("README.md")), help="file to append to"
    )
    parser.add_argument("--print", action="store_true", help="print the row, append nothing")
    parser.add_argument("--commit", help="the commit benchmarked, where bench.json does not say")
    parser.add_argument("--scaling-table", action="store_true",
                        help="print bench_scaling's DirectRunner rows as a table, append nothing")  # fmt: skip
    args = parser.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    if isinstance(results, list):  # rows alone, as bench_scaling --json wrote them before meta
        results = {"meta": {}, "rows": results}
    if args.scaling_table:
        print(scaling_table(results))
        return 0
    row = history_row(results, None if results.get("meta", {}).get("commit") else args.commit)
    if args.print:
        print(row)
    else:
        append_row(Path(args.readme), row)
        print(f"appended to {args.readme}: {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

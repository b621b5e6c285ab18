"""One ``esa experiment`` run: build the tables, write CSV, Markdown, figures and report.md."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.check import run_pipeline_check
from experiments.figures import table_figures
from experiments.lab import ExperimentLab
from experiments.render import Table, render_report
from experiments.scenarios import ExperimentConfig
from experiments.tables import EXPERIMENT_TABLES, TABLE_BUILDERS


@dataclass(frozen=True)
class ExperimentResult:
    """What one ``esa experiment`` run wrote: tables, (step, seconds) per table, total seconds,
    the report and every file."""

    tables: list[Table]
    timing: list[tuple[str, float]]
    seconds: float
    report: Path
    files: list[Path]


def run_experiment(
    experiment: str,
    output: Path,
    config: ExperimentConfig,
    *,
    pictures: bool = True,
    pipeline_check: bool = True,
    check_respondents: int | None = None,
    progress: Any = None,
) -> ExperimentResult:
    """Build the tables of ``experiment``, write CSV, Markdown, figures and the report."""
    if experiment not in EXPERIMENT_TABLES:
        raise ValueError(
            f"unknown experiment {experiment!r}; choose from {', '.join(EXPERIMENT_TABLES)}"
        )
    output.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    lab = ExperimentLab(config)
    tables, timing, files, figures = [], [], [], {}
    for key in EXPERIMENT_TABLES[experiment]:
        _say(progress, f"table {key} ...")
        table = TABLE_BUILDERS[key](lab)
        tables.append(table)
        files += _write_table(output, table)
        seconds = table.seconds
        if pictures:
            drawn_at = time.perf_counter()
            for name, png in table_figures(table, lab).items():
                files.append(_write(output / name, png))
                figures.setdefault(table.key, []).append(name)
            seconds += time.perf_counter() - drawn_at
        timing.append((f"Table {key}", seconds))
        _say(progress, f"table {key}: {seconds:.1f} s")
    check_table = None
    if pipeline_check:
        _say(progress, "message-level pipeline check ...")
        checked_at = time.perf_counter()
        check_table = run_pipeline_check(
            [table.key for table in tables], config, output / "pipeline-check", check_respondents
        )
        files += _write_table(output, check_table)
        timing.append(("pipeline check", time.perf_counter() - checked_at))
    total = time.perf_counter() - started
    timing_csv = "step,seconds\n" + "".join(f"{name},{seconds:.3f}\n" for name, seconds in timing)
    files.append(_write(output / "timing.csv", timing_csv.encode()))
    report = output / "report.md"
    files.append(
        _write(
            report,
            render_report(experiment, config, tables, figures, check_table, timing, total).encode(),
        )
    )
    return ExperimentResult(tables, timing, total, report, files)


def _say(progress: Any, text: str) -> None:
    if progress is not None:
        print(text, file=progress, flush=True)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _write_table(output: Path, table: Table) -> list[Path]:
    return [
        _write(output / f"{table.slug}.csv", table.to_csv().encode()),
        _write(output / f"{table.slug}.md", table.to_markdown().encode()),
    ]

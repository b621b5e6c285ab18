"""A table of Section VII as CSV (one record per scenario) and Markdown (the paper's layout), the
number formats of its cells, and report.md."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from experiments.scenarios import ExperimentConfig

# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """One table of Section VII: a CSV form (one record per scenario) and a Markdown form in the
    paper's layout (``header`` and ``layout`` rows; cells may hold ``<br>`` line breaks), with
    notes that state seed, n, d, delta, the bound used and where our data differ."""

    key: str
    slug: str
    title: str
    header: tuple[str, ...]
    layout: tuple[tuple[str, ...], ...]
    columns: tuple[str, ...]
    records: tuple[dict, ...]
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if any(len(row) != len(self.header) for row in self.layout):
            raise ValueError(f"every layout row of table {self.key} needs {len(self.header)} cells")
        for record in self.records:
            unknown = set(record) - set(self.columns)
            if unknown:
                raise ValueError(f"table {self.key} record has unknown columns {sorted(unknown)}")

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(self.columns), lineterminator="\n")
        writer.writeheader()
        for record in self.records:
            writer.writerow({name: _csv_value(record.get(name)) for name in self.columns})
        return buffer.getvalue()

    def to_markdown(self, heading_level: int = 2) -> str:
        lines = [f"{'#' * heading_level} Table {self.key}: {self.title}", ""]
        lines.append("| " + " | ".join(_md_cell(cell) for cell in self.header) + " |")
        lines.append("|" + "|".join("---" for _ in self.header) + "|")
        lines += ["| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in self.layout]
        lines.append("")
        lines += [f"- {note}" for note in self.notes]
        if self.seconds:
            lines.append(f"- Computed in {self.seconds:.1f} s.")
        return "\n".join(lines) + "\n"

    def with_seconds(self, seconds: float) -> Table:
        return replace(self, seconds=seconds)


def _csv_value(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    if isinstance(value, np.floating | np.integer):
        return _csv_value(value.item())
    return value


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


def fmt(value: float | int | None, digits: int = 2) -> str:
    """A number for a table cell: fixed digits, thousands separators, '–' when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if value != 0 and abs(value) < 10 ** (-digits):
        return f"{value:.2g}"
    return f"{value:,.{digits}f}"


def paper_fmt(value: float | None) -> str:
    """A published number as the paper prints it: two decimals, more where it prints more."""
    if value is None:
        return "–"
    text = f"{value:,.4f}".rstrip("0")
    whole, _, decimals = text.partition(".")
    return f"{whole}.{decimals.ljust(2, '0')}"


def render_report(
    experiment: str,
    config: ExperimentConfig,
    tables: Sequence[Table],
    figures: dict[str, list[str]],
    check_table: Table | None,
    timing: Sequence[tuple[str, float]],
    seconds: float,
) -> str:
    """report.md: run summary, time per table, the message-level check and every table."""
    lines = [
        "# Section VII of esa-privacy-revisited, regenerated",
        "",
        f"`esa experiment {experiment}` with seed {config.seed}"
        + (
            " (--quick: reduced populations and grids)"
            if config.quick
            else " at the paper's population sizes"
        )
        + f"; {seconds:.1f} s in all.",
        "",
        "Reading the tables:",
        "",
        "- The ε_ℓ∞ and ε_ℓ1 columns follow from Theorem III.1 (exact form) and the rule "
        "sinh(ε_f) = sinh(ε_b)/τ; the fragment table lists every difference from the paper's "
        "printed values.",
        "- The paper's Gaussian σ is (ε_c, δ)-DP for sensitivity 1 only at the smallest ε_c; "
        "each Gaussian cell shows the δ it really gives and the exact analytic σ our RMSE uses.",
        "- Our RMSE is that of the unbiased estimate and sits at its theoretical standard error; "
        "the paper's RMSEs are often far below that theory (they look clipped to the pixel "
        "range), so 'norm-sub' (our consistency projection) is the fairer comparison with them.",
        "- The images and browser data of the paper are not public: populations are stand-ins "
        "at the paper's n and d (notes under each table).",
        "",
        "| Step | Seconds |",
        "|---|---|",
        *(f"| {name} | {step:.1f} |" for name, step in timing),
        "",
    ]
    if check_table is not None:
        lines.append(check_table.to_markdown())
    for table in tables:
        lines.append(table.to_markdown())
        for name in figures.get(table.key, []):
            lines += [f"![{name}]({name})", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------

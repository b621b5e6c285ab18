"""``report.html``: an analysis as one self-contained page a person can open.

``esa analyze`` writes ``OUTPUT/report.html`` and ``esa run`` ``OUTPUT/analysis/report.html``
(with the run's parameters and timings). The page needs nothing but itself: styles and a few
lines of script inline, histograms and longitudinal bands drawn as inline SVG, the analysis's
pictures (``pictures/*.png``) as ``data:`` URIs, and a Content-Security-Policy that forbids any
network request, so a page that tried one would fail loudly in the browser's console.

It shows, per crowd and window: ε_ℓ∞ and ε_ℓ1, ε_c from shuffling alone and with randomized
deletion composed in (basic composition, Theorem V.1 of esa-privacy-revisited), δ, the target,
the bound that gave ε_c, n (the fewest respondents any instance released: what ε_c is computed
for) beside n_eff (Σ_u π_u n_u: what the estimates are de-biased with), RMSE against the truth and
the estimator's standard error or, for longitudinal crowds, Theorem 6's error bound (labelled as
such); withheld crowds with their reasons (``pipelines.withheld_reasons``); the
counters (read = randomized + chaff + dead-lettered); histograms with ±1.96 s.e. error bars;
pictures; longitudinal estimates with their error band; the run's parameters.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["REPORT_FILE", "fmt", "render_report", "write_report"]

REPORT_FILE = "report.html"
MAX_TABLE_ROWS = 200  # crowds and windows in the privacy table
MAX_CHARTS = 12  # histograms, pictures and longitudinal charts each
MAX_BARS = 64  # buckets per histogram chart (the largest estimates beyond that)
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .6em;border:1px solid #ddd;
text-align:right;vertical-align:top}th{background:#f4f4f4}td.text,th.text{text-align:left}
.note{color:#555;font-size:.92em;max-width:60em}.figure{display:inline-block;margin:.5em 1em .5em 0}
.figure img{image-rendering:pixelated;max-width:560px;border:1px solid #ddd}
.bad{color:#a00;font-weight:bold}.good{color:#070}dl{display:grid;grid-template-columns:max-content auto;
gap:.2em 1em}dt{font-weight:bold}dd{margin:0}code{background:#f4f4f4;padding:0 .2em}
"""
# Counts the rendered rows: proves the page's script ran (tests read data-rendered).
_SCRIPT = """
document.addEventListener('DOMContentLoaded', function () {
  var rows = document.querySelectorAll('table.privacy tbody tr').length;
  document.body.setAttribute('data-rendered', String(rows));
});
"""


def fmt(value: Any, digits: int = 4) -> str:
    """How the page (and its test) writes a number: thousands separators for counts, 4
    significant digits otherwise, '-' for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and value > 99):
        return f"{int(value):,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        return f"{value:.{digits}g}"
    return str(value)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _day(ms: Any) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def _crowd(entry: Mapping[str, Any]) -> str:
    crowd = entry.get("crowd_id")
    return f"{entry.get('channel')} / {crowd}" if crowd else str(entry.get("channel"))


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], css: str = "") -> str:
    head = "".join(
        f'<th class="{"text" if i < 2 else ""}">{_e(h)}</th>' for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="{"text" if i < 2 else ""}">{cell}</td>' for i, cell in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return (
        f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


# -- sections -------------------------------------------------------------------------------------


def _privacy_rows(reports: Mapping[str, list[dict[str, Any]]], limit: int) -> list[list[str]]:
    rows = []
    for entry in (reports["histograms"] + reports["longitudinal"])[:limit]:
        privacy = entry.get("privacy", {})
        accuracy = entry.get("accuracy", {})
        longitudinal = entry.get("kind") == "longitudinal"
        shuffled = privacy.get("epsilon_central")
        total = privacy.get("epsilon_central_total", shuffled)
        with_deletion = fmt(total) if privacy.get("deletion") else "no deletion"
        if longitudinal:
            spread = f"bound {fmt(entry.get('error_bound'))}"
        else:
            spread = fmt(accuracy.get("stderr_rms"))
        rows.append(
            [
                _e(_crowd(entry) + (" (longitudinal f̃_t)" if longitudinal else "")),
                _e(_day(entry.get("window_start", entry.get("round_start")))),
                _e(fmt(privacy.get("epsilon_local_all"))),
                _e(fmt(privacy.get("epsilon_local_one"))),
                f'<b data-field="epsilon_central">{_e(fmt(shuffled))}</b>',
                _e(with_deletion),
                _e(fmt(privacy.get("delta_total", privacy.get("delta")))),
                _e(fmt(privacy.get("epsilon_central_target"))),
                _e(privacy.get("bound") or "-"),
                f'<span data-field="respondents">{_e(fmt(privacy.get("respondents")))}</span>',
                _e(fmt(privacy.get("respondents_effective"))),
                _e(fmt(accuracy.get("rmse"))),
                _e(spread),
            ]
        )
    return rows


_PRIVACY_HEADERS = (
    "crowd", "window", "ε_ℓ∞", "ε_ℓ1", "ε_c (shuffling)", "ε_c with deletion", "δ",
    "ε_c target", "bound", "n released", "n_eff", "RMSE", "s.e. (rms) or bound",
)  # fmt: skip
_PRIVACY_NOTES = """
<p class="note"><b>ε_ℓ∞ / ε_ℓ1</b>: the local guarantee against an adversary who sees all of a
respondent's report fragments / one of them (Theorem IV.1; equal without report fragmentation).
<b>ε_c (shuffling)</b>: the central guarantee the shuffled crowd buys, by the tightest valid
<b>bound</b>, computed for <b>n released</b>, the fewest respondents any shuffler instance released
in this crowd. <b>ε_c with deletion</b>: ε_c plus each instance's randomized-deletion ε_cr (Algorithm
3, basic composition), δ likewise. <b>n_eff</b> = Σ_u π_u n_u is the crowd the estimates are
de-biased with (routing weights π_u). <b>RMSE</b> compares the estimates with the simulation's truth;
<b>s.e. (rms)</b> is the estimator's own standard error (they should agree), and for longitudinal
crowds the column holds Theorem 6's error bound instead, as labelled. The results table printed by
<code>esa analyze</code> and <code>esa run</code> also shows <code>eps_c 1-msg</code>: Table X's
comparison, the guarantee if each whole report were one message (no attribute fragmentation).</p>
"""


def _withheld_section(
    reports: Mapping[str, list[dict[str, Any]]], summary: Mapping[str, Any], withheld: int
) -> str:
    from pipelines import withheld_reasons

    notes = withheld_reasons.explain_withheld_in(reports["withheld"][:MAX_TABLE_ROWS], summary)
    if not notes:
        return "<p>No crowd was withheld.</p>"
    rows = [
        [
            _e(_crowd(note)),
            _e(_day(note.get("window_start"))),
            _e(", ".join(map(str, note.get("withheld_by", [])))),
            _e("yes" if note.get("estimated") else "no"),
            f'<span class="text" data-field="reason">{_e(note["reason"])}</span>',
        ]
        for note in notes
    ]
    more = withheld - len(rows)
    return _table(
        ["crowd", "window", "withheld by instance", "estimated", "reason"], rows, "withheld"
    ) + (f"<p>… and {more:,} more in withheld.jsonl/</p>" if more > 0 else "")


def _counters_section(summary: Mapping[str, Any]) -> str:
    metrics = summary.get("metrics", {})
    read = metrics.get("read", 0)
    parts = {
        "randomized (opened and added)": metrics.get("messages", 0),
        "chaff (discarded)": metrics.get("chaff", 0),
        "dead-lettered": metrics.get("dead_lettered", 0),
    }
    adds_up = bool(metrics.get("adds_up"))
    verdict = (
        '<span class="good">adds up</span>'
        if adds_up
        else '<span class="bad">DOES NOT add up</span>'
    )
    terms = " + ".join(f"{_e(name)} <b>{fmt(int(v))}</b>" for name, v in parts.items())
    rejected = metrics.get("rejected_by_reason") or {}
    reasons = (
        "<p>Dead letters by reason: "
        + ", ".join(f"{_e(k)} {fmt(int(v))}" for k, v in sorted(rejected.items()))
        + "</p>"
        if rejected
        else ""
    )
    return (
        f'<p data-field="counters">messages read <b>{fmt(int(read))}</b> = {terms}: {verdict}</p>'
        + reasons
    )


def _read_table(path: Path, columns: Sequence[str]) -> pa.Table | None:
    if not path.exists():
        return None
    try:
        table = pq.read_table(str(path))
    except (OSError, pa.ArrowInvalid):
        return None
    present = [c for c in columns if c in table.column_names]
    return table.select(present) if table.num_rows else None


def _crowd_rows(table: pa.Table, entry: Mapping[str, Any], time_column: str) -> dict[str, Any]:
    """The columns of ``table``'s rows of ``entry``'s crowd and window (or round), in table
    order, picked by Arrow (a table of many crowds is never made Python values whole)."""
    start = entry.get("window_start", entry.get("round_start"))
    crowd = entry.get("crowd_id")
    times = pc.cast(pc.cast(table.column(time_column), pa.timestamp("ms")), pa.int64())
    masks = [
        pc.equal(table.column("channel"), entry.get("channel")),
        pc.equal(table.column("recipe_id"), entry.get("recipe_id")),
        pc.is_null(table.column("crowd"))
        if crowd is None
        else pc.equal(table.column("crowd"), crowd),
        pc.equal(times, int(start)),
    ]
    chosen = masks[0]
    for mask in masks[1:]:
        chosen = pc.and_(chosen, mask)
    return table.filter(pc.fill_null(chosen, False)).to_pydict()


def _svg_histogram(rows: Mapping[str, list[Any]], title: str) -> str:
    estimate = np.asarray(rows["estimate"], dtype=np.float64)
    stderr = np.nan_to_num(np.asarray(rows["stderr"], dtype=np.float64))
    buckets = np.asarray(rows["bucket"])
    truth = rows.get("truth")
    truth = (
        None if truth is None else np.asarray([np.nan if t is None else t for t in truth], float)
    )
    if estimate.size > MAX_BARS:  # the largest estimates, in bucket order
        keep = np.sort(np.argsort(-estimate, kind="stable")[:MAX_BARS])
        estimate, stderr, buckets = estimate[keep], stderr[keep], buckets[keep]
        truth = None if truth is None else truth[keep]
        title += f" (the {MAX_BARS} largest estimates)"
    width, height, pad = 640, 220, 30
    high = np.nanmax(
        np.concatenate(
            [estimate + 1.96 * stderr, [1.0]] + ([] if truth is None else [np.nan_to_num(truth)])
        )
    )
    low = min(0.0, float(np.nanmin(estimate - 1.96 * stderr)))
    span = high - low or 1.0

    def y(value: float) -> float:
        return pad + (height - 2 * pad) * (high - value) / span

    step = (width - 2 * pad) / max(estimate.size, 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{_e(title)}"><title>{_e(title)}</title>',
        f'<line x1="{pad}" x2="{width - pad}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#999"/>',
        f'<text x="{pad}" y="14" font-size="12">{_e(title)}</text>',
        f'<text x="2" y="{y(high) + 4:.1f}" font-size="10">{_e(fmt(float(high), 3))}</text>',
    ]
    for i, (value, error) in enumerate(zip(estimate.tolist(), stderr.tolist(), strict=True)):
        x = pad + i * step
        top, bottom = y(max(value, 0.0)), y(min(value, 0.0))
        parts.append(
            f'<rect x="{x + step * 0.15:.1f}" y="{top:.1f}" width="{step * 0.7:.1f}" '
            f'height="{max(bottom - top, 0.5):.1f}" fill="#4c78a8"><title>bucket '
            f"{int(buckets[i])}: {fmt(value)} ± {fmt(1.96 * error)}</title></rect>"
        )
        center = x + step / 2
        parts.append(
            f'<line x1="{center:.1f}" x2="{center:.1f}" y1="{y(value + 1.96 * error):.1f}" '
            f'y2="{y(value - 1.96 * error):.1f}" stroke="#222"/>'
        )
        if truth is not None and not math.isnan(truth[i]):
            parts.append(
                f'<circle cx="{center:.1f}" cy="{y(truth[i]):.1f}" r="2.5" fill="#e45756"/>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _svg_longitudinal(rows: Mapping[str, list[Any]], title: str) -> str:
    periods = np.asarray(rows["period"], dtype=np.int64)
    order = np.argsort(periods)
    periods = periods[order]
    estimate = np.asarray(rows["estimate"], dtype=np.float64)[order]
    bound = np.nan_to_num(np.asarray(rows["error_bound"], dtype=np.float64)[order])
    truth = rows.get("truth")
    truth = (
        None
        if truth is None
        else np.asarray([np.nan if t is None else t for t in truth], float)[order]
    )
    width, height, pad = 640, 220, 30
    values = [estimate + bound, estimate - bound] + (
        [] if truth is None else [np.nan_to_num(truth)]
    )
    high, low = (
        float(np.nanmax(np.concatenate(values))),
        min(0.0, float(np.nanmin(np.concatenate(values)))),
    )
    span = high - low or 1.0
    step = (width - 2 * pad) / max(periods.size - 1, 1)

    def xy(i: int, value: float) -> str:
        return f"{pad + i * step:.1f},{pad + (height - 2 * pad) * (high - value) / span:.1f}"

    band = [xy(i, v) for i, v in enumerate((estimate + bound).tolist())] + [
        xy(i, v) for i, v in reversed(list(enumerate((estimate - bound).tolist())))
    ]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{_e(title)}"><title>{_e(title)}</title>',
        f'<text x="{pad}" y="14" font-size="12">{_e(title)}</text>',
        f'<polygon points="{" ".join(band)}" fill="#4c78a8" fill-opacity="0.2"/>',
        '<polyline fill="none" stroke="#4c78a8" stroke-width="2" points="'
        + " ".join(xy(i, v) for i, v in enumerate(estimate.tolist()))
        + '"/>',
    ]
    if truth is not None and not np.all(np.isnan(truth)):
        parts.append(
            '<polyline fill="none" stroke="#e45756" stroke-dasharray="4 3" points="'
            + " ".join(xy(i, v) for i, v in enumerate(truth.tolist()) if not math.isnan(v))
            + '"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _charts(analysis: Path, reports: Mapping[str, list[dict[str, Any]]]) -> tuple[str, str]:
    histograms = _read_table(
        analysis / "histograms.parquet",
        ["window_start", "channel", "recipe_id", "crowd", "bucket", "estimate", "stderr", "truth"],
    )
    charts = []
    if histograms is not None:
        for entry in reports["histograms"][:MAX_CHARTS]:
            rows = _crowd_rows(histograms, entry, "window_start")
            if rows["estimate"]:
                title = f"{_crowd(entry)}, {_day(entry['window_start'])}"
                charts.append(f'<div class="figure">{_svg_histogram(rows, title)}</div>')
    longitudinal = _read_table(
        analysis / "longitudinal.parquet",
        [
            "round_start",
            "channel",
            "recipe_id",
            "crowd",
            "period",
            "estimate",
            "error_bound",
            "truth",
        ],
    )
    bands = []
    if longitudinal is not None:
        for entry in reports["longitudinal"][:MAX_CHARTS]:
            rows = _crowd_rows(longitudinal, entry, "round_start")
            if rows["estimate"]:
                title = f"{_crowd(entry)}, round of {_day(entry['round_start'])}"
                bands.append(f'<div class="figure">{_svg_longitudinal(rows, title)}</div>')
    return "".join(charts), "".join(bands)


def _pictures(analysis: Path) -> str:
    figures = []
    for path in sorted((analysis / "pictures").glob("*.png"))[:MAX_CHARTS]:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        figures.append(
            f'<div class="figure"><img alt="{_e(path.name)}" src="data:image/png;base64,{data}">'
            f"<br><small>{_e(path.name)}</small></div>"
        )
    return "".join(figures) or "<p>No pictures.</p>"


def _parameters(summary: Mapping[str, Any], run: Mapping[str, Any] | None) -> str:
    items: list[tuple[str, Any]] = []
    if run:
        for key in ("recipe", "population", "seed", "respondents", "messages", "instances"):
            items.append((key, run.get(key)))
        seconds = run.get("seconds", {})
        items.append(("seconds", ", ".join(f"{k} {v}" for k, v in seconds.items())))
    inputs = summary.get("inputs", {})
    items.append(("recipes", ", ".join(inputs.get("recipes", []))))
    for release in inputs.get("releases", []):
        deletion = release.get("deletion")
        items.append(
            (
                f"shuffler instance {release.get('instance')}",
                f"crowd threshold {fmt(release.get('crowd_threshold'))}, "
                + ("no deletion" if not deletion else f"deletion {json.dumps(deletion)}")
                + f", {fmt(release.get('records_released'))} messages released",
            )
        )
    items.append(("commit records", inputs.get("commit_records", "-")))
    items.append(("post-processing", inputs.get("postprocessing", "-")))
    items.append(("truth", ", ".join(inputs.get("truth", [])) or "none"))
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(fmt(v))}</dd>" for k, v in items) + "</dl>"


def _totals(summary: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(histogram reports, longitudinal reports, withheld notes) as summary.json counts them;
    None where it does not."""
    reports, withheld = summary.get("reports"), summary.get("withheld")
    if not isinstance(reports, Mapping) or not isinstance(withheld, Mapping):
        return None
    counts = (reports.get("histograms"), reports.get("longitudinal"), withheld.get("crowds"))
    if not all(type(count) is int and count >= 0 for count in counts):
        return None
    histograms, longitudinal, withheld_notes = counts
    return histograms, longitudinal, withheld_notes


def render_report(
    analysis_dir: str | os.PathLike[str], run: Mapping[str, Any] | None = None
) -> str:
    """The page for the analysis in ``analysis_dir`` (``esa analyze``'s output), with ``run``
    (``esa run``'s run.json) when given."""
    from transforms.analyzer.report_files import read_reports

    analysis = Path(analysis_dir)
    summary = json.loads((analysis / "summary.json").read_text())
    totals = _totals(summary)
    # The first parts holding the rows shown, when summary.json counts the rest (as it does):
    # an analysis of many crowds is not read whole to show a few hundred of them.
    reports = read_reports(str(analysis), MAX_TABLE_ROWS if totals else None)
    if totals is None:
        totals = tuple(len(reports[name]) for name in ("histograms", "longitudinal", "withheld"))
    estimated, longitudinal, withheld = totals
    shown = _privacy_rows(reports, MAX_TABLE_ROWS)
    more = estimated + longitudinal - len(shown)
    histograms, bands = _charts(analysis, reports)
    title = "ESA analysis: " + (", ".join(summary.get("inputs", {}).get("recipes", [])) or "-")
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="note">{_e(analysis)} · {estimated:,} histogram and '
        f"{longitudinal:,} longitudinal crowd windows estimated, {withheld:,} withheld.</p>",
        "<h2>Privacy and accuracy per crowd and window</h2>",
        _table(_PRIVACY_HEADERS, shown, "privacy") if shown else "<p>No crowd was estimated.</p>",
        f"<p>… and {more:,} more in reports.jsonl/</p>" if more > 0 else "",
        _PRIVACY_NOTES,
        "<h2>Withheld crowds</h2>",
        _withheld_section(reports, summary, withheld),
        "<h2>Counters</h2>",
        _counters_section(summary),
        "<h2>Histograms</h2>",
        '<p class="note">Bars: unbiased estimates; whiskers: ±1.96 standard errors; red dots: '
        "the simulation's truth.</p>",
        histograms or "<p>No histogram crowds.</p>",
        "<h2>Pictures</h2>",
        _pictures(analysis),
        "<h2>Longitudinal estimates</h2>",
        '<p class="note">Line: f̃_t per period; band: ± the error bound; dashed: the truth.</p>',
        bands or "<p>No longitudinal crowds.</p>",
        "<h2>Parameters</h2>",
        _parameters(summary, run),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style><script>{_SCRIPT}</script>"
        f"</head><body>{''.join(body)}</body></html>\n"
    )


def write_report(
    analysis_dir: str | os.PathLike[str],
    run: Mapping[str, Any] | None = None,
    path: str | os.PathLike[str] | None = None,
) -> str:
    """Write :func:`render_report` to ``path`` (default ``analysis_dir/report.html``),
    atomically; returns the path."""
    target = Path(path) if path is not None else Path(analysis_dir) / REPORT_FILE
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(render_report(analysis_dir, run), encoding="utf-8")
    os.replace(temporary, target)
    return str(target)

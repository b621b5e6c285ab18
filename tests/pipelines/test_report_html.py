"""report.html: one self-contained page per analysis, opened in headless Chromium (Debian's
``chromium``, scripts/install_chromium.sh): it renders without console errors, requests nothing
from the network (its Content-Security-Policy would refuse it, loudly) and shows the run's numbers,
withheld crowds with their reasons and the counters (issue 27)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipelines import report_html
from pipelines.commandline.main import main
from transforms.analyzer.report_files import read_reports

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: run scripts/install_chromium.sh (Debian's chromium package)",
)


def open_in_chromium(page: Path) -> tuple[str, list[str]]:
    """The rendered DOM and the console messages of ``page`` in headless Chromium."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


@pytest.fixture(scope="module")
def crowded_run(tmp_path_factory):
    """esa run on the small symmetric one-hot recipe over four natural crowds of 6,000
    respondents (sizes ∝ rank^-1.5: about 3,590, 1,270, 690 and 450): one crowd reaches the
    recipe's minimum crowd of 2,000, three are withheld."""
    output = tmp_path_factory.mktemp("report") / "run"
    flags = ["--recipe", "small_symmetric_one_hot", "--output", str(output), "--seed", "5",
             "--population", "zipf,crowds=4,crowd_exponent=1.5,crowd_name=region",
             "--respondents", "6000", "--runner=FnApiRunner"]  # fmt: skip
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", *flags]) == 0
    return output, printed.getvalue()


@pytest.mark.slow
def test_withheld_crowds_state_their_reason_in_table_and_report(crowded_run):
    output, printed = crowded_run
    reports = read_reports(str(output / "analysis"))
    assert [r["crowd_id"] for r in reports["histograms"]] == ["region-0"]
    assert sorted(n["crowd_id"] for n in reports["withheld"]) == [
        "region-1", "region-2", "region-3",
    ]  # fmt: skip
    reason = "instances 0, 1: fewer than 2,000 distinct respondents, the devices' demand"
    assert printed.count(reason) == 3
    page = (output / "analysis" / "report.html").read_text()
    assert page.count(html.escape(reason)) == 3
    run = json.loads((output / "run.json").read_text())
    assert run["paths"]["report"] == str(output / "analysis" / "report.html")
    summary = json.loads((output / "analysis" / "summary.json").read_text())
    ((text, count),) = summary["withheld"]["reasons"].items()  # in the summary too, counted
    assert text.startswith(reason) and count == 3
    # Self-contained: every src/href is a data: URI; nothing else is loaded.
    assert not [u for u in re.findall(r'(?:src|href)="([^"]*)"', page) if not u.startswith("data:")]
    assert "data:image/png;base64," in page  # the analysis's picture, inlined


@pytest.mark.slow
@needs_chromium
def test_report_renders_in_chromium_with_the_runs_numbers(crowded_run):
    output, _ = crowded_run
    dom, console = open_in_chromium(output / "analysis" / "report.html")
    assert console == []
    reports = read_reports(str(output / "analysis"))
    assert f'data-rendered="{len(reports["histograms"])}"' in dom
    for report in reports["histograms"]:
        privacy = report["privacy"]
        assert f'data-field="epsilon_central">{report_html.fmt(privacy["epsilon_central"])}<' in dom
        assert f'data-field="respondents">{report_html.fmt(privacy["respondents"])}<' in dom
        assert report_html.fmt(privacy["respondents_effective"]) in dom
        assert "accuracy" not in report  # the truth is not split by crowd: no RMSE to show
    summary = json.loads((output / "analysis" / "summary.json").read_text())
    read = summary["metrics"]["read"]
    assert f"messages read <b>{report_html.fmt(read)}</b>" in dom
    assert "adds up" in dom
    assert dom.count("<svg") >= 1  # the histogram with its error bars
    assert "small_symmetric_one_hot@1" in dom and "region-0" in dom


@needs_chromium
def test_the_browser_check_sees_console_errors_and_network_requests(tmp_path):
    """The harness itself: a page that logs an error and loads a remote image is caught."""
    page = tmp_path / "bad.html"
    csp = report_html._CSP
    page.write_text(
        f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="{csp}">'
        '</head><body><img src="http://example.invalid/x.png">'
        "<script>console.error('boom')</script></body></html>"
    )
    _, console = open_in_chromium(page)
    assert any("Content Security Policy" in line for line in console)
    assert any("boom" in line for line in console)


def _crowd_rows_by_python(table, entry, time_column):
    """The rows of ``entry``'s crowd and window as the page picked them before: the whole table
    as Python values, compared row by row."""
    data = table.to_pydict()
    start = entry.get("window_start", entry.get("round_start"))
    rows = [
        i
        for i in range(table.num_rows)
        if data["channel"][i] == entry.get("channel")
        and data["crowd"][i] == entry.get("crowd_id")
        and data["recipe_id"][i] == entry.get("recipe_id")
        and int(data[time_column][i].timestamp() * 1000) == int(start)
    ]
    return {name: [values[i] for i in rows] for name, values in data.items()}


def test_a_chart_takes_its_crowd_s_rows_as_a_row_by_row_pick_would():
    import pyarrow as pa

    day = 86_400_000
    crowds = [None, "a", "b", None, "a"]
    starts = [0, 0, day, day, day]
    channels = ["c", "c", "c", "c", "d"]
    table = pa.table(
        {
            "window_start": pa.array(
                [s for s in starts for _ in range(3)], pa.timestamp("ms", tz="UTC")
            ),
            "channel": [c for c in channels for _ in range(3)],
            "recipe_id": ["r@1"] * 15,
            "crowd": [c for c in crowds for _ in range(3)],
            "bucket": list(range(3)) * 5,
            "estimate": [float(i) for i in range(15)],
        }
    )
    entries = [
        {"channel": channel, "recipe_id": "r@1", "crowd_id": crowd, "window_start": start}
        for channel, crowd, start in zip(channels, crowds, starts, strict=True)
    ] + [{"channel": "c", "recipe_id": "r@1", "crowd_id": "z", "window_start": 0}]
    for entry in entries:
        picked = report_html._crowd_rows(table, entry, "window_start")
        assert picked == _crowd_rows_by_python(table, entry, "window_start")
    assert len(report_html._crowd_rows(table, entries[3], "window_start")["bucket"]) == 3
    assert report_html._crowd_rows(table, entries[-1], "window_start")["bucket"] == []


@pytest.mark.slow
def test_the_page_of_many_crowds_reads_the_parts_it_shows_and_counts_from_the_summary(
    tmp_path, monkeypatch
):
    from benchmarks import bench_crowds
    from transforms.analyzer import report_files

    crowds = bench_crowds.measure(tmp_path, 2 * report_html.MAX_TABLE_ROWS)["analyze"]["crowds"]
    analysis = tmp_path / "analysis"
    summary = json.loads((analysis / "summary.json").read_text())
    assert summary["reports"]["histograms"] == crowds > report_html.MAX_TABLE_ROWS
    limits = []
    read = report_files.read_json_parts

    def read_json_parts(directory, limit=None):
        limits.append(limit)
        return read(directory, limit)

    monkeypatch.setattr(report_files, "read_json_parts", read_json_parts)
    page = report_html.render_report(str(analysis))
    assert limits == [report_html.MAX_TABLE_ROWS] * 2  # reports and withheld notes
    table = page.split('<table class="privacy">', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == report_html.MAX_TABLE_ROWS + 1  # the head's row too
    assert f"… and {crowds - report_html.MAX_TABLE_ROWS:,} more in reports.jsonl/" in page
    assert f"{crowds:,} histogram and 0 longitudinal crowd windows estimated" in page
    assert page.count("<svg") == report_html.MAX_CHARTS


def test_the_page_takes_its_totals_from_the_summary_only_when_it_counts_them():
    counted = {"reports": {"histograms": 3, "longitudinal": 0}, "withheld": {"crowds": 1}}
    assert report_html._totals(counted) == (3, 0, 1)
    for broken in (
        {},
        {"reports": {"histograms": 3, "longitudinal": 0}},
        {"reports": {"histograms": 3, "longitudinal": 0}, "withheld": {"crowds": True}},
        {"reports": {"histograms": -1, "longitudinal": 0}, "withheld": {"crowds": 1}},
        {"reports": {"histograms": "3", "longitudinal": 0}, "withheld": {"crowds": 1}},
    ):
        assert report_html._totals(broken) is None  # then every report is read and counted

"""Hostile inputs at the edges (issue #11): event times whose window would end past what Avro
timestamps hold, and analyzer outputs placed inside a release. Each ends in one error line with
exit status 2, a dead letter with a reason, or a correct result; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro
import pytest

from pipelines.commandline import main as cli
from schemas.release import commit as rel
from tests.transforms import report_factory as rf
from transforms.shuffler.report_rows import MAX_EVENT_TIME_MS, latest_event_time_ms

DAY_MS = 86_400_000
LAST_DAY_MS = (MAX_EVENT_TIME_MS // DAY_MS) * DAY_MS  # 9999-12-31T00:00Z


@pytest.fixture
def recipe(tmp_path: Path) -> str:
    return rf.write_recipe(tmp_path, "edge_test", min_crowd_size=3)[0]


def _fields(recipe: str) -> dict[str, str]:
    return {"recipe_id": "edge_test@1", "channel": json.loads(Path(recipe).read_text())["channel"]}


@pytest.mark.parametrize(
    ("window_ms", "latest"),
    [
        (None, MAX_EVENT_TIME_MS),
        (1, MAX_EVENT_TIME_MS - 1),  # the window [MAX, MAX + 1) would end past year 9999
        (DAY_MS, LAST_DAY_MS - 1),  # the last day of 9999 would end at 10000-01-01
        (MAX_EVENT_TIME_MS, MAX_EVENT_TIME_MS - 1),
    ],
)
def test_latest_event_time_keeps_the_window_end_readable(window_ms, latest) -> None:
    assert latest_event_time_ms(window_ms) == latest
    if window_ms:
        assert latest // window_ms * window_ms + window_ms <= MAX_EVENT_TIME_MS
        assert (latest + 1) // window_ms * window_ms + window_ms > MAX_EVENT_TIME_MS


def test_reports_in_the_last_day_of_9999_are_dead_lettered_not_a_crash(
    tmp_path: Path, recipe: str
) -> None:
    fields = _fields(recipe)
    reports = tmp_path / "reports"
    reports.mkdir()
    rf.write_reports(reports / "ok.avro", rf.crowd(5, 1, **fields))
    late = rf.crowd(5, 1, prefix="late", event_time=LAST_DAY_MS + 3_600_000, **fields)
    rf.write_reports(reports / "late.avro", late)
    output = tmp_path / "release"
    argv = ["shuffle", "--input", str(reports / "*.avro"), "--output", str(output)]
    assert cli.main([*argv, "--recipe", recipe, "--crowd-threshold", "3"]) == 0
    metrics = json.loads((tmp_path / "release.private" / "metrics.json").read_text())
    assert metrics["adds_up"] and metrics["rejected_by_reason"] == {"event_time_out_of_range": 5}
    verified = rel.verify_release(str(output))
    for path in verified.files:  # every window end is a timestamp a standard reader decodes
        with open(path, "rb") as handle:
            assert all(record["window_end"].year <= 9999 for record in fastavro.reader(handle))
    manifests = []  # every manifest file decodes (its window_end included)
    for path in (tmp_path / "release.private").rglob("manifest*/**/*.avro"):
        with open(path, "rb") as handle:
            manifests.extend(fastavro.reader(handle))
    assert len(manifests) == 1 and manifests[0]["window_end"].year <= 9999


def test_simulate_refuses_a_last_window_ending_in_year_10000(tmp_path: Path, capsys) -> None:
    argv = ["simulate", "--output", str(tmp_path / "sim"), "--respondents", "10"]
    assert cli.main([*argv, "--start", "9999-12-31", "--no-device-budget"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "year 9999" in err[0]
    assert not (tmp_path / "sim").exists()


def test_an_unreadable_input_fails_adds_up_with_one_line_and_a_dead_letter(
    tmp_path: Path, recipe: str, capsys
) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    rf.write_reports(reports / "ok.avro", rf.crowd(5, 1, **_fields(recipe)))
    (reports / "text.avro").write_text("not an Avro file\n")
    output = tmp_path / "release"
    argv = ["shuffle", "--input", str(reports / "*.avro"), "--output", str(output)]
    assert cli.main([*argv, "--recipe", recipe, "--crowd-threshold", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not add up" in err[0] and "unreadable_file" in err[0]
    assert list((tmp_path / "release.private" / "dead_letter").glob("*.avro"))

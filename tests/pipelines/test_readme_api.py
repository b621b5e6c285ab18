"""The README's Python API example runs as written (extracted from README.md, executed in a fresh
directory), so it cannot go stale; Results read the analysis as Arrow tables and pandas."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from pipelines import api

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_api_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md's Python API section has no python code block"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_api_example(), "README.md (Python API)", "exec"), namespace)
    results = namespace["results"]
    assert isinstance(results, api.Results)
    reports = results.reports()
    assert isinstance(reports, pa.Table)
    # zipf,crowds=3 over 5,000 respondents: sizes 2,727, 1,364 and 909; only the first reaches
    # the recipe's minimum crowd of 2,000.
    assert reports.column("crowd_id").to_pylist() == ["crowd-0"]
    assert reports.column("respondents").to_pylist() == [2727]
    withheld = results.withheld()
    assert withheld.column("crowd_id").to_pylist() == ["crowd-1", "crowd-2"]
    assert all("fewer than 2,000" in reason for reason in withheld.column("reason").to_pylist())
    frame = namespace["frame"]
    assert list(frame["bucket"]) == [0, 1]
    assert results.report_html.is_file()
    assert "crowd-0" in capsys.readouterr().out


def test_results_refuse_a_folder_without_an_analysis(tmp_path):
    with pytest.raises(ValueError, match="no analysis here"):
        api.open_results(tmp_path)


def test_api_flags_are_checked_like_the_command_line(tmp_path):
    with pytest.raises(ValueError, match="esa run: unknown argument 'crowd_treshold'"):
        api.run("small_binary_rr", output=tmp_path / "out", crowd_treshold=5)
    with pytest.raises(ValueError, match="--respondents"):
        api.run("small_binary_rr", output=tmp_path / "out", respondents=0)

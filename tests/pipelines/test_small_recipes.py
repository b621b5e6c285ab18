"""Every small recipe (schemas/recipes/small_*.json) releases end to end through esa run's three
stages at its minimum crowd: sealed, signed, every crowd released, counters adding up, ε_c stated
and within the recipe's target (issue 27)."""

from __future__ import annotations

import json

import pytest

from pipelines.commandline.main import main
from schemas.recipes import load_recipe, recipe_names
from transforms.analyzer.report_files import read_reports

pytestmark = pytest.mark.slow

SMALL = [name for name in recipe_names() if name.startswith("small_")]


@pytest.mark.parametrize("name", SMALL)
def test_small_recipe_releases_end_to_end(name, tmp_path, capsys):
    recipe = load_recipe(name)
    output = tmp_path / "run"
    flags = ["--recipe", name, "--output", str(output), "--seed", "11"]
    flags += ["--respondents", str(recipe.min_crowd_size), "--runner=FnApiRunner"]
    assert main(["run", *flags]) == 0
    printed = capsys.readouterr().out
    run = json.loads((output / "run.json").read_text())
    assert run["adds_up"] and run["respondents"] == recipe.min_crowd_size
    reports = read_reports(run["paths"]["analysis"])
    assert reports["withheld"] == []
    estimated = reports["histograms"] + reports["longitudinal"]
    assert estimated, printed
    for report in estimated:
        privacy = report["privacy"]
        assert privacy["respondents"] == recipe.min_crowd_size
        assert privacy["epsilon_central"] is not None
        assert privacy["epsilon_central"] <= recipe.epsilon_central_target + 1e-9
    assert "report: " not in printed or (output / "analysis" / "report.html").exists()
    assert (output / "analysis" / "report.html").exists()

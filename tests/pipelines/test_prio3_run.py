"""esa run with a prio3 recipe: devices -> shuffler -> two aggregators -> analyzer, end to end."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipelines.commandline.main import main
from tests.transforms.aggregators.test_shares import small_recipe

pytestmark = pytest.mark.slow  # seven Beam pipelines (about 40 s)


def test_esa_run_with_a_prio3_recipe_estimates_within_its_standard_errors(tmp_path, capsys):
    recipe = small_recipe(domain=16, min_crowd=300)
    path = tmp_path / "recipe.json"
    path.write_text(recipe.to_json())
    output = tmp_path / "run"
    status = main(
        ["run", "--recipe", str(path), "--respondents", "400", "--population", "image:disc",
         "--seed", "3", "--output", str(output)]
    )  # fmt: skip
    assert status == 0, capsys.readouterr().err
    result = json.loads((output / "run.json").read_text())
    assert result["aggregation"] == "prio3" and result["adds_up"]
    finish = [phase for phase in result["aggregators"] if phase["phase"] == "finish"]
    assert [phase["reports_published"] for phase in finish] == [400, 400]
    summary = json.loads((output / "analysis" / "summary.json").read_text())
    assert summary["signed"]  # both aggregate records carried their aggregator's signature
    (crowd,) = summary["crowds"]
    assert crowd["n"] == 400 and crowd["truth_respondents"] == 400
    # 16 buckets: the RMS of (estimate - truth) / stderr is 1 give or take about 0.18 (sd of a
    # chi with 16 degrees of freedom / 4); 0.4 .. 1.8 fails a correct run with probability
    # below 1e-3.
    assert 0.4 < crowd["rms_z"] < 1.8
    assert crowd["privacy"]["respondents"] == 400
    table = pq.read_table(output / "analysis" / "histograms.parquet")
    assert table.num_rows == 16 and set(table.column("n").to_pylist()) == {400}
    # Each aggregator's verification state is gone; only the sealed sums were published.
    for directory in result["paths"]["aggregators"]:
        assert not (output / directory / "private" / "states").exists()
    assert "n = 400 valid reports" in capsys.readouterr().out

"""``esa experiment``: a smoke run on the reduced (``--quick``) configuration."""

from __future__ import annotations

import csv
import re

import pytest
from PIL import Image

from experiments import check
from experiments.lab import ExperimentLab
from experiments.scenarios import ExperimentConfig
from experiments.tables import EXPERIMENT_TABLES
from pipelines.commandline import main as cli

EXPECTED_TABLES = {
    "heavy-hitters": ["table_01_heavy_hitters"],
    "images": ["table_04_horse", "table_08_map", "table_09_child", "table_03_overview"],
    "sketch": ["table_05_sketch"],
    "budget-split": ["table_06_runs", "table_07_hash_functions"],
    "fragments": ["fragment_epsilons", "table_10_attribute_fragments"],
}


def _run(tmp_path, *args: str) -> int:
    return cli.main(["experiment", *args, "--output", str(tmp_path), "--quick", "--workers", "1"])


def test_quick_all_writes_every_table_figure_and_the_report(tmp_path, capsys):
    assert _run(tmp_path, "all", "--no-pipeline-check") == 0
    out = capsys.readouterr().out
    assert "Table I:" in out and "total:" in out
    for slugs in EXPECTED_TABLES.values():
        for slug in slugs:
            with open(tmp_path / f"{slug}.csv", newline="") as handle:
                rows = list(csv.DictReader(handle))
            assert rows, slug
            assert {"table", "dataset"} <= set(rows[0])
            markdown = (tmp_path / f"{slug}.md").read_text()
            assert markdown.startswith("## Table ")
            assert "seed" in markdown.lower()
    # RMSE columns are numbers, and the exact simulator sits at theory even at this size
    # (the reduced populations have d >= 1,800 values: the RMSE's spread is a few per cent).
    with open(tmp_path / "table_04_horse.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            ratio = float(row["rmse_over_theory"])
            assert 0.85 < ratio < 1.15, row["scenario"]
    pictures = sorted(tmp_path.glob("*.png"))
    assert {p.name for p in pictures} >= {
        "table_01_heavy_hitters.png",
        "table_03_reconstructions.png",
        "table_04_horse.png",
        "table_05_sketch.png",
        "table_06_runs.png",
        "table_07_hash_functions.png",
        "table_08_map.png",
        "table_09_child.png",
    }
    for picture in pictures:
        with Image.open(picture) as image:
            image.verify()
            assert image.format == "PNG"
    report = (tmp_path / "report.md").read_text()
    linked = set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report))
    assert linked == {p.name for p in pictures}
    for key in EXPERIMENT_TABLES["all"]:
        assert f"## Table {key}:" in report
    with open(tmp_path / "timing.csv", newline="") as handle:
        timing = list(csv.DictReader(handle))
    assert [row["step"] for row in timing] == [f"Table {k}" for k in EXPERIMENT_TABLES["all"]]
    assert all(float(row["seconds"]) >= 0 for row in timing)


def test_one_experiment_writes_only_its_tables(tmp_path):
    assert _run(tmp_path, "fragments", "--no-pipeline-check", "--no-pictures") == 0
    written = {p.stem for p in tmp_path.glob("*.csv")} - {"timing"}
    assert written == set(EXPECTED_TABLES["fragments"])
    assert not list(tmp_path.glob("*.png"))


def test_unknown_experiment_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["experiment", "everything", "--output", str(tmp_path)])
    assert exit_info.value.code == 2


def test_bad_workers_are_refused(tmp_path, capsys):
    assert cli.main(["experiment", "all", "--output", str(tmp_path), "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err


@pytest.mark.slow
def test_message_level_check_agrees_with_the_exact_simulator(tmp_path):
    # One Beam run (simulate -> shuffle -> analyze) on a reduced heavy-hitter population.
    assert _run(tmp_path, "heavy-hitters", "--no-pictures", "--check-respondents", "5000") == 0
    with open(tmp_path / "pipeline_check.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["table"] for row in rows] == ["I"]
    row = rows[0]
    # The row's verdict is |difference| < 4 sigma (a false alarm about once in 16,000 runs).
    assert row["agrees"] == "True", row
    message, exact = float(row["rmse_message_level"]), float(row["rmse_exact_simulator"])
    assert message > 0 and exact > 0
    assert int(row["messages"]) > 0
    assert "## Table check:" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("quick", [True, False])
def test_check_recipes_are_valid_recipes_for_every_case(quick):
    from schemas.recipes import recipe_from_dict

    config = ExperimentConfig.quick_config() if quick else ExperimentConfig()
    lab = ExperimentLab(config)
    cases = check.check_cases(config)
    assert set(cases) == {"I", "III", "IV", "V", "VI", "VII", "VIII", "IX"}
    for key, (scenario, shape) in cases.items():
        privacy = lab.privacy(scenario)
        small = check.reduced_dataset(lab.dataset(scenario.dataset), shape, 5000)
        data = check.check_recipe(f"check-{key.lower()}", scenario, privacy, small, config, 5000)
        recipe = recipe_from_dict(data)  # validates parameters and the stated epsilon_local
        randomizer = recipe.build_randomizer()
        assert randomizer.epsilon_local == pytest.approx(
            privacy.epsilon_all if scenario.splits == 1 else privacy.epsilon_per_split, abs=1e-6
        )

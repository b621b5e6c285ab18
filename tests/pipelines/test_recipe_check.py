"""``esa recipes list`` and ``esa recipes check``: every recipe states its minimum crowd and the
smallest population that releases; a crowd's verdict and its reason come before any run, and a
withheld crowd's note names the threshold it missed and what set it (issue 27)."""

from __future__ import annotations

import json

import pytest

from pipelines import recipe_check
from pipelines.commandline.main import main
from schemas.recipes import load_recipe, recipe_from_dict, recipe_names
from transforms.shuffler.config import ShuffleConfig

SMALL = [name for name in recipe_names() if name.startswith("small_")]


def test_every_randomizer_has_a_small_recipe():
    from privacy.randomizers import RANDOMIZERS

    covered = {load_recipe(name).randomizer for name in SMALL}
    assert covered == set(RANDOMIZERS)


def test_the_default_threshold_is_the_shufflers():
    assert recipe_check.DEFAULT_CROWD_THRESHOLD == ShuffleConfig.crowd_threshold


@pytest.mark.parametrize("name", SMALL)
def test_a_small_recipe_releases_at_its_default_size_and_not_below_its_minimum(name):
    recipe = load_recipe(name)
    assert recipe.default_respondents is not None
    released = recipe_check.outlook(recipe, recipe.default_respondents)
    assert released.released, released.reason
    assert released.refusal is None
    assert released.epsilon_central is not None
    smallest = recipe_check.smallest_releasing_population(recipe)
    assert smallest == recipe.min_crowd_size <= recipe.default_respondents
    assert recipe_check.outlook(recipe, smallest).released
    below = recipe_check.outlook(recipe, smallest - 1)
    assert not below.released
    assert f"fewer than the threshold T = {smallest:,}" in below.reason
    assert "devices' demand" in below.threshold_reason


def test_the_shuffler_threshold_is_named_when_it_is_the_larger():
    recipe = load_recipe("small_binary_rr")
    verdict = recipe_check.outlook(recipe, 2500, crowd_threshold=3000)
    assert not verdict.released
    assert verdict.threshold == 3000
    assert "--crowd-threshold 3,000" in verdict.threshold_reason


def test_deletion_needs_the_offset_above_the_threshold():
    recipe = load_recipe("small_binary_rr")
    verdict = recipe_check.outlook(recipe, 2010, deletion=(1.0, 1e-6))
    assert verdict.deletion_offset == 30  # ceil((2 / 1) ln(2 / 1e-6)) = ceil(29.02)
    assert not verdict.released
    assert "randomized deletion" in verdict.reason
    assert recipe_check.outlook(recipe, 2030, deletion=(1.0, 1e-6)).released


def test_a_recipe_devices_refuse_is_withheld_with_the_devices_reason():
    data = load_recipe("small_symmetric_one_hot").to_dict()
    data.update(name="too_ambitious", epsilon_central_target=0.1)  # 0.548 at 2,000 respondents
    recipe = recipe_from_dict(data)
    verdict = recipe_check.outlook(recipe, 100_000)
    assert not verdict.released
    assert "every device refuses" in verdict.reason
    assert "cohort_guarantee_not_met" in verdict.reason


def test_recipes_list_shows_minimum_crowds_and_sizes(capsys):
    assert main(["recipes", "list"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert "min crowd" in header and "releases from" in header and "eps_c target" in header
    by_name = {row.split()[0]: row for row in rows}
    assert set(recipe_names()) <= set(by_name)
    assert "100,000" in by_name["image_grid_onehot"]
    assert main(["recipes", "list", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    small = {line["name"]: line for line in lines}["small_longitudinal"]
    assert small["min_crowd_size"] == 2000 == small["smallest_releasing_population"]
    assert small["default_respondents"] == 5000


def test_recipes_check_exits_0_released_1_withheld_2_bad_input(capsys):
    assert main(["recipes", "check", "small_longitudinal", "--respondents", "5000"]) == 0
    assert "released" in capsys.readouterr().out
    assert main(["recipes", "check", "image_grid_onehot", "--respondents", "5000"]) == 1
    out = capsys.readouterr().out
    assert "withheld" in out and "fewer than the threshold T = 100,000" in out
    assert main(["recipes", "check", "small_binary_rr", "--respondents", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["esa recipes: error: --respondents must be >= 1, got 0"]
    assert main(["recipes", "check", "no_such_recipe", "--respondents", "5"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_withheld_notes_get_a_reason():
    recipe = load_recipe("small_binary_rr")
    notes = [{"recipe_id": recipe.id, "withheld_by": [0, 1], "note": "no estimate"}]
    releases = [
        {"instance": 0, "crowd_threshold": 100, "deletion": None},
        {"instance": 1, "crowd_threshold": 5000, "deletion": {"epsilon": 1.0, "delta": 1e-6}},
    ]
    (explained,) = recipe_check.explain_withheld(notes, releases, {recipe.id: recipe})
    first, second = explained["reason"].split("; ")
    assert first.startswith("instance 0: fewer than 2,000 distinct respondents, the devices'")
    assert second.startswith("instance 1: fewer than 5,000 distinct respondents, the shuffler's")
    assert "randomized deletion" in second
    same = [dict(release, crowd_threshold=100, deletion=None) for release in releases]
    (explained,) = recipe_check.explain_withheld(notes, same, {recipe.id: recipe})
    assert explained["reason"].startswith("instances 0, 1: fewer than 2,000 distinct")
    (unknown,) = recipe_check.explain_withheld(notes, same, {})
    assert "fewer distinct respondents than its threshold" in unknown["reason"]


@pytest.mark.parametrize("name", SMALL)
def test_the_analyzers_epsilon_at_the_minimum_crowd_meets_the_target(name):
    """What the analyzer will state for the smallest crowd a small recipe releases stays within
    the recipe's central target (not only the devices' own check of it)."""
    recipe = load_recipe(name)
    verdict = recipe_check.outlook(recipe, recipe.min_crowd_size)
    assert verdict.epsilon_central <= recipe.epsilon_central_target

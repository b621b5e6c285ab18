"""The devices' Check 3 charges exactly the ε_c the analyzer states (samplable-anonymous-
aggregation §4.3): a device that computed a smaller cohort epsilon than the analyzer reports
would admit a query its budget cannot pay for."""

from __future__ import annotations

import math

import pytest

from schemas.recipes import load_recipe, recipe_names
from simulators.fleet import recipe_cohort_bound
from transforms.analyzer.arithmetic.report import privacy_summary

RECIPES = [
    name
    for name in recipe_names()
    if not getattr(load_recipe(name).build_randomizer(), "central_epsilon", None)
    and load_recipe(name).aggregation != "prio3"
]


@pytest.mark.parametrize("name", RECIPES)
def test_device_charge_equals_the_analyzers_epsilon_central(name: str) -> None:
    recipe = load_recipe(name)
    for respondents in (recipe.min_crowd_size, 4 * recipe.min_crowd_size):
        stated = privacy_summary(
            recipe, {u: respondents for u in range(recipe.shuffler_instances)}
        )["epsilon_central"]
        charged = recipe_cohort_bound(recipe)(
            float(recipe.epsilon_local), respondents, float(recipe.delta)
        )
        assert stated is not None and math.isfinite(charged)
        assert charged == pytest.approx(stated, rel=1e-12), (name, respondents)

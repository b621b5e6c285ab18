"""Shipped recipes load and build; bad recipes are refused with errors that name the field."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from privacy.budget import Query
from privacy.randomizers import RANDOMIZERS
from schemas import recipes

SCHEMA_DOC = json.loads((recipes.RECIPE_DIR.parent / "recipe.schema.json").read_text())


def test_every_shipped_recipe_loads_and_builds_its_randomizer() -> None:
    shipped = recipes.shipped_recipes()
    assert {r.randomizer for r in shipped.values()} >= {
        "one_hot_rappor",
        "count_mean_sketch",
        "longitudinal",
        "zero_sum_histogram",
        "report_fragmented",
    }
    for recipe_id, recipe in shipped.items():
        assert recipe_id == recipe.id == f"{recipe.name}@{recipe.version}"
        randomizer = recipe.build_randomizer()
        assert randomizer.name == recipe.randomizer
        assert recipe.payload_kind == randomizer.payload_kind
        assert randomizer.to_params() == dict(recipe.randomizer_params)
        assert len(recipe.instance_weights) == recipe.shuffler_instances
        assert math.isclose(sum(recipe.instance_weights), 1.0)
        assert recipes.recipe_from_dict(json.loads(recipe.to_json())) == recipe
        assert isinstance(recipe.to_query(), Query)
        assert (recipes.RECIPE_DIR / f"{recipe.name}.json").is_file()


def test_the_paper_parameters_are_shipped() -> None:
    grid = recipes.load_recipe("image_grid_onehot").build_randomizer()
    assert grid.domain_size == 64 * 64
    sketch = recipes.load_recipe("heavy_hitters_cms").build_randomizer()
    assert (sketch.num_hashes, sketch.width) == (1024, 65536)
    longitudinal = recipes.load_recipe("longitudinal_boolean").build_randomizer()
    assert (longitudinal.periods, longitudinal.max_changes) == (16, 2)
    fragmented = recipes.load_recipe("image_grid_report_fragmented")
    assert fragmented.report_fragments == fragmented.build_randomizer().fragments == 4
    assert math.isinf(recipes.load_recipe("zero_sum_histogram").epsilon_local)


def test_load_by_name_id_and_path() -> None:
    by_name = recipes.load_recipe("image_grid_onehot")
    assert recipes.load_recipe("image_grid_onehot@1") is by_name
    assert recipes.load_recipe(recipes.RECIPE_DIR / "image_grid_onehot.json") == by_name
    assert recipes.recipe_names() == sorted(r.name for r in recipes.shipped_recipes().values())
    with pytest.raises(recipes.RecipeError, match="no shipped recipe named 'nope'"):
        recipes.load_recipe("nope")
    with pytest.raises(recipes.RecipeError, match="image_grid_onehot@9"):
        recipes.load_recipe("image_grid_onehot@9")


def test_the_json_schema_document_describes_the_dataclass() -> None:
    names = [f.name for f in dataclasses.fields(recipes.Recipe)]
    assert set(SCHEMA_DOC["properties"]) == set(names)
    assert set(SCHEMA_DOC["required"]) == set(recipes._REQUIRED)
    assert set(SCHEMA_DOC["properties"]["randomizer"]["enum"]) == set(RANDOMIZERS)


def test_recipes_are_immutable() -> None:
    recipe = recipes.load_recipe("image_grid_onehot")
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.epsilon_local = 9.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        recipe.randomizer_params["epsilon"] = 9.0  # type: ignore[index]
    assert hash(recipe) == hash(recipes.load_recipe("image_grid_onehot@1"))


def mutated(base: str, **changes) -> dict:
    data = recipes.load_recipe(base).to_dict()
    for key, value in changes.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    return data


GRID = "image_grid_onehot"
FRAG = "image_grid_report_fragmented"
ZSUM = "zero_sum_histogram"
BAD_RECIPES = [
    (mutated(GRID, randomizer="rappor9"), "randomizer", "unknown randomizer"),
    (
        mutated(GRID, randomizer_params={"domain_size": 4096, "epsilon": -1.0}),
        "randomizer_params",
        "epsilon",
    ),
    (mutated(GRID, randomizer_params={"domain_size": 4096}), "randomizer_params", "missing"),
    (mutated(GRID, randomizer_params=[4096]), "randomizer_params", "object"),
    (mutated(GRID, epsilon_local=4.0), "epsilon_local", "gives 4.45"),
    (mutated(GRID, epsilon_local=4.45 - 1e-7), "epsilon_local", "rounded up"),
    (mutated(ZSUM, epsilon_local=3.0), "epsilon_local", "inf"),
    (mutated(GRID, epsilon_local=None), "epsilon_local", "4.45"),
    (
        mutated(
            FRAG,
            fragmentation={"report": {"tau": 3, "epsilon_backstop": 6.0, "epsilon_fragment": 1.5}},
        ),
        "fragmentation",
        "tau",
    ),
    (mutated(FRAG, fragmentation="attribute"), "fragmentation", "report_fragmented"),
    (
        mutated(
            GRID,
            fragmentation={"report": {"tau": 4, "epsilon_backstop": 6.0, "epsilon_fragment": 1.5}},
        ),
        "fragmentation",
        "report_fragmented",
    ),
    (mutated(GRID, fragmentation="bits"), "fragmentation", "attribute"),
    (mutated(GRID, instance_weights=[0.5, 0.5]), "instance_weights", "4 non-negative"),
    (mutated(GRID, instance_weights=[0.5, 0.5, 0.5, -0.5]), "instance_weights", "summing to 1"),
    (mutated(GRID, shuffler_instances=0), "shuffler_instances", "positive"),
    (mutated(GRID, window="1 day"), "window", "1d"),
    (mutated(GRID, version=0), "version", "positive"),
    (mutated(GRID, name="grid@2"), "name", "no '@'"),
    (mutated(GRID, epsilon=1.0), "epsilon", "unknown field"),
    (mutated(GRID, delta=...), "delta", "missing"),
    (mutated(GRID, delta=0.0), "delta", "(0, 1)"),
    (mutated(GRID, epsilon_central_target=-1), "epsilon_central_target", "> 0"),
    (mutated(GRID, data_fields=[]), "data_fields", "distinct"),
    (mutated(GRID, data_fields="location_cell"), "data_fields", "array"),
    (mutated(GRID, min_crowd_size=0), "min_crowd_size", "positive"),
    (mutated(ZSUM, min_crowd_size=5000), "min_crowd_size", "calibrated"),
    (mutated(ZSUM, epsilon_central_target=0.5), "epsilon_central_target", "guarantee"),
    (mutated(ZSUM, delta=1e-7), "delta", "below"),
]


@pytest.mark.parametrize(
    ("data", "field", "words"), BAD_RECIPES, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD_RECIPES)]
)
def test_bad_recipes_are_refused_naming_the_field(data: dict, field: str, words: str) -> None:
    with pytest.raises(recipes.RecipeError) as raised:
        recipes.recipe_from_dict(data, source="test.json")
    message = str(raised.value)
    assert f"field {field!r}" in message and words in message, message


def test_stated_epsilon_may_round_up_by_at_most_a_micro_epsilon() -> None:
    assert (
        recipes.recipe_from_dict(mutated(GRID, epsilon_local=4.4500005)).epsilon_local == 4.4500005
    )
    with pytest.raises(recipes.RecipeError, match="epsilon_local"):
        recipes.recipe_from_dict(mutated(GRID, epsilon_local=4.450002))


def test_defaults_and_unreadable_files(tmp_path) -> None:
    data = mutated(GRID, instance_weights=..., shuffler_instances=..., window=..., description=...)
    recipe = recipes.recipe_from_dict(data)
    assert recipe.shuffler_instances == 1 and recipe.instance_weights == (1.0,)
    assert recipe.window_seconds == 86_400
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(recipes.RecipeError, match="broken.json"):
        recipes.load_recipe(broken)

"""The population ``esa run`` and ``esa simulate`` simulate for a recipe when none is given."""

from __future__ import annotations

import importlib.util
import math

from schemas.recipes import Recipe

__all__ = ["IMAGE_RANDOMIZERS", "default_image", "default_population"]


def default_image() -> str:
    """image:horse when scikit-image is installed (``pip install .[images]``), else image:disc."""
    return "image:horse" if importlib.util.find_spec("skimage") is not None else "image:disc"


# Randomizers whose shipped recipes count cells of a picture (Section VII-B's image experiments).
IMAGE_RANDOMIZERS = frozenset({"one_hot_rappor", "report_fragmented"})


def default_population(recipe: Recipe) -> str:
    """A population that fits ``recipe`` (esa-privacy-revisited, Section VII): the longitudinal
    population for longitudinal recipes, the heavy-hitter population (VII-A) for sketches, an
    image (VII-B) for one-hot recipes over a square grid, and a Zipf population otherwise."""
    randomizer = recipe.build_randomizer()
    if getattr(randomizer, "payload_kind", None) == "tree_node":
        return "longitudinal"
    if recipe.randomizer == "count_mean_sketch":
        return "heavy-hitters"
    domain = int(randomizer.domain_size)
    if recipe.randomizer in IMAGE_RANDOMIZERS and math.isqrt(domain) ** 2 == domain:
        return default_image()
    return "zipf"

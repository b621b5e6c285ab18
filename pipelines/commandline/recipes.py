"""``esa recipes``: the shipped recipes, and whether a recipe's crowds will be released.

    esa recipes list [--names | --json]
    esa recipes check RECIPE --respondents N [--crowd-threshold C]
        [--deletion-epsilon E --deletion-delta D] [--json]

``list`` prints one row per shipped recipe (``schemas/recipes/*.json``): its randomizer, ε_ℓ,
the central target ε_c and δ, the minimum crowd (``min_crowd_size``), the smallest population
whose crowds are released with the shuffler's default threshold, and the respondents ``esa run``
simulates by default. ``check`` says before any run whether a crowd of N respondents is
released and, if not, why: too few respondents for the threshold, which the shuffler's
``--crowd-threshold`` or the devices' demand (the recipe's ``min_crowd_size``) sets, randomized
deletion, or devices that refuse the recipe (``pipelines/recipe_check.py``).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``esa recipes list`` and ``esa recipes check``."""
    parser = subparsers.add_parser(
        "recipes",
        help="Shipped recipes, and whether a recipe's crowds will be released.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="recipes_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="A table of the shipped recipes: epsilons, minimum crowd, sizes that release."
    )
    form = listing.add_mutually_exclusive_group()
    form.add_argument("--names", action="store_true", help="Only the names, one per line.")
    form.add_argument("--json", action="store_true", help="One JSON object per recipe.")
    form.add_argument(
        "--verbose", action="store_true", help="Also the id, channel and instances of each."
    )
    listing.set_defaults(handler=_handle_list)
    check = actions.add_parser(
        "check",
        help="Whether a crowd of N respondents is released for RECIPE, and why not.",
    )
    check.add_argument("recipe", metavar="RECIPE", help="Shipped recipe name or recipe JSON file.")
    check.add_argument(
        "--respondents", type=int, required=True, help="Respondents in the crowd (N)."
    )
    check.add_argument(
        "--crowd-threshold",
        type=int,
        default=None,
        help="The shuffler's --crowd-threshold. Default: the shuffler's default.",
    )
    check.add_argument("--deletion-epsilon", type=float, help="eps_cr of randomized deletion.")
    check.add_argument("--deletion-delta", type=float, help="delta_cr of randomized deletion.")
    check.add_argument("--json", action="store_true", help="The verdict as JSON.")
    check.set_defaults(handler=_handle_check)


def _row(recipe: Any) -> dict[str, Any]:
    from pipelines import recipe_check

    return {
        "name": recipe.name,
        "id": recipe.id,
        "randomizer": recipe.randomizer,
        "epsilon_local": recipe.epsilon_local if math.isfinite(recipe.epsilon_local) else None,
        "epsilon_central_target": recipe.epsilon_central_target,
        "delta": recipe.delta,
        "min_crowd_size": recipe.min_crowd_size,
        "smallest_releasing_population": recipe_check.smallest_releasing_population(recipe),
        "default_respondents": recipe.default_respondents,
        "shuffler_instances": recipe.shuffler_instances,
        "channel": recipe.channel,
    }


def _handle_list(args: argparse.Namespace) -> int:
    from schemas.recipes import load_recipe, recipe_names

    if args.names:
        print("\n".join(recipe_names()))
        return 0
    rows = [_row(load_recipe(name)) for name in recipe_names()]
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        return 0
    header = ["recipe", "randomizer", "eps_l", "eps_c target", "delta", "min crowd",
              "releases from", "esa run default"]  # fmt: skip
    if args.verbose:
        header += ["id", "channel", "instances"]
    table = []
    for row in rows:
        default = row["default_respondents"]
        cells = [
            row["name"],
            row["randomizer"],
            "none" if row["epsilon_local"] is None else f"{row['epsilon_local']:g}",
            f"{row['epsilon_central_target']:g}",
            f"{row['delta']:g}",
            f"{row['min_crowd_size']:,}",
            f"{row['smallest_releasing_population']:,}",
            "40,000" if default is None else f"{default:,}",
        ]
        if args.verbose:
            cells += [row["id"], row["channel"], str(row["shuffler_instances"])]
        table.append(cells)
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header))]
    for line in [header, *table]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    print(
        "releases from: the fewest respondents per crowd that every shuffler instance releases "
        "(max of the shuffler's default threshold and min crowd); esa recipes check RECIPE "
        "--respondents N explains any size."
    )
    return 0


def _handle_check(args: argparse.Namespace) -> int:
    from pipelines import recipe_check
    from pipelines.commandline.main import UsageError
    from schemas.recipes import load_recipe

    if args.respondents < 1:
        raise UsageError(f"--respondents must be >= 1, got {args.respondents}")
    threshold = args.crowd_threshold
    if threshold is None:
        threshold = recipe_check.DEFAULT_CROWD_THRESHOLD
    if threshold < 1:
        raise UsageError(f"--crowd-threshold must be >= 1, got {threshold}")
    if (args.deletion_epsilon is None) != (args.deletion_delta is None):
        raise UsageError("--deletion-epsilon and --deletion-delta go together")
    deletion = None
    if args.deletion_epsilon is not None:
        deletion = (args.deletion_epsilon, args.deletion_delta)
    recipe = load_recipe(args.recipe)  # RecipeError is a ValueError: one line, exit 2
    verdict = recipe_check.outlook(recipe, args.respondents, threshold, deletion)
    if args.json:
        print(json.dumps(verdict.to_dict(), sort_keys=True))
    else:
        print("\n".join(verdict.lines()))
    return 0 if verdict.released else 1

"""Why a crowd was withheld, in words, from what an analysis may know: the releases' parameters
(each instance's crowd threshold and deletion, ``summary.json``'s ``inputs.releases``) and the
recipe (its ``min_crowd_size``, which devices stamp on every message as their demand). A release
states only that a crowd was withheld, never its size. Loads no shuffler or device code (the
analyzer uses it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.recipes import Recipe

__all__ = [
    "DEFAULT_CROWD_THRESHOLD",
    "explain_withheld",
    "explain_withheld_in",
    "threshold_reason",
]

# transforms.shuffler.config.ShuffleConfig.crowd_threshold (a test keeps them equal; importing
# the shuffler's configuration here would load its transforms).
DEFAULT_CROWD_THRESHOLD = 100


def threshold_reason(recipe: Recipe, crowd_threshold: int) -> tuple[int, str]:
    """T = max(C, M) and which of them sets it, in words."""
    minimum = int(recipe.min_crowd_size)
    threshold = max(int(crowd_threshold), minimum, 1)
    if minimum >= crowd_threshold:
        why = (
            f"the devices' demand: recipe {recipe.id} asks for crowds of at least {minimum:,} "
            f"(min_crowd_size, at least the shuffler's own threshold {crowd_threshold:,})"
        )
    else:
        why = (
            f"the shuffler's --crowd-threshold {crowd_threshold:,} (above the recipe's "
            f"min_crowd_size {minimum:,})"
        )
    return threshold, why


def explain_withheld(
    notes: Sequence[Mapping[str, Any]],
    releases: Sequence[Mapping[str, Any]],
    recipes: Mapping[str, Recipe],
) -> list[dict[str, Any]]:
    """The analyzer's withheld-crowd notes, each with a ``reason`` in words.

    ``releases``: ``summary.json``'s ``inputs.releases`` (each instance's ``crowd_threshold`` and
    ``deletion``), ``recipes`` by id. A release states only that a crowd was withheld, never its
    size; the reason names the threshold the crowd missed and what set it (the shuffler's
    threshold or the devices' demand), and randomized deletion where it ran.
    """
    by_instance = {int(entry["instance"]): entry for entry in releases}
    out = []
    for note in notes:
        entry = dict(note)
        recipe = recipes.get(note.get("recipe_id", ""))
        reasons: dict[str, list[int]] = {}
        for instance in note.get("withheld_by", []):
            release = by_instance.get(int(instance), {})
            reasons.setdefault(_instance_reason(recipe, release), []).append(int(instance))
        entry["reason"] = "; ".join(
            f"{'instance' if len(who) == 1 else 'instances'} {', '.join(map(str, who))}: {text}"
            for text, who in reasons.items()
        ) or _rejected_reason(note)
        out.append(entry)
    return out


def _rejected_reason(note: Mapping[str, Any]) -> str:
    """A crowd the analyzer withheld because every message of it was rejected
    (``transforms.analyzer.arithmetic.rejections.all_rejected_note``): the reasons, counted."""
    rejected = note.get("rejected")
    if not isinstance(rejected, Mapping) or not rejected:
        return str(note.get("note", "withheld"))
    counts = ", ".join(f"{reason} {int(count):,}" for reason, count in sorted(rejected.items()))
    return f"every message was rejected by the analyzer ({counts})"


def _instance_reason(recipe: Recipe | None, release: Mapping[str, Any]) -> str:
    configured = release.get("crowd_threshold")
    if recipe is None or configured is None:
        return "fewer distinct respondents than its threshold"
    configured, minimum = int(configured), int(recipe.min_crowd_size)
    threshold = max(configured, minimum, 1)
    if minimum >= configured:
        text = (
            f"fewer than {threshold:,} distinct respondents, the devices' demand (recipe "
            f"min_crowd_size, shuffler threshold {configured:,})"
        )
    else:
        text = (
            f"fewer than {threshold:,} distinct respondents, the shuffler's --crowd-threshold "
            f"(recipe min_crowd_size {minimum:,})"
        )
    if release.get("deletion"):
        text += ", or fewer after randomized deletion (Algorithm 3), which may also abort"
    return text


def shipped_or_given(recipe_ids: Sequence[str]) -> dict[str, Recipe]:
    """The recipes of ``recipe_ids`` that load by id (shipped ones); others are left out."""
    from schemas.recipes import load_recipe

    out = {}
    for recipe_id in recipe_ids:
        try:
            out[recipe_id] = load_recipe(recipe_id)
        except ValueError:
            continue
    return out


def explain_withheld_in(
    notes: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """:func:`explain_withheld` with the releases and recipes an analysis's ``summary.json``
    names."""
    inputs = summary.get("inputs", {})
    ids = sorted({note.get("recipe_id", "") for note in notes} | set(inputs.get("recipes", [])))
    return explain_withheld(notes, inputs.get("releases", []), shipped_or_given(ids))


def record_reasons(analysis_dir: str) -> dict[str, int]:
    """Add ``withheld.reasons`` (each reason's count of withheld crowd windows, so its size
    grows with the distinct reasons, never the crowds) to the analysis's ``summary.json``,
    rewritten atomically; returns it."""
    import json
    import os
    from collections import Counter

    from transforms.analyzer.report_files import read_withheld

    path = os.path.join(analysis_dir, "summary.json")
    with open(path, encoding="utf-8") as handle:
        summary = json.load(handle)
    notes = explain_withheld_in(read_withheld(analysis_dir), summary)
    reasons = dict(Counter(note["reason"] for note in notes).most_common())
    summary.setdefault("withheld", {})["reasons"] = reasons
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, allow_nan=False)
    os.replace(temporary, path)
    return reasons

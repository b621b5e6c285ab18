"""Before any run: will a recipe's crowds be released, and why not (``esa recipes check``).

A shuffler releases a crowd when its distinct respondents reach the threshold
T = max(the shuffler's ``--crowd-threshold`` C, the recipe's ``min_crowd_size`` M, every
message's ``min_crowd_size``), which devices stamp from the recipe, so T = max(C, M)
(``transforms.shuffler.decide.crowd_threshold``). Every device sends a presence message to every
shuffler instance in each window of a round, so each instance counts every reporting device of a
crowd. Devices themselves refuse a recipe whose central target their cohort bound cannot meet at
M respondents (Check 3 of samplable-anonymous-aggregation, ``simulators.fleet``), and then send
nothing. With randomized deletion (Algorithm 3 of esa-privacy-revisited) a crowd of n keeps
n + Z - offset respondents and is withheld again below T, so n must clear T + offset to be
released with probability about 1/2 or more.

Everything here is arithmetic on the recipe and the flags: no pipeline, no Beam.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from privacy.accounting.deletion import deletion_noise
from schemas.recipes import Recipe

__all__ = [
    "DEFAULT_CROWD_THRESHOLD",
    "CrowdOutlook",
    "device_refusal",
    "explain_withheld",
    "explain_withheld_in",
    "outlook",
    "smallest_releasing_population",
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


def device_refusal(recipe: Recipe) -> str | None:
    """Why every device refuses ``recipe`` (its own query class and default budget), or None."""
    from simulators.fleet import DeviceFleet, FleetConfig, device_policy_for

    fleet = DeviceFleet(
        recipe,
        policy=device_policy_for(recipe, runs=1),
        config=FleetConfig(enforce_budget=math.isfinite(recipe.epsilon_local)),
    )
    if not math.isfinite(recipe.epsilon_local):
        return None  # no local privacy: no on-device accountant can admit it (esa run skips it)
    refusals = fleet.refusals_for_all()
    if not refusals:
        return None
    return "; ".join(f"{failure.reason}: {failure.detail}" for failure in refusals)


def smallest_releasing_population(
    recipe: Recipe, crowd_threshold: int = DEFAULT_CROWD_THRESHOLD
) -> int:
    """The fewest respondents whose crowd every instance releases (no deletion): T."""
    return threshold_reason(recipe, crowd_threshold)[0]


@dataclass(frozen=True)
class CrowdOutlook:
    """What to expect of one crowd of ``respondents`` for ``recipe`` before running it."""

    recipe_id: str
    respondents: int
    threshold: int
    threshold_reason: str
    released: bool
    reason: str
    deletion_offset: int | None
    epsilon_central: float | None
    bound: str | None
    refusal: str | None

    def lines(self) -> list[str]:
        verdict = "released" if self.released else "withheld"
        out = [f"{self.recipe_id} with {self.respondents:,} respondents per crowd: {verdict}"]
        out.append(f"  why: {self.reason}")
        out.append(f"  threshold T = {self.threshold:,}, set by {self.threshold_reason}")
        if self.epsilon_central is not None:
            out.append(
                f"  epsilon_c at {self.respondents:,} respondents: {self.epsilon_central:.4g} "
                f"({self.bound})"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def outlook(
    recipe: Recipe,
    respondents: int,
    crowd_threshold: int = DEFAULT_CROWD_THRESHOLD,
    deletion: tuple[float, float] | None = None,
) -> CrowdOutlook:
    """Whether a crowd of ``respondents`` devices is released for ``recipe`` and why (module
    docstring), with the ε_c the analyzer would state for it."""
    if respondents < 1:
        raise ValueError(f"respondents must be >= 1, got {respondents}")
    threshold, why_threshold = threshold_reason(recipe, crowd_threshold)
    refusal = device_refusal(recipe)
    offset = None if deletion is None else int(deletion_noise(*deletion).offset_records)
    needed = threshold + (offset or 0)
    if refusal is not None:
        released, reason = False, f"every device refuses the recipe, so nothing is sent: {refusal}"
    elif respondents < threshold:
        released = False
        reason = f"{respondents:,} respondents are fewer than the threshold T = {threshold:,}"
    elif offset is not None and respondents < needed:
        released = False
        reason = (
            f"randomized deletion removes about {offset:,} respondents (Algorithm 3's offset), "
            f"leaving fewer than T = {threshold:,} in most runs: give at least {needed:,}"
        )
    else:
        released = True
        reason = f"{respondents:,} respondents reach the threshold T = {threshold:,}" + (
            "" if offset is None else f" plus the deletion offset {offset:,}"
        )
    epsilon_central = bound = None
    if refusal is None:
        from transforms.analyzer.arithmetic.report import privacy_summary

        kept = max(respondents - (offset or 0), 1)
        summary = privacy_summary(recipe, dict.fromkeys(range(recipe.shuffler_instances), kept))
        epsilon_central, bound = summary.get("epsilon_central"), summary.get("bound")
    return CrowdOutlook(
        recipe_id=recipe.id,
        respondents=int(respondents),
        threshold=threshold,
        threshold_reason=why_threshold,
        released=released,
        reason=reason,
        deletion_offset=offset,
        epsilon_central=epsilon_central,
        bound=bound,
        refusal=refusal,
    )


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
        ) or str(note.get("note", "withheld"))
        out.append(entry)
    return out


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

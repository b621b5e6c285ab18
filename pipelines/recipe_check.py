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
from dataclasses import dataclass
from typing import Any

from pipelines.withheld_reasons import (
    DEFAULT_CROWD_THRESHOLD,
    explain_withheld,
    explain_withheld_in,
    threshold_reason,
)
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

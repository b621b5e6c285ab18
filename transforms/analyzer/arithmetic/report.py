"""The analyzer's report per crowd: privacy summary (ε_ℓ, ε_c with its bound, deletion),
accuracy against a simulation's truth, and notes on withheld crowds."""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from privacy.accounting import (
    PrivacyLoss,
    compose_basic,
    randomizer_central,
)
from privacy.randomizers import (
    LongitudinalClient,
    ZeroSumHistogram,
)
from schemas.recipes import Recipe
from transforms.analyzer.arithmetic.accumulate import HISTOGRAM, CrowdKey
from transforms.analyzer.arithmetic.estimate import (
    HistogramResult,
    LongitudinalResult,
    effective_respondents,
)

# ---------------------------------------------------------------------------------------------
# Privacy report
# ---------------------------------------------------------------------------------------------

THEOREM_3_2 = "shuffled_model_histograms_theorem_3_2"
ALGORITHM_3 = "algorithm_3_deletion"


def _finite_or_none(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def amplification_respondents(
    respondents: Mapping[int, int], instance_weights: Iterable[float]
) -> int:
    """The crowd an amplification bound may count on: the fewest respondents among the instances
    that released the crowd and receive messages (π_u > 0).

    A respondent's message sits in exactly one instance's release. Per attribute j, each of the
    n_u respondents of instance u contributes either a message for j there or nothing:
    a randomized response thinned by the routing, still ε_ℓ-DP per bit, so the per-attribute
    amplification of Section III (esa-privacy-revisited) holds among n_u respondents; the FMT
    bounds need nothing more, while Theorem III.1 is the paper's bound for its setting of one
    shuffler per attribute. The weakest instance bounds the guarantee.
    """
    weights = list(instance_weights)
    sizes = [int(count) for u, count in respondents.items() if count > 0 and weights[int(u)] > 0]
    return min(sizes) if sizes else 0


def privacy_summary(
    recipe: Recipe,
    respondents: Mapping[int, int],
    deletion: Mapping[int, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The privacy report of one released crowd (DESIGN.md "Results"; Table X).

    * ε_ℓ∞ and ε_ℓ1: Theorem IV.1 (esa-privacy-revisited) with t = τ and t = 1 (both ε_ℓ without
      report fragmentation).
    * ε_c: the tightest valid bound for what was released: attribute-fragmented one-hot
      randomizers use Theorem III.1 (exact and simplified) and the FMT bounds per attribute
      (``privacy.accounting.privacy_report``); report fragments the backstop's guarantee
      (Theorem IV.2); binary randomized response Lemma II.6; the zero-sum protocol its own
      Theorem 3.2 (shuffled-model-histograms) when the crowd is at least the size it was
      calibrated for; anything else (sketches, longitudinal tree nodes, asymmetric one-hot) the
      numerical shuffle bound for the whole report. Bounds outside their validity range are not
      used (``privacy.accounting.amplify`` refuses them).
    * ``epsilon_central_without_attribute_fragmentation``: Table X's comparison for one-hot reports.
    * ``epsilon_local_solved``: for a recipe whose ε_ℓ was solved (``schemas.recipes``), the
      target ε_c, the expected crowd, the bound and the solved ε_ℓ, to read beside the ε_c
      achieved at the released n.
    * deletion: each instance that ran Algorithm 3 released a crowd size that is (ε_cr, δ_cr)-DP
      (Theorem V.1); every respondent is counted by every instance, so these add up with ε_c by
      basic composition into ``epsilon_central_total``/``delta_total``.
    """
    randomizer = recipe.build_randomizer()
    delta = float(recipe.delta)
    n = amplification_respondents(respondents, recipe.instance_weights)
    out: dict[str, Any] = {
        "randomizer": recipe.randomizer,
        "local_model": randomizer.ldp_kind,
        "delta": delta,
        "respondents": n,
        "respondents_effective": effective_respondents(respondents, recipe.instance_weights),
        "epsilon_central_target": float(recipe.epsilon_central_target),
        "notes": [],
    }
    epsilon_all = float(randomizer.epsilon_local)
    epsilon_one = float(getattr(randomizer, "epsilon_single_fragment", epsilon_all))
    out["epsilon_local_all"] = _finite_or_none(epsilon_all)
    out["epsilon_local_one"] = _finite_or_none(epsilon_one)
    if recipe.expected_crowd is not None:
        out["epsilon_local_solved"] = {
            "epsilon_local": float(recipe.epsilon_local),
            "epsilon_central_target": float(recipe.epsilon_central_target),
            "expected_crowd": int(recipe.expected_crowd),
            "bound": recipe.solve_bound,
        }
    central: dict[str, Any] | None = None
    without: dict[str, Any] | None = None
    if n < 1:
        out["notes"].append("no instance released this crowd: no central guarantee to state")
    elif isinstance(randomizer, ZeroSumHistogram):
        if n >= randomizer.respondents:
            central = {
                "epsilon_central": randomizer.central_epsilon,
                "delta": randomizer.central_delta,
                "bound": THEOREM_3_2,
                "bound_description": "Theorem 3.2 (shuffled-model-histograms): (2ε, 2δ) for "
                "crowds of at least the n the protocol was calibrated for",
            }
        else:
            out["notes"].append(
                f"crowd of {n} is below the {randomizer.respondents} respondents the zero-sum "
                "protocol is calibrated for: Theorem 3.2 does not hold, no ε_c is stated"
            )
    else:
        # One definition with the devices' Check 3 (privacy.accounting.randomizer_central).
        # privacy.accounting.amplify keeps each evaluation (and takes those given to it)
        guarantee, comparison = randomizer_central(randomizer, n, delta)
        central = guarantee.to_dict()
        without = None if comparison is None else comparison.to_dict()
        if isinstance(randomizer, LongitudinalClient):
            out["notes"].append(
                "ε_c is per period window (one tree-node report per client and period); the "
                f"whole round of {randomizer.periods} periods is ε_ℓ-LDP (Theorem 5)"
            )
    if central is not None:
        out["epsilon_central"] = _finite_or_none(central["epsilon_central"])
        out["delta"] = float(central["delta"])
        out["bound"] = central["bound"]
        out["bound_description"] = central.get("bound_description", central["bound"])
        out["central"] = central
    else:
        out["epsilon_central"] = None
        out["bound"] = None
    if without is not None:
        out["epsilon_central_without_attribute_fragmentation"] = _finite_or_none(
            without["epsilon_central"]
        )
        out["bound_without_attribute_fragmentation"] = without["bound"]
    losses = []
    if out["epsilon_central"] is not None:
        losses.append(PrivacyLoss(out["epsilon_central"], out["delta"], out["bound"]))
    applied = {int(u): tuple(p) for u, p in (deletion or {}).items() if p is not None}
    if applied:
        out["deletion"] = {
            str(u): {"epsilon": float(eps), "delta": float(dlt)}
            for u, (eps, dlt) in sorted(applied.items())
        }
        losses.extend(
            PrivacyLoss(float(eps), float(dlt), ALGORITHM_3) for eps, dlt in applied.values()
        )
    else:
        out["notes"].append(
            "no randomized deletion (Algorithm 3): crowd sizes were released exactly"
        )
    if out["epsilon_central"] is not None:
        total = compose_basic(losses)
        out["epsilon_central_total"] = float(total.epsilon)
        out["delta_total"] = float(total.delta)
    return out


# Privacy reports already made, per (recipe object, respondents, deletion) in their order (sums
# over them are order-sensitive in the last bit): many crowds share them, and making one (the
# bounds' reports turned into plain dicts) costs more than the rest of a crowd's report. Each
# entry keeps its recipe, so an id() is never a later object's; the cache empties when full.
_SUMMARIES: dict[tuple, tuple[Recipe, bytes]] = {}
_SUMMARIES_LIMIT = 4096


def cached_privacy_summary(
    recipe: Recipe,
    respondents: Mapping[int, int],
    deletion: Mapping[int, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """:func:`privacy_summary`, made once per distinct arguments; a fresh copy each call."""
    key = (
        id(recipe),
        tuple((int(u), int(c)) for u, c in respondents.items()),
        tuple((int(u), None if p is None else tuple(p)) for u, p in (deletion or {}).items()),
    )
    hit = _SUMMARIES.get(key)
    if hit is None or hit[0] is not recipe:
        if len(_SUMMARIES) >= _SUMMARIES_LIMIT:
            _SUMMARIES.clear()
        made = privacy_summary(recipe, respondents, deletion)
        hit = _SUMMARIES[key] = (recipe, pickle.dumps(made, pickle.HIGHEST_PROTOCOL))
    return pickle.loads(hit[1])


# ---------------------------------------------------------------------------------------------
# Truth (simulations only) and report assembly
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Truth:
    """True counts of a simulation (``truth.parquet`` of ``esa simulate``): one recipe, counts
    per (window start, bucket); for longitudinal recipes bucket 1 counts clients in state True.
    Applies to crowds of ``recipe_id`` without a crowd ID."""

    recipe_id: str
    window_start: np.ndarray
    bucket: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        arrays = [
            np.asarray(getattr(self, name), dtype=np.int64)
            for name in ("window_start", "bucket", "count")
        ]
        if not arrays[0].shape == arrays[1].shape == arrays[2].shape or arrays[0].ndim != 1:
            raise ValueError("truth window_start, bucket and count must be 1-D of one length")
        for name, array in zip(("window_start", "bucket", "count"), arrays, strict=True):
            object.__setattr__(self, name, array)

    def applies_to(self, key: CrowdKey) -> bool:
        return key[4] == self.recipe_id and key[5] is None

    def window(self, window_start: int) -> tuple[np.ndarray, np.ndarray]:
        """(buckets, counts) of one window."""
        rows = self.window_start == int(window_start)
        return self.bucket[rows], self.count[rows]

    def marginals(self, window_starts: np.ndarray) -> np.ndarray:
        """f_t: bucket-1 counts of each window (NaN where the truth has no such window)."""
        out = np.full(len(window_starts), np.nan)
        for index, start in enumerate(np.asarray(window_starts).tolist()):
            rows = self.window_start == start
            if rows.any():
                out[index] = float(self.count[rows & (self.bucket == 1)].sum())
        return out


def key_fields(key: CrowdKey) -> dict[str, Any]:
    kind, window_start, window_end, channel, recipe_id, crowd_id = key
    fields = {"kind": kind, "channel": channel, "recipe_id": recipe_id, "crowd_id": crowd_id}
    if kind == HISTOGRAM:
        fields.update(window_start=int(window_start), window_end=int(window_end))
    return fields


def missing_instance_note(recipe: Recipe, respondents: Mapping[int, int]) -> str | None:
    """A note when some instance that receives messages (π_u > 0) released nothing for a crowd."""
    silent = [
        u
        for u, weight in enumerate(recipe.instance_weights)
        if weight > 0 and respondents.get(u, 0) == 0
    ]
    if not silent:
        return None
    return (
        f"shuffler instance(s) {silent} released nothing for this crowd (withheld, or no input): "
        "n_eff and the estimate cover the other instances' respondents only"
    )


def histogram_report(
    recipe: Recipe,
    result: HistogramResult,
    deletion: Mapping[int, tuple[float, float]] | None,
    accuracy: Mapping[str, float] | None,
    rejected: Mapping[str, int] | None,
) -> dict[str, Any]:
    """The summary.json entry of one histogram crowd."""
    report = key_fields(result.key)
    report.update(
        respondents_effective=result.respondents,
        respondents_by_instance={str(u): int(c) for u, c in result.respondents_by_instance.items()},
        messages=int(result.messages),
        rejected=dict(rejected or {}),
        domain_size=int(result.domain_size),
        buckets_reported=int(result.buckets.size),
        postprocessing=result.postprocessing,
        privacy=cached_privacy_summary(recipe, result.respondents_by_instance, deletion),
        notes=[],
    )
    if not result.dense:
        report["unobserved_estimate"] = result.unobserved_estimate
        report["unobserved_stderr"] = result.unobserved_stderr
        report["notes"].append(
            f"sparse domain: {result.buckets.size} of {result.domain_size} buckets received "
            f"messages; every other bucket's estimate is {result.unobserved_estimate:.6g}"
        )
    note = missing_instance_note(recipe, result.respondents_by_instance)
    if note:
        report["notes"].append(note)
    if accuracy is not None:
        report["accuracy"] = dict(accuracy)
    return report


def longitudinal_report(
    recipe: Recipe,
    result: LongitudinalResult,
    respondents: Mapping[int, int],
    deletion: Mapping[int, tuple[float, float]] | None,
    truth: np.ndarray | None,
) -> dict[str, Any]:
    """The summary.json entry of one longitudinal round; with truth, the largest error against
    Theorem 6's bound."""
    report = key_fields(result.key)
    report.update(
        round_start=int(result.round_start),
        window_ms=int(result.window_ms),
        periods=result.periods,
        respondents=result.respondents,
        respondents_per_period=[float(v) for v in result.respondents_per_period],
        messages=int(result.messages),
        error_bound=float(result.bound),
        error_bound_failure_probability=float(result.failure_probability),
        error_bound_source="Theorem 6 (amplification-by-shuffling), explicit constants",
        privacy=cached_privacy_summary(recipe, respondents, deletion),
        notes=list(result.notes),
    )
    if truth is not None and np.all(np.isfinite(truth)):
        error = np.abs(result.estimate - truth)
        report["accuracy"] = {
            "max_abs_error": float(error.max()),
            "within_bound": bool(error.max() <= result.bound),
            "rmse": float(np.sqrt(np.mean(error**2))),
            "stderr_rms": float(np.sqrt(np.mean(result.stderr**2))),
        }
    return report


def withheld_notes(
    crowds: Iterable[Mapping[str, Any]],
    estimated: Iterable[tuple[int, str, str, str | None]],
) -> list[dict[str, Any]]:
    """Notes for crowds a shuffler withheld, from the commit records' crowd lists (status
    "withheld"; each record also carries the ``instance`` whose commit listed it).

    ``estimated``: (window_start, channel, recipe_id, crowd_id) of every window that produced an
    estimate. A crowd withheld by every instance gets "no estimate"; one withheld by some
    instances only is also noted in its own entry (:func:`missing_instance_note`).
    """
    estimated = set(estimated)
    notes: dict[tuple, dict[str, Any]] = {}
    for record in crowds:
        if record.get("status") != "withheld":
            continue
        crowd = (
            int(record["window_start_ms"]),
            record["channel"],
            record["recipe_id"],
            record.get("crowd_id"),
        )
        entry = notes.setdefault(
            crowd,
            {
                "window_start": crowd[0],
                "window_end": int(record["window_end_ms"]),
                "channel": crowd[1],
                "recipe_id": crowd[2],
                "crowd_id": crowd[3],
                "withheld_by": [],
            },
        )
        entry["withheld_by"].append(int(record["instance"]))
    out = []
    for crowd, entry in sorted(notes.items(), key=lambda item: tuple(str(v) for v in item[0])):
        entry["withheld_by"] = sorted(set(entry["withheld_by"]))
        entry["estimated"] = crowd in estimated
        entry["note"] = (
            "withheld by some shuffler instances; estimated from the others"
            if entry["estimated"]
            else "withheld by the shuffler: no estimate for this crowd"
        )
        out.append(entry)
    return out

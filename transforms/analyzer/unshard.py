"""The analyzer in the aggregate model: two aggregate shares in, de-biased histograms out (pure).

samplable-anonymous-aggregation §3.1.2: the analyzer sees only the sum of the n valid randomized
reports of a window and crowd. It opens aggregator 0's and aggregator 1's published aggregate
shares (``schemas.crypto.prio3_reports``: each opens only under the run, recipe, window, crowd,
report count and report-id checksum it was sealed for), adds them (``Prio3.unshard``) into the
sums of the randomized bits, and de-biases them with the recipe's estimator at n, the number of
valid reports both aggregators summed, as for shuffled messages.

The guarantee is stated at that n: the sum is a function of the shuffled multiset of the same
reports ("the sum of the local reports reveals strictly less information than a permutation",
§3.1.2, footnote 2), so the tight shuffle accountant (``privacy.accounting.amplify``) bounds it;
Theorem 3.1 (the closed form of Feldman, McMillan and Talwar, eqn (1)) is stated beside it, or why
it does not apply.

A window is refused, with the reason, when a share is missing, the two state different report
counts or checksums, a share does not open under what they state, or the records are of another
run or recipe (all of a record's windows: :class:`UnshardError`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privacy.accounting import BINARY_RR, GENERIC, ONE_HOT_RAPPOR, amplify
from privacy.accounting.core import FMT_CLOSED_FORM
from schemas.crypto.analyzer_keys import KeyRing
from schemas.crypto.prio3_reports import open_aggregate_share
from schemas.crypto.vdaf import SHARES, VdafError
from schemas.recipes import Recipe, recipe_from_dict

__all__ = [
    "AGGREGATE_FORMAT",
    "UnshardError",
    "CrowdResult",
    "guarantee_at",
    "read_aggregate_record",
    "unshard_aggregates",
]

AGGREGATE_FORMAT = "esa-prio3-aggregate/1"


class UnshardError(ValueError):
    """Aggregate records that may not be combined at all (one line naming why)."""


@dataclass(frozen=True)
class CrowdResult:
    """One window and crowd: the de-biased histogram at n, or the reason it was refused."""

    window_start: int
    window_end: int
    crowd_id: str | None
    reports: int
    raw_counts: np.ndarray | None = None
    estimate: np.ndarray | None = None
    stderr: np.ndarray | None = None
    guarantee: Mapping[str, Any] | None = None
    refused: str | None = None


def _check_records(records: Sequence[Mapping[str, Any]]) -> tuple[Recipe, str, list[Mapping]]:
    if len(records) != SHARES:
        raise UnshardError(f"{SHARES} aggregate records are needed, got {len(records)}")
    for record in records:
        if record.get("format") != AGGREGATE_FORMAT:
            raise UnshardError(f"not an {AGGREGATE_FORMAT} record: {str(record.get('format'))!r}")
    by_aggregator = sorted(records, key=lambda r: r.get("aggregator", -1))
    if [r.get("aggregator") for r in by_aggregator] != list(range(SHARES)):
        raise UnshardError(
            "the records must be aggregator 0's and aggregator 1's, got aggregators "
            f"{[r.get('aggregator') for r in records]}"
        )
    first, second = by_aggregator
    if first.get("run_id") != second.get("run_id"):
        raise UnshardError(
            f"the aggregate records are from different runs ({first.get('run_id')!r}, "
            f"{second.get('run_id')!r})"
        )
    if first.get("recipe") != second.get("recipe"):
        raise UnshardError("the aggregate records state different recipes")
    recipe = recipe_from_dict(first["recipe"], source="aggregate record")
    if not recipe.is_prio3:
        raise UnshardError(f"recipe {recipe.id} is not a prio3 recipe")
    return recipe, str(first["run_id"]), by_aggregator


def _key(entry: Mapping[str, Any]) -> tuple[int, int, str | None]:
    return int(entry["window_start"]), int(entry["window_end"]), entry.get("crowd_id")


def guarantee_at(recipe: Recipe, reports: int) -> dict[str, Any]:
    """The aggregate-model guarantee at n = ``reports``: the tight accountant, and Theorem 3.1."""
    mechanism = {"one_hot_rappor": ONE_HOT_RAPPOR, "binary_rr": BINARY_RR}.get(
        recipe.randomizer, GENERIC
    )
    found = amplify(recipe.epsilon_local, reports, recipe.delta, mechanism)
    theorem = found.details.get("candidates", {}).get(FMT_CLOSED_FORM)
    return {
        "model": "aggregate (samplable-anonymous-aggregation 3.1.2): the analyzer sees the sum",
        "epsilon_local": recipe.epsilon_local,
        "respondents": reports,
        "delta": recipe.delta,
        "epsilon_central": found.epsilon,
        "bound": found.bound,
        "theorem_3_1": theorem,
    }


def unshard_aggregates(records: Sequence[Mapping[str, Any]], ring: KeyRing) -> list[CrowdResult]:
    """Every window and crowd of the two records (see the module docstring)."""
    recipe, run_id, (first, second) = _check_records(records)
    vdaf = recipe.build_vdaf()
    randomizer = recipe.build_randomizer()
    published = [{_key(e): e for e in record.get("published", [])} for record in (first, second)]
    results = []
    for key in sorted(published[0].keys() | published[1].keys(), key=lambda k: (k[0], k[2] or "")):
        window_start, window_end, crowd_id = key
        entries = [shares.get(key) for shares in published]
        base = {"window_start": window_start, "window_end": window_end, "crowd_id": crowd_id}
        missing = [j for j, entry in enumerate(entries) if entry is None]
        if missing:
            results.append(
                CrowdResult(
                    **base,
                    reports=0,
                    refused=f"aggregator {missing[0]}'s aggregate share is missing",
                )
            )
            continue
        reports = {int(e["reports"]) for e in entries}
        checksums = {str(e["checksum"]) for e in entries}
        if len(reports) != 1 or len(checksums) != 1:
            results.append(
                CrowdResult(
                    **base,
                    reports=0,
                    refused="the aggregators state different report counts or checksums",
                )
            )
            continue
        n, checksum = reports.pop(), int(checksums.pop(), 16)
        shares = []
        for agg_id, entry in enumerate(entries):
            try:
                sealed = bytes.fromhex(entry["sealed_share"])
            except (KeyError, TypeError, ValueError):
                sealed = b""
            shares.append(
                open_aggregate_share(
                    ring,
                    sealed,
                    agg_id,
                    run_id,
                    recipe_id=recipe.id,
                    channel=recipe.channel,
                    window_start_ms=window_start,
                    window_end_ms=window_end,
                    crowd_id=crowd_id,
                    reports=n,
                    checksum=checksum,
                )
            )
        if any(share is None for share in shares):
            results.append(
                CrowdResult(
                    **base,
                    reports=n,
                    refused="an aggregate share does not open under what the aggregators state "
                    "(another run, window, crowd or count, or altered)",
                )
            )
            continue
        try:
            counts = vdaf.unshard(shares, n)
        except VdafError as error:
            results.append(CrowdResult(**base, reports=n, refused=f"unshard: {error}"))
            continue
        estimate = randomizer.estimate(counts.astype(np.float64), n)
        results.append(
            CrowdResult(
                **base,
                reports=n,
                raw_counts=counts,
                estimate=np.asarray(estimate.estimate),
                stderr=np.asarray(estimate.stderr),
                guarantee=guarantee_at(recipe, n),
            )
        )
    return results


def read_aggregate_record(text: str, source: str) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except ValueError as error:
        raise UnshardError(f"{source}: not JSON: {error}") from None
    if not isinstance(record, dict):
        raise UnshardError(f"{source}: not an {AGGREGATE_FORMAT} record")
    return record

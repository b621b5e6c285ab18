"""Precision and recall at k of interactive vs non-interactive n-gram discovery as epsilon varies.

Called by ``esa analysis run`` when the plan has ``"sweep": {"epsilons": [...], "repeats": R}``.
For each local epsilon every round runs at it; the devices are charged the cohort epsilon
of Check 3's bound at the plan's minimum crowd per round, and the rounds compose (basic
composition) to the analysis budget. The non-interactive baseline spends that same analysis
budget on one round over every 3-gram of known words (the largest local epsilon whose cohort
epsilon fits). Both are drawn from the
exact aggregate distribution (``simulators.ngram_sweep``: what the analyzer de-biases, without
making messages). Writes ``sweep.json`` and ``precision_at_k.png`` into the output directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from simulators import ngram_sweep

__all__ = ["sweep", "draw"]


def sweep(
    plan: dict[str, Any],
    typed: list[list[str]],
    known: list[str],
    output: Path,
    rng: np.random.Generator,
) -> dict[str, Any]:
    settings = plan["sweep"]
    epsilons = [float(e) for e in settings["epsilons_local"]]
    repeats = int(settings.get("repeats", 3))
    crowd, delta = int(plan["min_crowd_size"]), float(plan["delta"])
    keep = [int(r["keep"]) for r in plan["rounds"]]
    n_last = 1 + len(plan["rounds"])
    cache = {n: ngram_sweep.device_ngrams(typed, n) for n in range(2, n_last + 1)}
    rows: list[dict[str, Any]] = []
    totals = []
    for epsilon in epsilons:
        per_round = [epsilon] * len(plan["rounds"])
        total = sum(ngram_sweep.cohort_epsilon(e, crowd, delta) for e in per_round)
        totals.append(total)
        baseline_local = ngram_sweep.local_for_cohort(total, crowd, delta)
        for repeat in range(repeats):
            for point in ngram_sweep.interactive_exact(
                cache, known, per_round, keep, plan["k"], rng, crowd, delta
            ):
                rows.append({**point.__dict__, "repeat": repeat, "epsilon_local": epsilon})
            point = ngram_sweep.baseline_exact(
                cache, known, n_last, baseline_local, plan["k"], rng, total
            )
            rows.append({**point.__dict__, "repeat": repeat, "epsilon_local": baseline_local})
    summary: dict[str, Any] = {"k": plan["k"], "repeats": repeats, "rows": rows, "mean": []}
    for method in sorted({r["method"] for r in rows}):
        for total in totals:
            picked = [r for r in rows if r["method"] == method and r["epsilon_total"] == total]
            if picked:
                summary["mean"].append(
                    {
                        "method": method,
                        "epsilon_total": total,
                        "epsilon_local": picked[0]["epsilon_local"],
                        "precision": float(np.mean([r["precision"] for r in picked])),
                        "recall": float(np.mean([r["recall"] for r in picked])),
                    }
                )
    (output / "sweep.json").write_text(json.dumps(summary, indent=2))
    summary["picture"] = str(draw(summary, output / "precision_at_k.png"))
    return summary


def draw(summary: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, metric in zip(axes, ("precision", "recall"), strict=True):
        for method in sorted({m["method"] for m in summary["mean"]}):
            points = [m for m in summary["mean"] if m["method"] == method]
            axis.plot(
                [p["epsilon_total"] for p in points],
                [p[metric] for p in points],
                marker="o",
                label=method,
            )
        axis.set_xlabel("analysis cohort epsilon (basic composition over rounds)")
        axis.set_title(f"{metric} at k={summary['k']} (mean of {summary['repeats']})")
        axis.set_ylim(-0.02, 1.02)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("share of the true top-k n-grams")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path

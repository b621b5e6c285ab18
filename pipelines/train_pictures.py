"""PNG pictures of an ``esa train`` run (matplotlib, Agg backend, no global pyplot state).

Each function takes metrics.json's content and returns PNG bytes.
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["accuracy_vs_devices", "accuracy_vs_epoch", "accuracy_vs_epsilon"]


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def accuracy_vs_epoch(metrics: dict[str, Any]) -> bytes:
    """Test accuracy after each epoch: LDP-SGD through the shufflers and the baselines."""
    figure = Figure(figsize=(6.4, 4.2))
    axes = figure.add_subplot()
    epochs = [row["epoch"] for row in metrics["epochs"]]
    privacy = metrics["privacy"]
    axes.plot(
        epochs,
        [row["accuracy"] for row in metrics["epochs"]],
        marker="o",
        label=f"LDP-SGD, eps_le = {privacy['epsilon_local_epoch']:g} "
        f"(eps_c = {privacy['epsilon_central']:.2f} at T)",
    )
    baseline = metrics["baseline_nonprivate"]["accuracy"]
    axes.plot(range(1, len(baseline) + 1), baseline, linestyle="--", label="non-private, same C")
    axes.axhline(
        metrics["baseline_unconstrained_optimum"]["accuracy"],
        color="grey",
        linestyle=":",
        label="non-private optimum (scikit-learn)",
    )
    axes.set_xlabel("epoch")
    axes.set_ylabel("test accuracy")
    axes.set_ylim(0.0, 1.0)
    axes.set_title(
        f"{metrics['dataset']}: {metrics['devices']} devices, d = {metrics['dimension']}"
    )
    axes.legend(loc="lower right", fontsize="small")
    axes.grid(alpha=0.3)
    return _png(figure)


def accuracy_vs_epsilon(metrics: dict[str, Any]) -> bytes:
    """Test accuracy against eps_c so far, one curve (over the epochs) per eps_le of the grid."""
    figure = Figure(figsize=(6.4, 4.2))
    axes = figure.add_subplot()
    for row in metrics["grid"]:
        axes.plot(
            row["epsilon_central_so_far"],
            row["accuracy"],
            marker=".",
            label=f"eps_le = {row['epsilon_local_epoch']:g}",
        )
    axes.set_xscale("log")
    axes.set_xlabel(f"eps_c after each epoch (delta = {metrics['privacy']['delta']:g})")
    axes.set_ylabel("test accuracy")
    axes.set_ylim(0.0, 1.0)
    axes.set_title(f"{metrics['dataset']}: accuracy vs central epsilon (numpy epochs)")
    axes.legend(loc="lower right", fontsize="small")
    axes.grid(alpha=0.3, which="both")
    return _png(figure)


def accuracy_vs_devices(curve: dict[str, Any]) -> bytes:
    """Test accuracy against the number of devices n (log scale): LDP-SGD (mean over seeds, with
    each seed's point), the non-private baseline, and the fitted trend extended to ``trend_to``
    (``experiments.ldp_sgd.devices_curve``'s content)."""
    figure = Figure(figsize=(6.4, 4.2))
    axes = figure.add_subplot()
    rows = curve["rows"]
    counts = [row["devices"] for row in rows]
    for row in rows:
        axes.scatter([row["devices"]] * len(row["accuracy"]), row["accuracy"], s=8, c="C0")
    axes.plot(counts, [row["mean_accuracy"] for row in rows], marker="o", color="C0",
              label=f"LDP-SGD, eps_le = {curve['epsilon_local_epoch']:g}, T = {curve['epochs']}")  # fmt: skip
    axes.plot(counts, [row["nonprivate_accuracy"] for row in rows], linestyle="--", color="C1",
              label="non-private, same model, C and T")  # fmt: skip
    trend = curve["trend"]
    extended = [counts[0], *trend["devices"]]
    axes.plot(extended, [trend["a"] - trend["b"] / n**0.5 for n in extended], linestyle=":",
              color="C0", label="fit a - b/sqrt(n), extended")  # fmt: skip
    axes.set_xscale("log")
    axes.set_xlabel("devices n (one image each)")
    axes.set_ylabel("test accuracy")
    axes.set_ylim(0.0, 1.0)
    axes.set_title(f"{curve['dataset']}: accuracy vs devices")
    axes.legend(loc="lower right", fontsize="small")
    axes.grid(alpha=0.3, which="both")
    return _png(figure)

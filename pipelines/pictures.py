"""PNG pictures of analyzer results (matplotlib, Agg backend, no global pyplot state).

Each function returns the PNG bytes; the caller decides where they go (local disk or a Beam
file system), so nothing here touches files.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# Domains up to this size are drawn bucket by bucket; larger ones as estimate-vs-truth scatter.
MAX_BUCKETS_DRAWN = 64
# Scatter plots show at most this many buckets (the largest true or estimated values).
MAX_SCATTER_POINTS = 2000


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def image_comparison(
    estimate: np.ndarray,
    truth: np.ndarray | None,
    title: str,
    value_label: str = "count",
    postprocessed: np.ndarray | None = None,
    postprocessing: str = "",
) -> bytes:
    """The reconstructed 2-D histogram beside the true one (when known), on one colour scale;
    a third panel shows the post-processed estimate when given.

    Negative de-biased estimates are shown as they are (clipped to the colour scale's bottom),
    so the picture shows what the unbiased estimator really released.
    """
    estimate = np.asarray(estimate, dtype=np.float64)
    if estimate.ndim != 2:
        raise ValueError(f"estimate must be a 2-D array, got shape {estimate.shape}")
    panels = [("reconstructed (unbiased estimate)", estimate)]
    for label, values in (("true histogram", truth), (f"after {postprocessing}", postprocessed)):
        if values is None:
            continue
        values = np.asarray(values, dtype=np.float64)
        if values.shape != estimate.shape:
            raise ValueError(f"{label}: shape {values.shape} differs from {estimate.shape}")
        if label == "true histogram":
            truth = values
            panels.insert(0, (label, values))
        else:
            panels.append((label, values))
    reference = truth if truth is not None else estimate
    top = float(np.max(reference)) if reference.size else 1.0
    top = top if top > 0 else 1.0
    figure = Figure(figsize=(4.2 * len(panels) + 0.8, 4.4))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    image = None
    for axis, (label, values) in zip(axes, panels, strict=True):
        image = axis.imshow(values, cmap="gray", vmin=0.0, vmax=top, interpolation="nearest")
        axis.set_title(label, fontsize=10)
        axis.set_xticks([])
        axis.set_yticks([])
    figure.colorbar(image, ax=list(axes), shrink=0.85, label=value_label)
    figure.suptitle(title, fontsize=11)
    return _png(figure)


def buckets_to_show(truth: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the ``limit`` buckets with the largest true counts, chosen by truth alone."""
    return np.argsort(np.abs(truth), kind="stable")[::-1][:limit]


def estimate_vs_truth(
    buckets: np.ndarray,
    estimate: np.ndarray,
    stderr: np.ndarray,
    truth: np.ndarray | None,
    title: str,
    value_label: str = "count",
) -> bytes:
    """Estimates with ±2 standard-error bars, against the truth when known.

    Small domains are drawn bucket by bucket; larger ones as estimate against truth (or, without
    truth, the largest estimates by rank), limited to the buckets with the largest true counts.
    Buckets are chosen by truth alone, never by their estimate: choosing by the estimate would
    show only the buckets whose noise happened to be large and make an unbiased estimator look
    biased.
    """
    buckets = np.asarray(buckets)
    estimate = np.asarray(estimate, dtype=np.float64)
    stderr = np.asarray(stderr, dtype=np.float64)
    if not (buckets.shape == estimate.shape == stderr.shape) or estimate.ndim != 1:
        raise ValueError("buckets, estimate and stderr must be 1-D arrays of one length")
    if truth is not None:
        truth = np.asarray(truth, dtype=np.float64)
        if truth.shape != estimate.shape:
            raise ValueError(f"truth shape {truth.shape} differs from estimate {estimate.shape}")
    figure = Figure(figsize=(7.5, 4.5))
    axis = figure.subplots()
    if estimate.size <= MAX_BUCKETS_DRAWN:
        positions = np.arange(estimate.size)
        axis.errorbar(
            positions, estimate, yerr=2 * stderr, fmt="o", ms=4, capsize=3,
            label="estimate ± 2 s.e.",
        )  # fmt: skip
        if truth is not None:
            axis.plot(positions, truth, "x", color="crimson", ms=7, label="truth")
        step = max(1, estimate.size // 16)
        axis.set_xticks(positions[::step])
        axis.set_xticklabels([str(b) for b in buckets[::step]])
        axis.set_xlabel("bucket")
        axis.set_ylabel(value_label)
    elif truth is not None:
        shown = buckets_to_show(truth, MAX_SCATTER_POINTS)
        axis.errorbar(
            truth[shown], estimate[shown], yerr=2 * stderr[shown], fmt=".", ms=3,
            elinewidth=0.4, alpha=0.5, label="bucket: estimate ± 2 s.e.",
        )  # fmt: skip
        low, high = float(truth[shown].min()), float(truth[shown].max())
        axis.plot([low, high], [low, high], "-", color="crimson", lw=1, label="estimate = truth")
        axis.set_xlabel(f"true {value_label}")
        axis.set_ylabel(f"estimated {value_label}")
        if shown.size < estimate.size:
            title += f" ({shown.size} of {estimate.size} buckets: largest true counts)"
    else:
        shown = np.argsort(estimate, kind="stable")[::-1][:MAX_BUCKETS_DRAWN]
        axis.errorbar(
            np.arange(shown.size), estimate[shown], yerr=2 * stderr[shown], fmt="o", ms=3,
            capsize=2, label="estimate ± 2 s.e.",
        )  # fmt: skip
        axis.set_xlabel(f"rank (top {shown.size} of {estimate.size} buckets)")
        axis.set_ylabel(value_label)
    axis.axhline(0.0, color="gray", lw=0.5)
    axis.legend(fontsize=8)
    axis.set_title(title, fontsize=10)
    return _png(figure)


def longitudinal(
    periods: np.ndarray,
    estimate: np.ndarray,
    bound: np.ndarray | float,
    truth: np.ndarray | None,
    title: str,
) -> bytes:
    """The estimated marginals f̃_t over periods t with the error bound band, against f_t."""
    periods = np.asarray(periods)
    estimate = np.asarray(estimate, dtype=np.float64)
    if periods.shape != estimate.shape or estimate.ndim != 1:
        raise ValueError("periods and estimate must be 1-D arrays of one length")
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), estimate.shape)
    figure = Figure(figsize=(7.5, 4.2))
    axis = figure.subplots()
    axis.fill_between(
        periods, estimate - bound, estimate + bound, color="tab:blue", alpha=0.15,
        label="f̃_t ± error bound",
    )  # fmt: skip
    axis.plot(periods, estimate, "o-", ms=3, color="tab:blue", label="f̃_t (estimate)")
    if truth is not None:
        truth = np.asarray(truth, dtype=np.float64)
        if truth.shape != estimate.shape:
            raise ValueError(f"truth shape {truth.shape} differs from estimate {estimate.shape}")
        axis.plot(periods, truth, "s--", ms=3, color="crimson", label="f_t (truth)")
    axis.set_xlabel("period t")
    axis.set_ylabel("marginal count")
    axis.legend(fontsize=8)
    axis.set_title(title, fontsize=10)
    return _png(figure)

"""The PNG figures of Section VII: reconstructed images and RMSE curves, one set per table."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.lab import ExperimentLab, Outcome
from experiments.render import Table
from experiments.scenarios import GAUSSIAN, IMAGE_DATASETS, ONE_HOT, SKETCH, SKETCH_EXACT, Scenario
from simulators.exact import Dataset

# Pictures show images at most this many pixels wide (every s-th pixel of the estimate).
MAX_PICTURE_WIDTH = 480
# A grid cell left empty on purpose (None marks a scenario that could not run).
BLANK = np.empty((0, 0))


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def subsample(image: np.ndarray, max_width: int = MAX_PICTURE_WIDTH) -> np.ndarray:
    """Every s-th pixel in both directions, so that the picture is at most ``max_width`` wide.

    Pixels are picked, not averaged: the picture keeps the per-pixel noise the RMSE measures.
    """
    step = max(1, math.ceil(image.shape[1] / max_width))
    return image[::step, ::step]


def reconstruction_grid(
    title: str,
    row_labels: Sequence[str],
    column_labels: Sequence[str],
    panels: Sequence[Sequence[np.ndarray | None]],
    tops: Sequence[float],
) -> bytes:
    """A grid of grey images (rows x columns) on one scale per column, 0 to ``tops[column]``."""
    rows, cols = len(row_labels), len(column_labels)
    figure = Figure(figsize=(2.6 * cols + 1.2, 2.2 * rows + 0.8))
    axes = figure.subplots(rows, cols, squeeze=False)
    for r in range(rows):
        for c in range(cols):
            axis = axes[r][c]
            axis.set_xticks([])
            axis.set_yticks([])
            image = panels[r][c]
            if image is BLANK:
                axis.axis("off")
            elif image is None:
                axis.text(0.5, 0.5, "not run", ha="center", va="center", transform=axis.transAxes)
            else:
                axis.imshow(
                    subsample(image), cmap="gray", vmin=0.0, vmax=tops[c], interpolation="nearest"
                )
            if r == 0:
                axis.set_title(column_labels[c], fontsize=9)
            if c == 0:
                axis.set_ylabel(row_labels[r], fontsize=8)
    figure.suptitle(title, fontsize=11)
    return _png(figure)


def _image(outcome: Outcome, dataset: Dataset) -> np.ndarray | None:
    if outcome.estimate is None or not dataset.is_image:
        return None
    return outcome.estimate.reshape(dataset.grid)


def table_figures(table: Table, lab: ExperimentLab) -> dict[str, bytes]:
    """The PNG figures of one table, by file name."""
    config = lab.config
    if table.key in ("IV", "VIII", "IX"):
        key = {"IV": "horse", "VIII": "map", "IX": "child"}[table.key]
        return {f"{table.slug}.png": _image_table_figure(lab, key)}
    if table.key == "III":
        return {"table_03_reconstructions.png": _table_iii_figure(lab)}
    if table.key == "V":
        return {f"{table.slug}.png": _table_v_figure(lab)}
    if table.key == "I":
        return {f"{table.slug}.png": _heavy_hitter_figure(lab)}
    if table.key in ("VI", "VII"):
        mechanism = ONE_HOT if table.key == "VI" else SKETCH
        return {f"{table.slug}.png": _budget_split_figure(lab, mechanism, table.title)}
    del config
    return {}


def _image_table_figure(lab: ExperimentLab, key: str) -> bytes:
    config = lab.config
    dataset = lab.dataset(key)
    truth = lab.counts(key).reshape(dataset.grid)
    columns = [
        "Gaussian",
        "attribute frag.",
        *(f"τ = {t}" for t in config.fragment_counts),
        "count sketch",
    ]
    rows, labels = [], []
    for eps in config.central_epsilons:
        scenarios = [
            Scenario(key, GAUSSIAN, central_epsilon=eps),
            Scenario(key, ONE_HOT, central_epsilon=eps),
            *(
                Scenario(key, ONE_HOT, central_epsilon=eps, fragments=t)
                for t in config.fragment_counts
            ),
            Scenario(key, SKETCH, central_epsilon=eps),
        ]
        rows.append([_image(lab.outcome(s), dataset) for s in scenarios])
        labels.append(f"ε_c = {eps:g}")
    rows.insert(0, [truth] + [BLANK] * (len(columns) - 1))
    labels.insert(0, "truth")
    top = float(truth.max())
    return reconstruction_grid(
        f"{dataset.title}: reconstructions (unbiased estimates; grey scale 0 to {top:.0f})",
        labels,
        columns,
        rows,
        [top] * len(columns),
    )


def _table_iii_figure(lab: ExperimentLab) -> bytes:
    config = lab.config
    keys = IMAGE_DATASETS
    low = min(config.central_epsilons)
    row_specs = [
        (
            f"ε_ℓ = {config.table_iii_local_epsilon:g}",
            dict(mechanism=ONE_HOT, local_epsilon=config.table_iii_local_epsilon),
        ),
        (f"ε_c = {low:g}", dict(mechanism=ONE_HOT, central_epsilon=low)),
        ("ε_c = 1", dict(mechanism=ONE_HOT, central_epsilon=1.0)),
        ("sketch, ε_c ≥ 1", dict(mechanism=SKETCH, central_epsilon=1.0)),
    ]
    truths = [lab.counts(key).reshape(lab.dataset(key).grid) for key in keys]
    rows = [truths]
    for _, spec in row_specs:
        rows.append([_image(lab.outcome(Scenario(key, **spec)), lab.dataset(key)) for key in keys])
    return reconstruction_grid(
        "Table III: reconstructions (unbiased estimates)",
        ["truth", *(label for label, _ in row_specs)],
        [lab.dataset(key).title for key in keys],
        rows,
        [float(t.max()) for t in truths],
    )


def _table_v_figure(lab: ExperimentLab) -> bytes:
    config = lab.config
    dataset = lab.dataset("horse")
    truth = lab.counts("horse").reshape(dataset.grid)
    taus = (1, *config.fragment_counts)
    rows = [
        [
            _image(
                lab.outcome(Scenario("horse", SKETCH, central_epsilon=eps, fragments=t)),
                dataset,
            )
            for t in taus
        ]
        for eps in config.central_epsilons
    ]
    exact = _image(lab.outcome(Scenario("horse", SKETCH_EXACT)), dataset)
    rows.append([exact] + [BLANK] * (len(taus) - 1))
    rows.insert(0, [truth] + [BLANK] * (len(taus) - 1))
    labels = ["truth", *(f"ε_c ≥ {eps:g}" for eps in config.central_epsilons), "no privacy"]
    top = float(truth.max())
    return reconstruction_grid(
        "Table V: count-sketch reconstructions of Horse",
        labels,
        ["attribute frag.", *(f"τ = {t}" for t in config.fragment_counts)],
        rows,
        [top] * len(taus),
    )


def _heavy_hitter_figure(lab: ExperimentLab) -> bytes:
    config = lab.config
    truth = lab.counts("heavy-hitters").astype(np.float64)
    top = min(config.top_items, truth.size)
    order = np.argsort(-truth, kind="stable")[:top]
    ranks = np.arange(1, top + 1)
    epsilons = config.heavy_hitter_central_epsilons
    figure = Figure(figsize=(4.0 * len(epsilons), 3.6))
    axes = figure.subplots(1, len(epsilons), squeeze=False)[0]
    styles = [
        (GAUSSIAN, 1, "Gaussian"),
        (ONE_HOT, 1, "one-hot, attribute frag."),
        (SKETCH, 1, "count sketch"),
    ]
    for axis, eps in zip(axes, epsilons, strict=True):
        for mechanism, tau, label in styles:
            outcome = lab.outcome(
                Scenario("heavy-hitters", mechanism, central_epsilon=eps, fragments=tau)
            )
            if outcome.estimate is not None:
                axis.plot(
                    ranks,
                    np.maximum(outcome.estimate[order], 0.5),
                    ".",
                    markersize=1.5,
                    label=label,
                    alpha=0.6,
                )
        axis.plot(ranks, truth[order], "k-", linewidth=1.2, label="truth")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(f"ε_c = {eps:g}", fontsize=10)
        axis.set_xlabel("rank of the true count")
    axes[0].set_ylabel("respondents (estimates below 1 drawn at 0.5)")
    axes[-1].legend(fontsize=7, markerscale=6)
    figure.suptitle(f"Table I: estimates of the top {top:,} heavy hitters", fontsize=11)
    return _png(figure)


def _budget_split_figure(lab: ExperimentLab, mechanism: str, title: str) -> bytes:
    config = lab.config
    figure = Figure(figsize=(6.0, 4.0))
    axis = figure.subplots()
    for splits in config.budget_splits:
        outcomes = [
            lab.outcome(Scenario("horse", mechanism, central_epsilon=eps, splits=splits))
            for eps in config.central_epsilons
        ]
        totals = [o.privacy.epsilon_local for o in outcomes]
        line = axis.plot(totals, [o.rmse for o in outcomes], "o-", label=f"{splits} × ε_ℓ/{splits}")
        axis.plot(
            totals,
            [o.rmse_theory for o in outcomes],
            "--",
            color=line[0].get_color(),
            linewidth=0.8,
        )
    axis.set_xlabel("total local ε_ℓ")
    axis.set_ylabel("RMSE (dashed: theory)")
    axis.set_yscale("log")
    axis.legend(fontsize=8)
    axis.set_title(title, fontsize=9)
    return _png(figure)


# --------------------------------------------------------------------------------------------
# One row per table through the message-level Beam pipeline
# --------------------------------------------------------------------------------------------

# Messages one check run may make (respondents are cut to fit, to no fewer than

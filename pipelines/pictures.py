"""PNG pictures of analyzer results (matplotlib, Agg backend, no global pyplot state).

The drawing functions return PNG bytes and touch no files; :class:`DrawPictures` draws one
crowd at a time inside the analyzer pipeline (its summary entry and its own table rows, never
the whole table) and writes the PNGs under ``pictures/`` through Beam's file systems.
"""

from __future__ import annotations

import io
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.analyzer.arithmetic import HISTOGRAM, LONGITUDINAL, RecipeBook, is_longitudinal

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Domains up to this size are drawn bucket by bucket; larger ones as estimate-vs-truth scatter.
MAX_BUCKETS_DRAWN = 64
# Scatter plots show at most this many buckets (the largest true or estimated values).
MAX_SCATTER_POINTS = 2000


def _figure(**keywords: Any) -> Figure:
    """A matplotlib Figure, matplotlib imported only here: a worker process that unpickles
    :class:`DrawPictures` but draws nothing (every analyzer worker of a multi-process run)
    does not pay its import (~0.7 s of CPU)."""
    from matplotlib.figure import Figure

    return Figure(**keywords)


def _png(figure: Figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

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
    figure = _figure(figsize=(4.2 * len(panels) + 0.8, 4.4))
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
    figure = _figure(figsize=(7.5, 4.5))
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
    figure = _figure(figsize=(7.5, 4.2))
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


# ---------------------------------------------------------------------------------------------
# Pictures of an analysis, one crowd at a time
# ---------------------------------------------------------------------------------------------

PICTURES_DIR = "pictures"
# At most this many crowds get pictures (a run over many windows would otherwise flood DIR).
MAX_PICTURED_CROWDS = 24
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED


def _write_png(output: str, name: str, data: bytes) -> str:
    path = FileSystems.join(output, PICTURES_DIR, name)
    with FileSystems.create(path, compression_type=_UNCOMPRESSED) as sink:
        sink.write(data)
    return path


def slug(*parts: Any) -> str:
    text = "_".join(str(p) for p in parts if p is not None and p != "")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def day(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H%M", time.gmtime(ms / 1000))


_IMAGE_RANDOMIZERS = (
    "one_hot_rappor",
    "symmetric_one_hot",
    "asymmetric_one_hot",
    "report_fragmented",
    "zero_sum_histogram",
)


def _grid_side(recipe: Any, domain_size: int) -> int | None:
    """A square 2-D domain (the image-grid recipes: 64 x 64 cells) drawn as an image."""
    side = math.isqrt(domain_size)
    if recipe is None or recipe.randomizer not in _IMAGE_RANDOMIZERS:
        return None
    return side if side * side == domain_size and side >= 8 else None


def _truth_column(table: pa.Table) -> np.ndarray | None:
    if "truth" not in table.column_names:
        return None
    truth = table.column("truth").to_numpy(zero_copy_only=False).astype(np.float64)
    return None if np.isnan(truth).all() else truth


def histogram_pictures(
    output: str, crowd: Mapping[str, Any], table: pa.Table, recipe: Any
) -> list[str]:
    """PNGs of one estimated histogram crowd (its summary entry and its own table rows): for a
    square grid domain the reconstruction beside the truth, and the estimate against the truth
    with error bars."""
    table = table.sort_by("bucket")
    column = {n: table.column(n).to_numpy(zero_copy_only=False) for n in table.column_names}
    truth = _truth_column(table)
    scale = float(crowd.get("accuracy", {}).get("truth_scale", 1.0))
    if truth is not None and scale != 1.0:
        truth = truth * scale  # survivors' share, as in the RMSE
    privacy = crowd.get("privacy", {})
    eps_c = privacy.get("epsilon_central")
    title = (
        f"{crowd['recipe_id']} · {crowd['channel']}"
        + (f" · crowd {crowd['crowd_id']}" if crowd["crowd_id"] else "")
        + f" · {day(crowd['window_start'])}\n"
        f"n = {crowd['respondents_effective']:,.0f}, "
        f"ε_ℓ = {privacy.get('epsilon_local_all')}, "
        + (f"ε_c = {eps_c:.3g} ({privacy.get('bound')})" if eps_c is not None else "ε_c: none")
        + (f"; truth scaled by {scale:.3g} to n" if truth is not None and scale != 1.0 else "")
    )  # fmt: skip
    stem = slug(crowd["channel"], crowd["crowd_id"], day(crowd["window_start"]))
    written = []
    side = _grid_side(recipe, crowd["domain_size"])
    if side is not None and column["bucket"].size == side * side:
        post = column.get(f"estimate_{crowd.get('postprocessing')}")
        image = image_comparison(
            column["estimate"].reshape(side, side),
            None if truth is None else truth.reshape(side, side),
            title,
            postprocessed=None if post is None else post.reshape(side, side),
            postprocessing=crowd.get("postprocessing", ""),
        )
        written.append(_write_png(output, f"{stem}_image.png", image))
    chart = estimate_vs_truth(column["bucket"], column["estimate"], column["stderr"], truth, title)
    written.append(_write_png(output, f"{stem}_histogram.png", chart))
    return written


def longitudinal_picture(output: str, entry: Mapping[str, Any], table: pa.Table) -> str:
    """The PNG of one longitudinal round: f̃_t against f_t with Theorem 6's bound."""
    table = table.sort_by("period")
    bound = entry["error_bound"]
    title = (
        f"{entry['recipe_id']} · {entry['channel']} · round from "
        f"{day(entry['round_start'])}\nf̃_t (Algorithm 2) with Theorem 6 bound "
        f"{bound:,.0f} (β = {entry['error_bound_failure_probability']:g}), "
        f"n = {entry['respondents']:,.0f}"
    )
    image = longitudinal(
        table.column("period").to_numpy(),
        table.column("estimate").to_numpy(),
        bound,
        _truth_column(table),
        title,
    )
    stem = slug(entry["channel"], entry["crowd_id"], day(entry["round_start"]))
    return _write_png(output, f"{stem}_longitudinal.png", image)


class PicturedCrowds:
    """The crowd keys that get pictures: the first ``limit`` histogram crowds and the first
    ``limit`` longitudinal crowds in the summary's order (channel, recipe, crowd, window), fed
    one key at a time (repeats allowed): only the ``limit`` first distinct keys of each kind seen
    so far are held, never every crowd."""

    def __init__(self, limit: int = MAX_PICTURED_CROWDS) -> None:
        self.limit = limit
        # Per kind: the smallest distinct keys so far with their ranks, and the largest rank kept.
        self._chosen: dict[str, dict[tuple, tuple]] = {HISTOGRAM: {}, LONGITUDINAL: {}}
        self._largest: dict[str, tuple | None] = {HISTOGRAM: None, LONGITUDINAL: None}

    @staticmethod
    def _order(key: tuple) -> tuple:
        kind, start, end, channel, recipe_id, crowd_id = key
        return (channel, recipe_id, crowd_id or "", start, end, crowd_id is not None)

    def add(self, key: tuple) -> None:
        kept = self._chosen.get(key[0])
        if kept is None or key in kept or self.limit <= 0:
            return
        rank = self._order(key)
        largest = self._largest[key[0]]
        if len(kept) < self.limit:
            kept[key] = rank
            if largest is None or rank > largest:
                self._largest[key[0]] = rank
            return
        if rank >= largest:
            return
        del kept[max(kept, key=kept.__getitem__)]
        kept[key] = rank
        self._largest[key[0]] = max(kept.values())

    def chosen(self) -> frozenset:
        return frozenset(key for kept in self._chosen.values() for key in kept)


# The columns of PicturedCrowds._order, as picture_candidates builds them.
_ORDER_COLUMNS = ("channel", "recipe_id", "crowd", "start", "end", "named")
# picture_candidates first looks at this many rows per crowd that may be pictured.
CANDIDATE_ROWS_PER_CROWD = 4


def _first_rows(ordered: pa.Table, limit: int) -> pa.Table:
    """Rows of ``ordered`` (the :data:`_ORDER_COLUMNS`) holding its ``limit`` first distinct
    rows in that order: its :data:`CANDIDATE_ROWS_PER_CROWD` x ``limit`` smallest (a selection,
    not a sort) where they hold ``limit`` distinct rows, as they do unless a crowd repeats
    (instances release the same crowds; a longitudinal crowd is in every window), else the
    first ``limit`` distinct rows of a grouping, sorted. Only equal rows are ties, so the
    smallest rows that hold ``limit`` distinct ones hold the first ``limit``."""
    order = [(name, "ascending") for name in _ORDER_COLUMNS]
    taken = min(ordered.num_rows, CANDIDATE_ROWS_PER_CROWD * limit)
    smallest = ordered.take(pc.select_k_unstable(ordered, taken, order))
    if taken == ordered.num_rows or len(smallest.group_by(_ORDER_COLUMNS).aggregate([])) >= limit:
        return smallest
    return ordered.group_by(_ORDER_COLUMNS).aggregate([]).sort_by(order)[:limit]


def picture_candidates(
    table: pa.Table, book: RecipeBook, limit: int = MAX_PICTURED_CROWDS
) -> list[tuple] | None:
    """The keys (``arithmetic.crowd_key``) of the released crowds of recipes in ``book`` in
    ``table`` (crowd tables' rows, as ``crowd_tables.CrowdColumns`` holds them) that
    :class:`PicturedCrowds` may choose: per kind, the table's ``limit`` first distinct keys in
    its order, found by Arrow (:func:`_first_rows`; strings compare by their UTF-8 bytes, code
    point order, as Python's do). The first ``limit`` keys over many tables are among each
    table's own first ``limit``, so the driver looks at a few dozen crowds per batch of tables,
    not at each (0.18 s of Python for 100,000 crowds). None where the columns do not allow it
    (a null channel or recipe, a window whose length overflows): the caller then looks at each
    crowd."""
    if limit <= 0 or not table.num_rows:
        return []
    if table.column("channel").null_count or table.column("recipe_id").null_count:
        return None
    recipe_ids = table.column("recipe_id")
    kinds: dict[bool, list[str]] = {False: [], True: []}
    for recipe_id in pc.unique(recipe_ids).to_pylist():
        recipe = book.get(recipe_id)
        if recipe is not None:
            kinds[is_longitudinal(recipe)].append(recipe_id)
    released = pc.equal(table.column("status"), "released")
    keys: list[tuple] = []
    for longitudinal, ids in kinds.items():
        if not ids:
            continue
        part = table.filter(pc.and_(released, pc.is_in(recipe_ids, pa.array(ids, pa.string()))))
        if not part.num_rows:
            continue
        start, end = part.column("window_start_ms"), part.column("window_end_ms")
        if longitudinal:  # crowd_key: rounds span windows, keyed by the window's length
            try:
                end = pc.subtract_checked(end, start)
            except pa.ArrowInvalid:
                return None
            start = pa.array(np.zeros(part.num_rows, dtype=np.int64))
        crowd_id = part.column("crowd_id")
        columns = [
            part.column("channel"),
            part.column("recipe_id"),
            pc.fill_null(crowd_id, ""),
            start,
            end,
            pc.is_valid(crowd_id),
        ]
        rows = _first_rows(pa.table(columns, names=_ORDER_COLUMNS), limit)
        kind = LONGITUDINAL if longitudinal else HISTOGRAM
        for channel, recipe_id, crowd, start_ms, end_ms, named in dict.fromkeys(
            zip(*(rows.column(name).to_pylist() for name in _ORDER_COLUMNS), strict=True)
        ):
            keys.append((kind, start_ms, end_ms, channel, recipe_id, crowd if named else None))
    return keys


def pictured_crowds(keys: Iterable[tuple], limit: int = MAX_PICTURED_CROWDS) -> frozenset:
    """:class:`PicturedCrowds` of a stream of crowd keys."""
    pictured = PicturedCrowds(limit)
    for key in keys:
        pictured.add(key)
    return pictured.chosen()


class DrawPictures(beam.DoFn):
    """(crowd report, crowd table) -> paths of the crowd's PNGs under ``output/pictures/``:
    each crowd is drawn by the worker that estimated it, from its own rows only."""

    def __init__(self, output: str, book: RecipeBook) -> None:
        self._output = output
        self._book = book

    def process(self, element: tuple[Mapping[str, Any], pa.Table]) -> Iterator[str]:
        report, table = element
        if report.get("kind") == LONGITUDINAL:
            yield longitudinal_picture(self._output, report, table)
        elif "privacy" in report:
            yield from histogram_pictures(
                self._output, report, table, self._book.get(report["recipe_id"])
            )

"""``esa analyze``: the analyzer stage as a runnable pipeline (transforms/aggregate.py, analyze.py).

    esa analyze --input shuffled/ --output analysis/ [--input ...] [--recipe NAME|FILE ...]
        [--truth simulation/] [--postprocessing none|clip_nonnegative|norm_sub]
        [--runner=FnApiRunner | --direct_running_mode=multi_processing --direct_num_workers=2 |
         --runner=PortableRunner --job_endpoint=embed --environment_type=LOOPBACK]

Input: one release per shuffler instance, as ``esa shuffle`` writes it (``messages/``,
``manifest.avro``, ``metrics.json``). ``--input DIR`` is either a release or a directory of
``instance=<u>/`` releases; give ``--input`` once per release otherwise. The analyzer must know
which instance a release came from: the ``instance=<u>`` directory name, else the manifest's
``shuffler_instance``, else ``metrics.json``'s ``instance``.

Respondent counts: each respondent sends one census message to every instance and each randomized
message to one instance drawn from the recipe's instance weights π. The analyzer counts census
messages n_u per instance and crowd and de-biases with n_eff = Σ_u π_u n_u: unbiased for the
π-weighted surviving population when shufflers withhold crowds or delete respondents (Algorithm
3), and exactly n when nothing was deleted. From the manifests only the WITHHELD status is read
(for the notes); respondent counts there stay in the shuffler's trust domain.

Output (DIR): ``histograms.parquet`` (window_start, window_end, channel, recipe_id, crowd, bucket,
estimate [unbiased], stderr, raw_count, n, estimate_<postprocessing>, truth), ``longitudinal.parquet``
(f̃_t per period with Theorem 6's bound), ``summary.json`` (inputs, metrics, per-crowd privacy
report and accuracy, notes on withheld crowds), ``dead_letter/part-*.avro`` and PNG pictures
under ``pictures/``.

Other runners take the same flags plus their own (``--runner=FlinkRunner --flink_master=HOST:PORT``,
or ``--runner=DataflowRunner --project P --region R --temp_location gs://... --setup_file
./setup.py``); inputs and DIR must then be on a filesystem every worker reaches.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import pictures
from pipelines.cli import UsageError
from pipelines.options import AnalyzeOptions, with_default_runner
from schemas import SUPPORTED_SCHEMA_VERSIONS
from schemas.recipes import load_recipe, shipped_recipes
from transforms import analyze_core as core
from transforms import avro_io
from transforms.aggregate import AggregateReleases
from transforms.analyze import (
    HISTOGRAMS_FILE,
    LONGITUDINAL_FILE,
    SUMMARY_FILE,
    AnalysisConfig,
    EstimateCrowds,
    TruthSource,
    WriteAnalysis,
)
from transforms.shuffle import WriteDeadLetters

__all__ = ["Release", "discover_releases", "register", "run", "summary_table"]

PICTURES_DIR = "pictures"
# At most this many crowds get pictures (a run over many windows would otherwise flood DIR).
MAX_PICTURED_CROWDS = 24
_INSTANCE_DIR = re.compile(r"instance=(\d+)$")
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="Analyzer: de-bias released crowds into histograms, counters and a privacy report.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    AnalyzeOptions.add_cli_arguments(parser)
    parser.set_defaults(handler=_handle, accepts_pipeline_args=True)


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    options = PipelineOptions(pipeline_args, **AnalyzeOptions.cli_values(args))
    summary = run(options)
    print(summary_table(summary))
    print(f"results: {summary['inputs']['output']}")
    return 0 if summary["metrics"]["adds_up"] else 1


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One shuffler instance's release directory."""

    instance: int
    path: str


def _exists(path: str) -> bool:
    try:
        return FileSystems.exists(path)
    except Exception:  # noqa: BLE001 - an unreachable path simply is not there
        return False


def _match(pattern: str) -> list[str]:
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:  # noqa: BLE001 - no match
        return []


def _is_release(path: str) -> bool:
    return any(
        _exists(FileSystems.join(path, name))
        for name in ("manifest.avro", "metrics.json", "messages")
    )


def read_manifests(release: str) -> list[dict[str, Any]]:
    """CrowdManifest records of a release (batch: manifest.avro; streaming: manifest/*/*.avro)."""
    paths = [FileSystems.join(release, "manifest.avro")]
    paths = [p for p in paths if _exists(p)] or _match(
        FileSystems.join(release, "manifest", "*", "*.avro")
    )
    records: list[dict[str, Any]] = []
    for path in paths:
        for item in avro_io.read_avro_batches(path):
            if isinstance(item, avro_io.ColumnBatch):
                records.extend(item.columns.to_pylist())
    return records


def _read_json(path: str) -> dict[str, Any] | None:
    if not _exists(path):
        return None
    try:
        with FileSystems.open(path, compression_type=_UNCOMPRESSED) as handle:
            return json.loads(handle.read())
    except (OSError, ValueError):
        return None


def _release_instance(path: str, manifests: list[dict[str, Any]]) -> int | None:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    match = _INSTANCE_DIR.search(name)
    if match:
        return int(match.group(1))
    instances = {int(record["shuffler_instance"]) for record in manifests}
    if len(instances) == 1:
        return instances.pop()
    metrics = _read_json(FileSystems.join(path, "metrics.json")) or {}
    if isinstance(metrics.get("instance"), int):
        return int(metrics["instance"])
    return None


def discover_releases(inputs: Sequence[str]) -> list[Release]:
    """The releases ``--input`` names (see the module docstring); UsageError when the instance
    of a release cannot be told or two releases claim one instance."""
    if not inputs:
        raise UsageError("--input is required (a release, or a directory of instance=<u>/)")
    releases: list[Release] = []
    for given in inputs:
        given = given.rstrip("/") or "/"
        if _is_release(given):
            candidates = [given]
        else:
            candidates = sorted(
                {
                    path.rsplit("/", 1)[0]
                    for name in ("manifest.avro", "metrics.json")
                    for path in _match(FileSystems.join(given, "instance=*", name))
                }
                | {
                    path.rsplit("/", 4)[0]
                    for path in _match(
                        FileSystems.join(given, "instance=*", "messages", "*", "*", "*.avro")
                    )
                }
            )
            if not candidates:
                raise UsageError(f"--input {given!r} is neither a release nor holds instance=<u>/")
        for path in candidates:
            instance = _release_instance(path, read_manifests(path))
            if instance is None:
                raise UsageError(
                    f"cannot tell which shuffler instance released {path!r}: name the directory "
                    "instance=<u>"
                )
            releases.append(Release(instance, path))
    seen: dict[int, str] = {}
    for release in releases:
        if release.instance in seen:
            raise UsageError(
                f"instance {release.instance} released twice: {seen[release.instance]!r} and "
                f"{release.path!r}"
            )
        seen[release.instance] = release.path
    return sorted(releases, key=lambda r: r.instance)


def message_files(release: Release) -> list[str]:
    """The release's ShuffledMessage files (messages/window_start=*/channel=*/*.avro)."""
    return _match(FileSystems.join(release.path, "messages", "*", "*", "*.avro"))


def release_deletion(
    release: Release, fallback: tuple[float, float] | None
) -> tuple[float, float] | None:
    """(ε_cr, δ_cr) the release's shuffler used: metrics.json's ``deletion`` when it states it,
    else the ``--deletion-*`` flags; None for no randomized deletion."""
    metrics = _read_json(FileSystems.join(release.path, "metrics.json")) or {}
    stated = metrics.get("deletion")
    if isinstance(stated, Mapping) and stated.get("epsilon") is not None:
        return float(stated["epsilon"]), float(stated["delta"])
    return fallback


def recipe_book(names: Sequence[str] | None) -> core.RecipeBook:
    """The recipes to accept: the named ones, or every shipped recipe."""
    if not names:
        return core.RecipeBook(shipped_recipes())
    recipes = []
    for name in names:
        try:
            recipes.append(load_recipe(name))
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot load recipe {name!r}: {error}") from error
    return core.RecipeBook(recipes)


def truth_sources(
    truths: Sequence[str] | None, truth_recipe: str | None
) -> tuple[TruthSource, ...]:
    """``--truth`` (repeatable): simulation directories (their simulation.json names the recipe)
    or truth.parquet files."""
    return tuple(truth_source(truth, truth_recipe) for truth in truths or ())


def truth_source(truth: str, truth_recipe: str | None) -> TruthSource:
    """One ``--truth``: a simulation directory or a truth.parquet file."""
    truth = truth.rstrip("/")
    if truth.endswith(".parquet"):
        path, directory = truth, truth.rsplit("/", 1)[0] if "/" in truth else "."
    else:
        path, directory = FileSystems.join(truth, "truth.parquet"), truth
    if not _exists(path):
        raise UsageError(f"--truth: no {path!r}")
    recipe_id = truth_recipe
    if recipe_id is None:
        simulation = _read_json(FileSystems.join(directory, "simulation.json")) or {}
        recipe_id = simulation.get("recipe_id")
    if not recipe_id:
        raise UsageError("--truth: no simulation.json beside it; give --truth-recipe NAME@VERSION")
    return TruthSource(path, recipe_id)


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------


def _prepare_output(output: str | None, overwrite: bool) -> str:
    if not output:
        raise UsageError("--output DIR is required")
    existing = [
        name
        for name in (SUMMARY_FILE, HISTOGRAMS_FILE, LONGITUDINAL_FILE, "dead_letter", PICTURES_DIR)
        if _exists(FileSystems.join(output, name))
    ]
    if existing and not overwrite:
        raise UsageError(f"--output {output!r} already holds results ({existing[0]}); --overwrite")
    if existing:
        FileSystems.delete([FileSystems.join(output, name) for name in existing])
    return output


def run(options: PipelineOptions) -> dict[str, Any]:
    """Run the analyzer; returns summary.json's content (plus ``pictures`` and ``seconds``)."""
    values = options.view_as(AnalyzeOptions)
    output = _prepare_output(values.analyze_output, values.analyze_overwrite)
    if (values.analyze_deletion_epsilon is None) != (values.analyze_deletion_delta is None):
        raise UsageError("--deletion-epsilon and --deletion-delta go together")
    fallback = None
    if values.analyze_deletion_epsilon is not None:
        fallback = (values.analyze_deletion_epsilon, values.analyze_deletion_delta)
    releases = discover_releases(values.analyze_input or [])
    book = recipe_book(values.analyze_recipe)
    config = AnalysisConfig(
        book=book,
        postprocessing=values.analyze_postprocessing,
        failure_probability=values.analyze_failure_probability,
        deletion={
            r.instance: d for r in releases if (d := release_deletion(r, fallback)) is not None
        },
        truth=truth_sources(values.analyze_truth, values.analyze_truth_recipe),
    )
    files = [(release.instance, path) for release in releases for path in message_files(release)]
    manifests = [
        {key: record.get(key) for key in core.MANIFEST_FIELDS}
        for release in releases
        for record in read_manifests(release.path)
    ]
    inputs = {
        "releases": [{"instance": r.instance, "path": r.path} for r in releases],
        "message_files": len(files),
        "recipes": book.ids(),
        "truth": [source.path for source in config.truth],
        "postprocessing": config.postprocessing,
        "deletion": {str(u): list(d) for u, d in config.deletion.items()},
        "output": output,
    }
    with_default_runner(options)
    started = time.monotonic()
    pipeline = beam.Pipeline(options=options)
    aggregated = (
        pipeline
        | "ReleaseFiles" >> beam.Create(files)
        | "SpreadFiles" >> beam.Reshuffle()
        | "Aggregate"
        >> AggregateReleases(
            book,
            SUPPORTED_SCHEMA_VERSIONS,
            batch_records=values.analyze_batch_records,
            dense_limit=values.analyze_dense_limit,
        )
    )
    estimates = aggregated.crowds | "EstimateCrowds" >> EstimateCrowds(config)
    _ = aggregated.dead_letters | "WriteDeadLetters" >> WriteDeadLetters(output)
    _ = (estimates, aggregated.counts) | "WriteAnalysis" >> WriteAnalysis(
        output, config, inputs, manifests
    )
    pipeline.run().wait_until_finish()
    summary = _read_json(FileSystems.join(output, SUMMARY_FILE))
    if summary is None:
        raise RuntimeError(f"the pipeline finished without writing {output}/{SUMMARY_FILE}")
    summary["seconds"] = round(time.monotonic() - started, 3)
    summary["pictures"] = [] if values.analyze_no_pictures else draw_pictures(output, summary, book)
    return summary


# ---------------------------------------------------------------------------------------------
# Pictures and the short table
# ---------------------------------------------------------------------------------------------


def _read_table(path: str) -> pa.Table | None:
    if not _exists(path):
        return None
    with FileSystems.open(path, compression_type=_UNCOMPRESSED) as handle:
        return pq.read_table(io.BytesIO(handle.read()))


def _write_png(output: str, name: str, data: bytes) -> str:
    path = FileSystems.join(output, PICTURES_DIR, name)
    with FileSystems.create(path, compression_type=_UNCOMPRESSED) as sink:
        sink.write(data)
    return path


def _slug(*parts: Any) -> str:
    text = "_".join(str(p) for p in parts if p is not None and p != "")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def _day(ms: int) -> str:
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


def draw_pictures(output: str, summary: Mapping[str, Any], book: core.RecipeBook) -> list[str]:
    """PNGs: for square grid domains the reconstruction beside the truth; for every histogram
    the estimate against the truth with error bars; for longitudinal rounds f̃_t against f_t."""
    written: list[str] = []
    histograms = _read_table(FileSystems.join(output, HISTOGRAMS_FILE))
    crowds = [c for c in summary.get("histograms", []) if "privacy" in c][:MAX_PICTURED_CROWDS]
    if histograms is not None and histograms.num_rows and crowds:
        window_ms = histograms.column("window_start").cast(pa.int64()).to_numpy()
        crowd_column = histograms.column("crowd").to_pylist()
        channel = np.asarray(histograms.column("channel").to_pylist(), dtype=object)
        recipe_column = np.asarray(histograms.column("recipe_id").to_pylist(), dtype=object)
        crowd_array = np.asarray(crowd_column, dtype=object)
        names = histograms.column_names
        for crowd in crowds:
            rows = np.flatnonzero(
                (window_ms == crowd["window_start"])
                & (channel == crowd["channel"])
                & (recipe_column == crowd["recipe_id"])
                & (crowd_array == crowd["crowd_id"])
            )
            if rows.size == 0:
                continue
            part = histograms.take(pa.array(rows))
            column = {name: part.column(name).to_numpy(zero_copy_only=False) for name in names}
            truth = column.get("truth")
            if truth is not None and np.isnan(truth.astype(np.float64)).all():
                truth = None
            scale = float(crowd.get("accuracy", {}).get("truth_scale", 1.0))
            if truth is not None and scale != 1.0:
                truth = truth.astype(np.float64) * scale  # survivors' share, as in the RMSE
            recipe = book.get(crowd["recipe_id"])
            privacy = crowd.get("privacy", {})
            eps_c = privacy.get("epsilon_central")
            title = (
                f"{crowd['recipe_id']} · {crowd['channel']}"
                + (f" · crowd {crowd['crowd_id']}" if crowd["crowd_id"] else "")
                + f" · {_day(crowd['window_start'])}\n"
                f"n = {crowd['respondents_effective']:,.0f}, "
                f"ε_ℓ = {privacy.get('epsilon_local_all')}, "
                + (f"ε_c = {eps_c:.3g} ({privacy.get('bound')})" if eps_c is not None else "ε_c: none")
                + (f"; truth scaled by {scale:.3g} to n" if truth is not None and scale != 1.0 else "")
            )  # fmt: skip
            stem = _slug(crowd["channel"], crowd["crowd_id"], _day(crowd["window_start"]))
            side = _grid_side(recipe, crowd["domain_size"])
            order = np.argsort(column["bucket"])
            if side is not None and column["bucket"].size == side * side:
                post_name = f"estimate_{crowd.get('postprocessing')}"
                post = column.get(post_name)
                image = pictures.image_comparison(
                    column["estimate"][order].reshape(side, side),
                    None if truth is None else truth[order].reshape(side, side),
                    title,
                    postprocessed=None if post is None else post[order].reshape(side, side),
                    postprocessing=crowd.get("postprocessing", ""),
                )
                written.append(_write_png(output, f"{stem}_image.png", image))
            chart = pictures.estimate_vs_truth(
                column["bucket"][order],
                column["estimate"][order],
                column["stderr"][order],
                None if truth is None else truth[order],
                title,
            )
            written.append(_write_png(output, f"{stem}_histogram.png", chart))
    longitudinal = _read_table(FileSystems.join(output, LONGITUDINAL_FILE))
    rounds = summary.get("longitudinal", [])[:MAX_PICTURED_CROWDS]
    if longitudinal is not None and longitudinal.num_rows:
        round_ms = longitudinal.column("round_start").cast(pa.int64()).to_numpy()
        channel = np.asarray(longitudinal.column("channel").to_pylist(), dtype=object)
        crowd_array = np.asarray(longitudinal.column("crowd").to_pylist(), dtype=object)
        for entry in rounds:
            rows = np.flatnonzero(
                (round_ms == entry["round_start"])
                & (channel == entry["channel"])
                & (crowd_array == entry["crowd_id"])
            )
            if rows.size == 0:
                continue
            part = longitudinal.take(pa.array(rows)).sort_by("period")
            truth = (
                part.column("truth").to_numpy(zero_copy_only=False)
                if "truth" in part.column_names
                else None
            )
            if truth is not None and np.isnan(truth.astype(np.float64)).all():
                truth = None
            bound = entry["error_bound"]
            title = (
                f"{entry['recipe_id']} · {entry['channel']} · round from "
                f"{_day(entry['round_start'])}\nf̃_t (Algorithm 2) with Theorem 6 bound "
                f"{bound:,.0f} (β = {entry['error_bound_failure_probability']:g}), "
                f"n = {entry['respondents']:,.0f}"
            )
            image = pictures.longitudinal(
                part.column("period").to_numpy(),
                part.column("estimate").to_numpy(),
                bound,
                truth,
                title,
            )
            stem = _slug(entry["channel"], entry["crowd_id"], _day(entry["round_start"]))
            written.append(_write_png(output, f"{stem}_longitudinal.png", image))
    return written


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def summary_table(summary: Mapping[str, Any]) -> str:
    """The short table ``esa analyze``/``esa run`` print: per crowd ε_ℓ, ε_c (bound), n, RMSE."""
    header = (
        "crowd", "window", "n", "eps_l_inf", "eps_l_1", "eps_c", "bound", "eps_c w/o frag",
        "RMSE", "s.e. (rms)",
    )  # fmt: skip
    rows = []
    for crowd in summary.get("histograms", []):
        privacy = crowd.get("privacy", {})
        accuracy = crowd.get("accuracy", {})
        rows.append(
            (
                _slug(crowd["channel"], crowd["crowd_id"]),
                _day(crowd["window_start"]),
                _fmt(crowd.get("respondents_effective"), ",.0f"),
                _fmt(privacy.get("epsilon_local_all")),
                _fmt(privacy.get("epsilon_local_one")),
                _fmt(privacy.get("epsilon_central_total", privacy.get("epsilon_central"))),
                _fmt(privacy.get("bound")),
                _fmt(privacy.get("epsilon_central_without_attribute_fragmentation")),
                _fmt(accuracy.get("rmse"), ".4g"),
                _fmt(accuracy.get("stderr_rms"), ".4g"),
            )
        )
    for entry in summary.get("longitudinal", []):
        privacy = entry.get("privacy", {})
        accuracy = entry.get("accuracy", {})
        rows.append(
            (
                _slug(entry["channel"], entry["crowd_id"]) + " (f̃_t)",
                _day(entry["round_start"]),
                _fmt(entry.get("respondents"), ",.0f"),
                _fmt(privacy.get("epsilon_local_all")),
                _fmt(privacy.get("epsilon_local_one")),
                _fmt(privacy.get("epsilon_central_total", privacy.get("epsilon_central"))),
                _fmt(privacy.get("bound")),
                "-",
                _fmt(accuracy.get("rmse"), ".4g"),
                f"bound {entry['error_bound']:,.0f}",
            )
        )
    lines = []
    if rows:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for row in rows:
            lines.append("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
    else:
        lines.append("no crowd was estimated")
    for note in summary.get("withheld", []):
        lines.append(
            f"note: {note['channel']} {note['crowd_id'] or ''} {_day(note['window_start'])}: "
            f"{note['note']} (by instance {', '.join(note['withheld_by'])})"
        )
    metrics = summary.get("metrics", {})
    lines.append(
        f"messages read {metrics.get('read', 0):,}: census {metrics.get('census', 0):,}, "
        f"randomized {metrics.get('messages', 0):,}, dead-lettered "
        f"{metrics.get('dead_lettered', 0):,}"
    )
    return "\n".join(lines)

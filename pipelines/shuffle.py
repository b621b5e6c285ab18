"""``esa shuffle``: the shuffler stage as a runnable pipeline (transforms/shuffle.py).

    esa shuffle --input 'reports/*.avro' --output shuffled/ [--crowd-threshold 100]
        [--deletion-epsilon 1.0 --deletion-delta 1e-6] [--window 1d] [--instance 0]
        [--runner=FnApiRunner | --runner=PortableRunner --job_endpoint=embed
         --environment_type=LOOPBACK | --direct_running_mode=multi_processing ...]

Batch mode reads the files matching ``--input`` once. With Beam's ``--streaming`` flag the
pipeline watches ``--input`` for new files (every ``--watch-interval`` seconds, until
``--watch-for`` seconds have passed), windows by event time with the watermark, and dead-letters
data that arrives after its window was released (``late_data``).

Each of the K shuffler instances is a separate run: ``--instance I`` on that instance's inputs
(other instances' reports are dead-lettered ``wrong_instance``). Without ``--instance`` one run
serves every instance, keeping them apart in the crowd key.

Output (DIR): ``messages/window_start=<ms>/channel=<name>/part-<random>.avro`` (ShuffledMessage),
``manifest.avro`` (one CrowdManifest per crowd; per window under ``manifest/`` when streaming),
``dead_letter/part-*.avro`` and ``metrics.json`` (read = released + deleted + withheld +
dead-lettered, checked). Intermediate spill files live in ``DIR/_spill-<random>/`` during the run.

Other runners: Flink/Spark/Dataflow take the same flags plus their own (``--runner=FlinkRunner
--flink_master=HOST:PORT``, or ``--runner=DataflowRunner --project P --region R
--temp_location gs://... --setup_file ./setup.py``); DIR must then be on a filesystem every
worker reaches (e.g. ``gs://``).
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.utils.timestamp import Timestamp

from pipelines.cli import UsageError
from pipelines.options import (
    ShuffleOptions,
    add_stage_arguments,
    stage_option_values,
    with_default_runner,
)
from schemas import SUPPORTED_SCHEMA_VERSIONS
from transforms import shuffle as shuffle_transforms
from transforms import shuffle_core as core


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "shuffle",
        help="Shuffler: threshold, randomized deletion, strip and permute report crowds.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_stage_arguments(parser, ShuffleOptions)
    parser.set_defaults(handler=_handle, accepts_pipeline_args=True)


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    values = stage_option_values(args, ShuffleOptions)
    options = PipelineOptions(pipeline_args, **values)
    summary = run(options)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0 if summary.get("adds_up") else 1


def _routes(recipe_names: list[str] | None) -> dict[str, core.RecipeRoute]:
    from schemas import recipes

    if not recipe_names:
        return core.routes_from_recipes(recipes.shipped_recipes())
    loaded = {}
    for name in recipe_names:
        try:
            recipe = recipes.load_recipe(name)
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot load recipe {name!r}: {error}") from error
        loaded[recipe.id] = recipe
    return core.routes_from_recipes(loaded)


def shuffle_config(
    options: ShuffleOptions,
    streaming: bool,
    routes: Mapping[str, core.RecipeRoute] | None = None,
) -> shuffle_transforms.ShuffleConfig:
    """The ShuffleConfig an options object describes (``routes`` overrides ``--recipe``)."""
    epsilon, delta = options.deletion_epsilon, options.deletion_delta
    if (epsilon is None) != (delta is None):
        raise UsageError("--deletion-epsilon and --deletion-delta go together")
    deletion = None if epsilon is None else core.DeletionParameters(epsilon, delta)
    if options.instance is not None and options.instance < 0:
        raise UsageError(f"--instance must be >= 0, got {options.instance}")
    rules = core.ValidationRules(
        routes=dict(routes) if routes is not None else _routes(options.recipe),
        supported_versions=frozenset(SUPPORTED_SCHEMA_VERSIONS),
        instance=options.instance,
    )
    return shuffle_transforms.ShuffleConfig(
        rules=rules,
        crowd_threshold=options.crowd_threshold,
        deletion=deletion,
        window=core.WindowSpec(period_ms=core.parse_duration_ms(options.window)),
        streaming=streaming,
        batch_records=options.batch_records,
        messages_per_shard=options.messages_per_shard,
        messages_per_file=options.messages_per_file,
    )


def _input_paths(pattern: str) -> list[str]:
    try:
        matches = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # noqa: BLE001 - a bad pattern is the user's to fix
        raise UsageError(f"cannot list --input {pattern!r}: {error}") from error
    paths = sorted(metadata.path for metadata in matches)
    if not paths:
        raise UsageError(f"--input {pattern!r} matches no file")
    return paths


def _check_output(output: str) -> None:
    for name in ("manifest.avro", "messages", "metrics.json"):
        if FileSystems.exists(FileSystems.join(output, name)):
            raise UsageError(f"--output {output!r} already holds a release ({name}); use a new one")


def run(
    options: PipelineOptions, routes: Mapping[str, core.RecipeRoute] | None = None
) -> dict[str, Any]:
    """Run the shuffler pipeline; returns the metrics summary (also in DIR/metrics.json)."""
    shuffle_options = options.view_as(ShuffleOptions)
    if not shuffle_options.input or not shuffle_options.output:
        raise UsageError("--input and --output are required")
    options = with_default_runner(options)
    streaming = bool(options.view_as(StandardOptions).streaming)
    config = shuffle_config(shuffle_options, streaming, routes)
    output = shuffle_options.output
    _check_output(output)
    spill_dir = FileSystems.join(output, f"_spill-{secrets.token_hex(8)}")
    paths = None if streaming else _input_paths(shuffle_options.input)

    started = time.monotonic()
    try:
        pipeline = beam.Pipeline(options=options)
        if streaming:
            stop = (
                Timestamp.now() + shuffle_options.watch_for
                if shuffle_options.watch_for is not None
                else None
            )
            match_arguments: dict[str, Any] = {"interval": shuffle_options.watch_interval}
            if stop is not None:
                match_arguments["stop_timestamp"] = stop
            input_paths = (
                pipeline
                | "WatchInput" >> fileio.MatchContinuously(shuffle_options.input, **match_arguments)
                | "FilePath" >> beam.Map(lambda metadata: metadata.path)
            )
        else:
            input_paths = (
                pipeline | "InputPaths" >> beam.Create(paths) | "SpreadFiles" >> beam.Reshuffle()
            )
        outputs = input_paths | "Shuffle" >> shuffle_transforms.ShuffleReports(config, spill_dir)
        outputs.released | "WriteMessages" >> shuffle_transforms.WriteShuffledMessages(output)
        outputs.dead_letters | "WriteDeadLetters" >> shuffle_transforms.WriteDeadLetters(output)
        outputs.manifests | "WriteManifests" >> shuffle_transforms.WriteManifests(output, streaming)
        outputs.counts | "WriteMetrics" >> shuffle_transforms.WriteMetrics(output, streaming)
        result = pipeline.run()
        result.wait_until_finish()
    finally:
        if FileSystems.exists(spill_dir):
            FileSystems.delete([spill_dir])
    elapsed = time.monotonic() - started

    metrics_path = FileSystems.join(output, "metrics.json")
    with FileSystems.open(metrics_path) as handle:
        summary = json.loads(handle.read())
    summary["seconds"] = round(elapsed, 3)
    # What a reader of this release needs to state its privacy (pipelines/analyze.py reads both):
    # which instance made it, and the (eps_cr, delta_cr) of Algorithm 3 if it deleted.
    summary["instance"] = shuffle_options.instance
    summary["deletion"] = (
        {"epsilon": config.deletion.epsilon, "delta": config.deletion.delta}
        if config.deletion is not None
        else None
    )
    counters = _beam_counters(result)
    summary["beam_counters"] = counters
    if counters is not None:
        rejected = sum(value for name, value in counters.items() if name.startswith("rejected_"))
        accounted = rejected + sum(
            counters.get(name, 0)
            for name in (
                shuffle_transforms.RELEASED,
                shuffle_transforms.DELETED,
                shuffle_transforms.WITHHELD,
            )
        )
        summary["beam_counters_add_up"] = counters.get(shuffle_transforms.READ, 0) == accounted
    with FileSystems.create(metrics_path) as handle:
        handle.write(json.dumps(summary, indent=2, sort_keys=True).encode())
    return summary


def _beam_counters(result: Any) -> dict[str, int] | None:
    """The Beam counters of the run (committed, else attempted), or None if the runner has none."""
    try:
        counters = result.metrics().query(
            beam.metrics.MetricsFilter().with_namespace(shuffle_transforms.METRICS_NAMESPACE)
        )["counters"]
    except Exception:  # noqa: BLE001 - not every runner reports metrics
        return None
    totals: dict[str, int] = {}
    for counter in counters:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + int(value or 0)
    return totals

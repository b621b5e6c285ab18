"""``esa simulate``: a simulated device fleet writing Report files.

    esa simulate --recipe NAME|FILE --population SPEC [--respondents N] --output DIR [--seed S]
        [--rounds R] [--start 2024-01-01] [--device-budget EPS] [--query-class-fields F,G]
        [--instance-weights W,W,...] [--no-device-budget] [--codec deflate|null|snappy]
        [--collector URL,URL,... --device-credentials DIR [--collector-ca ca.crt]
         [--connections N] [--upload-retries R]]
        [--runner=FnApiRunner | --direct_running_mode=multi_processing --direct_num_workers=2 |
         --runner=PortableRunner --job_endpoint=embed --environment_type=LOOPBACK]

Population specs: ``uniform``, ``zipf[,exponent=S]``, ``heavy-hitters[,heavy=H,exponent=A]``
(esa-privacy-revisited VII-A), ``image:NAME[,size=RxC]`` (VII-B: one respondent per unit of
luminosity; ``disc`` and ``gradient`` are generated, ``horse``, ``camera`` and ``moon`` need
``pip install .[images]``, anything else is read as an image file), ``longitudinal[,changes=K]``.
Any spec takes natural crowds (``simulators/crowds.py``): ``crowds=C[,crowd_exponent=S]
[,crowd_name=NAME]`` gives each respondent one of C crowd ids (``NAME-0`` ..), sizes ∝ rank^-S, so
shufflers threshold each crowd on its own and small crowds are withheld.

Output (DIR): ``instance=<u>/reports-<shard>.avro`` (schemas/report.avsc; each shuffler instance
can run alone on its own directory), ``truth.parquet`` (true counts per window and bucket of the
devices that reported: window, window_start, bucket, count; absent buckets are 0; longitudinal
bucket 1 counts users in state True) and ``simulation.json`` (recipe, population, respondents,
seed, refusals, messages per instance, codec, files), and, written last, the commit record
``_COMMIT.json`` (format "esa-reports/1", ``schemas/release/commit.py``: every file with its size,
record count and SHA-256). Everything is first written to a hidden temporary sibling
``.DIR.tmp-<random>``, committed there and only then renamed to DIR, so DIR appears complete
with its ``_COMMIT.json`` or not at all, and is removed on failure (a killed run leaves nothing
under DIR; its stale temporary sibling is removed by the next run). An existing DIR is
replaced only with ``--overwrite``. DIR must be a local directory, or one mounted on every worker.

With ``--collector`` (one ``https://`` URL per shuffler instance, ``esa collect``), each
simulated device then uploads its reports for each instance to that instance's collector,
signed with its enrolment key (``--device-credentials``, ``esa keys enrol``), over
``--connections`` concurrent connections with retries and idempotent report ids
(``simulators/uploads.py``); the summary printed gains ``uploads`` (stored, duplicates,
retries, failed) and the exit status is 1 if any upload failed.

The pipeline passes shard descriptors (index, respondent range, SeedSequence child of the seed)
through ``beam.Create``; each worker generates its shard's population slice, runs the devices,
encodes and writes its files itself, and a combiner adds the shard summaries.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline import device_key_flags
from pipelines.commandline.main import UsageError
from pipelines.commandline.options import with_default_runner
from pipelines.commandline.progress import counted_stage
from pipelines.commandline.simulate_options import SimulateOptions, parse_start_ms
from pipelines.default_populations import default_population
from pipelines.engines.new_pipeline import new_pipeline
from schemas import SCHEMA_VERSION
from schemas.recipes import load_recipe
from schemas.release import commit
from simulators.plan import ShardSummary, SimulationPlan
from simulators.prio3_devices import prio3_metadata
from simulators.sealing import sealing_metadata
from simulators.shards import ShardContext, shard_file_name
from transforms.devices.encode import CombineShardSummaries, WriteReportShards

__all__ = ["register", "run", "plan_from_options"]

TRUTH_FILE = "truth.parquet"
SUMMARY_FILE = "simulation.json"


def register(subparsers: Any) -> None:
    """Add ``esa simulate``."""
    parser = subparsers.add_parser(
        "simulate",
        help="Simulate a device fleet: populations in, sharded Avro report files out.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    SimulateOptions.add_cli_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="Print simulation.json instead of a short summary."
    )
    parser.set_defaults(handler=_handle_simulate, accepts_pipeline_args=True)


def _handle_simulate(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    options = PipelineOptions(pipeline_args, **SimulateOptions.cli_values(args))
    if args.simulate_stream:  # files appear window after window
        from pipelines import stream_simulate

        summary = stream_simulate.run(options, run)
    else:
        summary = run(options)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        from pipelines.commandline.summaries import simulation_summary

        print(simulation_summary(summary, options.view_as(SimulateOptions).simulate_output))
    uploads = summary.get("uploads")
    return 1 if uploads and uploads["failed"] else 0


def _collector_urls(values: SimulateOptions, instances: int) -> list[str] | None:
    if values.simulate_collector is None:
        return None
    urls = [url.strip() for url in values.simulate_collector.split(",")]
    if len(urls) != instances:
        raise UsageError(
            f"--collector needs one URL per shuffler instance: {instances}, got {len(urls)}"
        )
    return urls


def upload_simulation(
    directory: Path,
    instances: int,
    urls: list[str],
    credentials_path: str,
    ca_file: str | None,
    connections: int = 16,
    retries: int = 8,
) -> dict[str, Any]:
    """Each simulated device uploads its reports to its instances' collectors
    (``simulators/uploads.py``); returns what the uploads did."""
    from schemas.crypto.device_keys import load_credentials
    from schemas.crypto.key_files import KeyError_
    from simulators.uploads import upload_files

    try:
        credentials = load_credentials(credentials_path)
    except KeyError_ as error:
        raise UsageError(str(error)) from None
    summary = upload_files(directory, instances, urls, credentials, ca_file, connections, retries)
    return summary.as_dict()


def _parse_start(text: str) -> int:
    try:
        return parse_start_ms(text)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _parse_list(text: str | None, flag: str, convert: Any) -> tuple[Any, ...] | None:
    if text is None:
        return None
    try:
        items = tuple(convert(item.strip()) for item in text.split(",") if item.strip())
    except ValueError:
        raise UsageError(f"{flag} must be a comma-separated list, got {text!r}") from None
    if not items:
        raise UsageError(f"{flag} must not be empty")
    return items


def plan_from_options(options: PipelineOptions) -> SimulationPlan:
    """A validated plan from the ``simulate_*`` options (UsageError/ValueError on bad input)."""
    values = options.view_as(SimulateOptions)
    recipe = load_recipe(values.simulate_recipe)
    seed = values.simulate_seed
    if seed is None:
        seed = secrets.randbits(63)
    elif seed < 0:
        raise UsageError(f"--seed must be >= 0, got {seed}")
    if values.simulate_rounds is None or values.simulate_rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {values.simulate_rounds}")
    population = values.simulate_population
    if population is None:  # image recipes keep the generated disc; others what esa run picks
        fitting = default_population(recipe)
        population = "image:disc" if fitting.startswith("image:") else fitting
    return SimulationPlan.for_recipe(
        recipe,
        population,
        seed,
        respondents=values.simulate_respondents,
        rounds=values.simulate_rounds,
        start_ms=_parse_start(values.simulate_start),
        device_budget=values.simulate_device_budget,
        query_class_fields=_parse_list(
            values.simulate_query_class_fields, "--query-class-fields", str
        ),
        instance_weights=_parse_list(values.simulate_instance_weights, "--instance-weights", float),
        enforce_budget=not values.simulate_no_device_budget,
        codec=values.simulate_codec,
        compression_level=values.simulate_compression_level,
        messages_per_shard=values.simulate_messages_per_shard,
        messages_per_chunk=values.simulate_messages_per_chunk,
        public_key_json=device_key_flags.public_key_json(
            values.simulate_public_key
        ),  # sealed payloads
        aggregator_keys_json=device_key_flags.aggregator_keys_json(
            values.simulate_aggregator_keys, recipe
        ),  # prio3 recipes: the two aggregators' keys
    )


def _check_output(output: str | None, overwrite: bool) -> Path:
    if not output:
        raise UsageError("--output DIR is required")
    path = Path(output)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise UsageError(
            f"--output {output} exists and is not empty; pass --overwrite to replace it"
        )
    return path


def _remove_stale_staging(output: Path) -> None:
    """Temporary siblings left by killed runs into the same DIR (never committed)."""
    for stale in output.parent.glob(f".{output.name}.tmp-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def commit_outputs(directory: Path, summary: dict[str, Any]) -> str:
    """Writes ``directory/_COMMIT.json`` (format "esa-reports/1") listing every file in it."""
    names = sorted(
        str(path.relative_to(directory))
        for path in directory.rglob("*")
        if path.is_file() and path.name != commit.COMMIT_FILE
    )
    files = [commit.file_entry(str(directory), name) for name in names]
    return commit.write_commit(
        str(directory),
        {
            "format": commit.REPORTS_FORMAT,
            "recipe_id": summary.get("recipe_id"),
            "shuffler_instances": summary.get("shuffler_instances"),
            "seed": summary.get("seed"),
            "files": files,
            "records": sum(f["records"] or 0 for f in files if f["path"].endswith(".avro")),
        },
    )


class _WriteOutputs(beam.DoFn):
    """Writes truth.parquet and simulation.json from the combined summary."""

    def __init__(self, directory: str, metadata: dict[str, Any], window_ms: int, start_ms: int):
        self._directory = directory
        self._metadata = metadata
        self._window_ms = window_ms
        self._start_ms = start_ms

    def process(self, summary: ShardSummary) -> Any:
        order = np.lexsort((summary.truth_bucket, summary.truth_window))
        window = summary.truth_window[order]
        table = pa.table(
            {
                "window": pa.array(window, pa.int64()),
                "window_start": pa.array(
                    self._start_ms + window * self._window_ms, pa.timestamp("ms", tz="UTC")
                ),
                "bucket": pa.array(summary.truth_bucket[order], pa.int64()),
                "count": pa.array(summary.truth_count[order], pa.int64()),
            }
        )
        with FileSystems.create(
            FileSystems.join(self._directory, TRUTH_FILE),
            compression_type=CompressionTypes.UNCOMPRESSED,
        ) as sink:
            pq.write_table(table, sink)
        result = dict(self._metadata)
        result.update(
            shards=summary.shards,
            respondents=summary.respondents,
            device_rounds=summary.device_rounds,
            refusals=summary.refusals,
            reports=summary.device_rounds - summary.refusals,
            messages_per_instance=summary.messages.tolist(),
            presence_per_instance=summary.presence.tolist(),
            messages=int(summary.messages.sum()),
            presence_messages=int(summary.presence.sum()),
            # sealed cover messages the devices added (transforms/analyzer/opening.py); 0 when unsealed
            chaff_per_instance=summary.chaff.tolist(),
            chaff_messages=int(summary.chaff.sum()),
            files=[
                shard_file_name(instance, shard)
                for instance in range(self._metadata["shuffler_instances"])
                for shard in range(summary.shards)
            ],
        )
        with FileSystems.create(
            FileSystems.join(self._directory, SUMMARY_FILE),
            compression_type=CompressionTypes.UNCOMPRESSED,
        ) as sink:
            sink.write(json.dumps(result, indent=2, sort_keys=True).encode())
        yield result


def run(options: PipelineOptions) -> dict[str, Any]:
    """Simulate, write DIR atomically and return the contents of simulation.json."""
    values = options.view_as(SimulateOptions)
    output = _check_output(values.simulate_output, values.simulate_overwrite)
    plan = plan_from_options(options)
    context = ShardContext(plan)  # builds recipe, fleet and population: bad input fails here
    refusals = context.fleet.refusals_for_all()
    if refusals:
        reasons = "; ".join(f"{failure.reason}: {failure.detail}" for failure in refusals)
        hint = (
            " (see --device-budget and --query-class-fields; --no-device-budget simulates "
            "devices without an accountant)"
        )
        raise UsageError(f"every device refuses recipe {context.recipe.id}: {reasons}{hint}")
    shards = context.shards()
    urls = _collector_urls(values, context.fleet.num_instances)
    with_default_runner(options)
    metadata = {
        "recipe_id": context.recipe.id,
        "channel": context.recipe.channel,
        "population": plan.population,
        "seed": plan.seed,
        "rounds": plan.rounds,
        "start": datetime.fromtimestamp(plan.start_ms / 1000, UTC).isoformat(),
        "window_ms": context.fleet.window_ms,
        "shuffler_instances": context.fleet.num_instances,
        "instance_weights": [float(w) for w in context.fleet.instance_weights],
        "device_budget": context.device_budget,
        "device_budget_enforced": plan.enforce_budget,
        "codec": plan.codec,
        "compression_level": plan.compression_level,
        "schema_version": SCHEMA_VERSION,
        "layout": "instance=<u>/reports-<shard>.avro",
        "truth": TRUTH_FILE,
        "sealing": sealing_metadata(context.recipe, context.sealing),  # simulators/sealing.py
        "prio3": prio3_metadata(context.prio3),  # simulators/prio3_devices.py
    }
    if context.crowds is not None:  # natural crowds: respondents per crowd id
        metadata["crowds"] = dict(
            zip(context.crowds.names, context.crowds.sizes.tolist(), strict=True)
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(output)
    staging = output.parent / f".{output.name}.tmp-{secrets.token_hex(4)}"
    try:
        staging.mkdir()
        with (
            counted_stage(  # device rounds, counted by every worker (schemas/progress_counts.py)
                "simulate", total=context.population.size * plan.rounds, unit="devices"
            ),
            new_pipeline(options) as pipeline,
        ):
            _ = (
                pipeline
                | "Shard descriptors" >> beam.Create(shards)
                | "Devices" >> WriteReportShards(plan, str(staging))
                | "Add up shards" >> beam.CombineGlobally(CombineShardSummaries())
                | "Write truth and summary"
                >> beam.ParDo(
                    _WriteOutputs(str(staging), metadata, context.fleet.window_ms, plan.start_ms)
                )
            )
        summary = json.loads((staging / SUMMARY_FILE).read_text())
        # Committed before the rename: a run killed at any point leaves DIR committed or absent.
        commit_outputs(staging, summary)
        if output.exists():
            (output / commit.COMMIT_FILE).unlink(missing_ok=True)  # uncommit first
            shutil.rmtree(output)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if urls is not None:
        summary["uploads"] = upload_simulation(
            output,
            context.fleet.num_instances,
            urls,
            values.simulate_device_credentials,
            values.simulate_collector_ca,
            values.simulate_connections,
            values.simulate_upload_retries,
        )
    return summary

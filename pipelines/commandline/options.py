"""PipelineOptions of the ESA stages (Beam's habit: one options class per pipeline).

Each stage lists its flags once, as :class:`~pipelines.commandline.flags.Flag` entries in ``FLAGS`` (adding a
flag is adding one entry, and a check to ``validate`` if it can be wrong). Defaults come from the
config dataclasses each stage builds (``ShuffleConfig``, ``SimulationPlan``, ``AnalysisConfig``),
so a default is written in one place. ShuffleOptions has no prefix (``--crowd-threshold`` on
Beam's parser too); the others are ``--simulate_<name>``, ``--analyze_<name>``, ``--run_<name>``
on Beam's parser and ``--<name>`` on their ``esa`` command. ``pipelines.commandline.main`` runs ``validate()``
before any work; any flag that is neither the stage's nor Beam's own is an error.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines.commandline import keys as keys_cli
from pipelines.commandline.flags import (
    DEFAULT_BATCH_RUNNER,
    INT64_MAX,
    LATEST_WINDOW_END_MS,
    Flag,
    StageFlags,
    add_stage_arguments,
    apart,
    deletion_errors,
    errors_of,
    existing_paths,
    format_duration_ms,
    glob_base,
    int_in,
    lateness_error,
    matching_glob,
    output_directory,
    positive_finite,
    stage_option_values,
    unknown_beam_flags,
    window_error,
    with_default_runner,
)
from schemas.release.crowd_buckets import MAX_CROWD_BUCKETS
from simulators.fleet import DEFAULT_START
from simulators.plan import SimulationPlan
from simulators.populations import MAX_RESPONDENTS
from transforms.analyzer.analyze import AnalysisConfig
from transforms.analyzer.arithmetic import DENSE_LIMIT
from transforms.common.avro_io import DEFAULT_BATCH_RECORDS
from transforms.shuffler.report_rows import WindowSpec
from transforms.shuffler.shuffle import ShuffleConfig

__all__ = [
    "DEFAULT_BATCH_RUNNER",
    "INT64_MAX",
    "AnalyzeOptions",
    "Flag",
    "RunOptions",
    "ShuffleOptions",
    "SimulateOptions",
    "add_stage_arguments",
    "format_duration_ms",
    "parse_start_ms",
    "stage_option_values",
    "unknown_beam_flags",
    "with_default_runner",
]

POSTPROCESSING = ("none", "clip_nonnegative", "norm_sub")
_SHUFFLE = ShuffleConfig  # defaults of the shuffler (transforms/shuffler/shuffle.py)


class ShuffleOptions(StageFlags, PipelineOptions):
    """Flags of ``esa shuffle`` (the shuffler stage: transforms/shuffler/shuffle.py)."""

    FLAGS = (
        Flag(
            "input",
            "Glob of report Avro files (schemas/report.avsc); in --streaming mode, the pattern "
            "watched for new files.",
        ),
        Flag("output", "Release directory (what the analyzer is given): messages/, _COMMIT.json."),
        Flag(
            "private_output",
            "Shuffler-private directory: dead_letter/, manifest/, metrics.json, spill/. "
            "Default: <output>.private (a sibling, never inside the release).",
        ),
        Flag(
            "overwrite",
            "Replace an existing (committed or partial) release in --output.",
            default=False,
            switch=True,
        ),
        Flag(
            "crowd_threshold",
            "Smallest number of distinct respondents a crowd is released with (raised to every "
            f"message's and the recipe's minimum crowd size). Default {_SHUFFLE.crowd_threshold}.",
            default=_SHUFFLE.crowd_threshold,
            type=int,
        ),
        Flag(
            "deletion_epsilon",
            "eps_cr of randomized report deletion (Algorithm 3, esa-privacy-revisited); give it "
            "with --deletion-delta. Default: no deletion.",
            type=float,
        ),
        Flag("deletion_delta", "delta_cr of randomized report deletion.", type=float),
        Flag(
            "window",
            "Event-time window length: 1d, 6h, 30m, 90s, 500ms. Default "
            f"{format_duration_ms(WindowSpec.period_ms)}.",
            default=format_duration_ms(WindowSpec.period_ms),
        ),
        Flag(
            "instance",
            "Run as shuffler instance I only: reports for other instances are dead-lettered "
            "(wrong_instance). Default: every instance, kept apart in the crowd key.",
            type=int,
        ),
        Flag(
            "recipe",
            "Recipe JSON file or shipped recipe name the shuffler accepts (repeatable). "
            "Default: every shipped recipe.",
            repeat=True,
        ),
        Flag(
            "batch_records",
            f"Records per column batch read from Avro. Default {_SHUFFLE.batch_records}.",
            default=_SHUFFLE.batch_records,
            type=int,
        ),
        Flag(
            "messages_per_shard",
            "Target messages per origin shard of a crowd bucket (memory per worker). Default "
            f"{_SHUFFLE.messages_per_shard}.",
            default=_SHUFFLE.messages_per_shard,
            type=int,
        ),
        Flag(
            "messages_per_file",
            "Target messages per output file (and per worker holding one). Default "
            f"{_SHUFFLE.messages_per_file}.",
            default=_SHUFFLE.messages_per_file,
            type=int,
        ),
        Flag(
            "crowd_buckets",
            "Number of crowd buckets B: crowds are placed in B buckets by a digest of their "
            "key; a bucket of a window and instance is the unit of work and of the release's "
            f"files (esa-release/2). Default {_SHUFFLE.crowd_buckets}, at most "
            f"{MAX_CROWD_BUCKETS}.",
            default=_SHUFFLE.crowd_buckets,
            type=int,
        ),
        Flag(
            "watch_interval",
            "Streaming: seconds between looks for new input files. Default 10.",
            default=10.0,
            type=float,
        ),
        Flag(
            "watch_for",
            "Streaming: stop watching after this many seconds. Default: never.",
            type=float,
        ),
        Flag(
            "allowed_lateness",
            "Streaming: a window is committed once the watermark (the largest event time seen) "
            "passes its end plus this much (0, 30s, 1h, ...). Default 0.",
            default="0",
        ),
    ) + keys_cli.SHUFFLE_FLAGS  # --signing-key (signed commit records)

    def validate(self, validator: Any = None) -> list[str]:
        streaming = bool(self.view_as(StandardOptions).streaming)
        return errors_of(
            int_in("--crowd-threshold", self.crowd_threshold, 1),
            deletion_errors(self.deletion_epsilon, self.deletion_delta),
            window_error(self.window),
            int_in("--instance", self.instance, 0, 2**31 - 1),
            int_in("--batch-records", self.batch_records, 1, 2**31 - 1),
            int_in("--messages-per-shard", self.messages_per_shard, 1),
            int_in("--messages-per-file", self.messages_per_file, 1),
            int_in("--crowd-buckets", self.crowd_buckets, 1, MAX_CROWD_BUCKETS),
            positive_finite("--watch-interval", self.watch_interval),
            positive_finite("--watch-for", self.watch_for, allow_zero=True),
            lateness_error(self.allowed_lateness),
            output_directory("--output", self.output),
            output_directory("--private-output", self.private_output, required=False),
            apart("--output", self.output, [("--input", self.input and glob_base(self.input))]),
            apart(
                "--private-output",
                self.private_output,
                [("--input", self.input and glob_base(self.input)), ("--output", self.output)],
            ),
            ("--input is required" if not self.input else None)
            if streaming
            else matching_glob("--input", self.input),
        )


_PLAN = SimulationPlan  # defaults of the device fleet (simulators/plan.py)


def temp_location_root(temp_location: str, kind: str, output: str) -> str:
    """``<--temp_location>/<kind>/<digest of output>``: one scratch root per output directory, so
    that cleaning a dead run's scratch data never touches another output's."""
    digest = hashlib.sha256(os.path.abspath(output).encode()).hexdigest()[:16]
    return FileSystems.join(temp_location, kind, digest)


def parse_start_ms(text: str) -> int:
    """``--start`` (ISO 8601; UTC when it names no zone) in ms since the epoch (ValueError)."""
    try:
        start = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--start must be an ISO 8601 date or time, got {text!r}") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    millis = int(start.timestamp() * 1000)
    if millis < 0:
        raise ValueError(f"--start must not be before 1970-01-01, got {text!r}")
    return millis


def simulated_windows_end_ms(recipe_name: str, start_ms: int, rounds: int) -> int | None:
    """Where the last window of a simulation ends (None when the recipe does not load: the
    stage itself then says why)."""
    from schemas.recipes import load_recipe

    try:
        recipe = load_recipe(recipe_name)
        randomizer = recipe.build_randomizer()
    except (OSError, ValueError):
        return None
    periods = int(randomizer.periods) if randomizer.payload_kind == "tree_node" else 1
    return start_ms + rounds * periods * int(recipe.window_seconds) * 1000


class SimulateOptions(StageFlags, PipelineOptions):
    """Flags of ``esa simulate`` (pipelines/simulate.py: the simulated device fleet); Beam-side
    ``--simulate_<name>``."""

    PREFIX = "simulate"
    FLAGS = (
        Flag(
            "recipe",
            "Shipped recipe name (or name@version) or recipe JSON file. Default image_grid_onehot.",
            default="image_grid_onehot",
        ),
        Flag(
            "population",
            "Population spec KIND[:NAME][,KEY=VALUE]...: uniform, zipf[,exponent=S], "
            "heavy-hitters[,heavy=H,exponent=A,heavy_fraction=F], image:NAME[,size=RxC] (disc, "
            "gradient; horse, camera, moon need .[images]; or an image file), "
            "longitudinal[,changes=K]. Default image:disc.",
            default="image:disc",
        ),
        Flag(
            "respondents",
            "Number of devices. Required except for images (default: one respondent per unit of "
            "luminosity; given, the image is scaled to it).",
            type=int,
        ),
        Flag(
            "output",
            "Output directory: instance=<u>/reports-<shard>.avro, truth.parquet, "
            "simulation.json (written to a temporary sibling and renamed at the end).",
        ),
        Flag(
            "seed",
            "Master seed (same seed, same files). Default: a random seed, recorded in "
            "simulation.json.",
            type=int,
        ),
        Flag(
            "rounds",
            "Reporting rounds per device (one window each; longitudinal: d windows each). "
            f"Default {_PLAN.rounds}.",
            default=_PLAN.rounds,
            type=int,
        ),
        Flag(
            "stream",
            "Write the reports window after window in compressed real time (for streaming "
            "shufflers): instance=<u>/reports-w<k>-c<j>.avro appear by atomic rename.",
            default=False,
            switch=True,
        ),
        Flag(
            "windows",
            "With --stream: the number of windows (the rounds). Default 2.",
            default=2,
            type=int,
        ),
        Flag(
            "window_seconds",
            "With --stream: wall-clock seconds per window of device time. Default 10.",
            default=10.0,
            type=float,
        ),
        Flag(
            "start",
            f"Start of window 0 (ISO 8601; UTC if no zone). Default {DEFAULT_START}.",
            default=DEFAULT_START,
        ),
        Flag(
            "device_budget",
            "Cohort epsilon each device allows the recipe's analysis and data fields (basic "
            "composition over rounds). Default: exactly enough for every round.",
            type=float,
        ),
        Flag(
            "query_class_fields",
            "Comma-separated data fields the devices' query class allows. Default: the fields "
            "the recipe reads.",
        ),
        Flag(
            "instance_weights",
            "Comma-separated trust distribution over the K shuffler instances. Default: the "
            "recipe's.",
        ),
        Flag(
            "no_device_budget",
            "Simulate devices without an on-device accountant (needed for recipes without local "
            "privacy, e.g. zero_sum_histogram).",
            default=False,
            switch=True,
        ),
        Flag(
            "codec",
            f"Avro codec. Default {_PLAN.codec}.",
            default=_PLAN.codec,
            choices=("deflate", "null", "snappy"),
        ),
        Flag(
            "compression_level",
            f"Deflate level 0-9 (-1: zlib default). Default {_PLAN.compression_level}.",
            default=_PLAN.compression_level,
            type=int,
        ),
        Flag(
            "messages_per_shard",
            "Target messages per shard (one file per shard and instance). Default "
            f"{_PLAN.messages_per_shard}.",
            default=_PLAN.messages_per_shard,
            type=int,
        ),
        Flag(
            "messages_per_chunk",
            "Target messages generated at once in a worker (memory bound). Default "
            f"{_PLAN.messages_per_chunk}.",
            default=_PLAN.messages_per_chunk,
            type=int,
        ),
        Flag(
            "overwrite",
            "Replace an existing non-empty output directory.",
            default=False,
            switch=True,
        ),
    ) + keys_cli.SIMULATE_FLAGS  # --public-key (sealed payloads)

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        errors = errors_of(
            int_in("--respondents", value("respondents"), 1, MAX_RESPONDENTS),
            int_in("--seed", value("seed"), 0),
            int_in("--rounds", value("rounds"), 1, 2**31 - 1),
            int_in("--windows", value("windows"), 1, 2**31 - 1),
            positive_finite("--window-seconds", value("window_seconds")),
            positive_finite("--device-budget", value("device_budget"), allow_zero=True),
            int_in("--compression-level", value("compression_level"), -1, 9),
            int_in("--messages-per-shard", value("messages_per_shard"), 1),
            int_in("--messages-per-chunk", value("messages_per_chunk"), 1),
            output_directory("--output", value("output")),
        )
        try:
            start_ms = parse_start_ms(value("start"))
        except ValueError as error:
            return [*errors, str(error)]
        if not errors:
            end = simulated_windows_end_ms(value("recipe"), start_ms, value("rounds"))
            if end is not None and end > LATEST_WINDOW_END_MS:
                errors.append(
                    f"--start {value('start')} with --rounds {value('rounds')}: the last window "
                    "ends after year 9999, beyond what Avro timestamps hold"
                )
        return errors


class AnalyzeOptions(StageFlags, PipelineOptions):
    """Flags of ``esa analyze`` (pipelines/analyze.py: transforms/analyzer/aggregate.py + analyze.py);
    Beam-side ``--analyze_<name>``."""

    PREFIX = "analyze"
    FLAGS = (
        Flag(
            "input",
            "A committed shuffler release (DIR with messages/ and _COMMIT.json, which states its "
            "instance) or a directory of instance=<u>/ releases. Repeatable: one release per "
            "shuffler instance.",
            repeat=True,
        ),
        Flag("output", "Output directory for the analysis."),
        Flag(
            "recipe",
            "Recipe JSON file or shipped recipe name to accept (repeatable). Default: every "
            "shipped recipe.",
            repeat=True,
        ),
        Flag(
            "truth",
            "A simulation directory (truth.parquet + simulation.json) or truth.parquet (then "
            "give --truth-recipe): adds the truth column and the accuracy metrics. Repeatable, "
            "one per recipe.",
            repeat=True,
        ),
        Flag("truth_recipe", "Recipe id the --truth file describes (name@version)."),
        Flag(
            "postprocessing",
            "Optional post-processing of the unbiased estimate, written to its own column "
            f"estimate_<name>. Default {AnalysisConfig.postprocessing}.",
            default=AnalysisConfig.postprocessing,
            choices=POSTPROCESSING,
        ),
        Flag(
            "failure_probability",
            "beta of the longitudinal error bound (Theorem 6). Default "
            f"{AnalysisConfig.failure_probability}.",
            default=AnalysisConfig.failure_probability,
            type=float,
        ),
        Flag(
            "deletion_epsilon",
            "eps_cr of randomized deletion (with --deletion-delta): optional, must agree with "
            "what every release's _COMMIT.json states.",
            type=float,
        ),
        Flag("deletion_delta", "delta_cr, see above.", type=float),
        Flag(
            "batch_records",
            f"Records per column batch. Default {DEFAULT_BATCH_RECORDS}.",
            default=DEFAULT_BATCH_RECORDS,
            type=int,
        ),
        Flag(
            "dense_limit",
            f"Largest domain counted densely; larger ones sparsely. Default {DENSE_LIMIT}.",
            default=DENSE_LIMIT,
            type=int,
        ),
        Flag("no_pictures", "Skip the PNGs.", default=False, switch=True),
        Flag("overwrite", "Replace results already in --output.", default=False, switch=True),
        Flag(
            "watch_interval",
            "Streaming: seconds between looks for newly committed windows. Default 10.",
            default=10.0,
            type=float,
        ),
        Flag(
            "watch_for",
            "Streaming: stop following after this many seconds. Default: never.",
            type=float,
        ),
        Flag(
            "instance_timeout",
            "Streaming: analyze a window this many seconds after its first commit even if "
            "instances are missing (they are named). Default 120.",
            default=120.0,
            type=float,
        ),
        Flag(
            "instances",
            "Streaming: the number K of shuffler instances expected (instance=0..K-1). "
            "Default: every instance folder present.",
            type=int,
        ),
    ) + keys_cli.ANALYZE_FLAGS  # --key-ring (sealed payloads), --shuffler-keys (signed commits)

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        probability = value("failure_probability")
        streaming = bool(self.view_as(StandardOptions).streaming)
        return errors_of(
            "--input is required (a release, or a directory of instance=<u>/)"
            if not value("input")
            else None
            if streaming  # the folder of releases may appear later
            else existing_paths("--input", value("input")),
            positive_finite("--watch-interval", value("watch_interval")),
            positive_finite("--watch-for", value("watch_for"), allow_zero=True),
            positive_finite("--instance-timeout", value("instance_timeout"), allow_zero=True),
            int_in("--instances", value("instances"), 1, 2**31 - 1),
            existing_paths("--truth", value("truth")),
            None
            if 0 < probability < 1
            else f"--failure-probability must be in (0, 1), got {probability}",
            deletion_errors(value("deletion_epsilon"), value("deletion_delta")),
            int_in("--batch-records", value("batch_records"), 1, 2**31 - 1),
            int_in("--dense-limit", value("dense_limit"), 0, 2**40),
            output_directory("--output", value("output")),
            apart(
                "--output", value("output"), [("--input", path) for path in value("input") or ()]
            ),
        )


class RunOptions(StageFlags, PipelineOptions):
    """Flags of ``esa run`` (pipelines/run.py: simulate -> shuffle per instance -> analyze);
    Beam-side ``--run_<name>``."""

    PREFIX = "run"
    FLAGS = (
        Flag("output", "Output directory. Default results.", default="results"),
        Flag(
            "recipe",
            "Shipped recipe name or recipe JSON file. Default image_grid_sealed (what make run "
            "runs).",
            default="image_grid_sealed",
        ),
        Flag(
            "population",
            "Population spec (see esa simulate). Default: one that fits the recipe (an image "
            "for image recipes: image:horse with scikit-image installed, else image:disc; "
            "zipf for histograms; longitudinal for longitudinal recipes).",
        ),
        Flag(
            "respondents",
            "Simulated respondents. Default 40000 (each of the default recipe's two instances "
            "keeps its minimum crowd).",
            default=40_000,
            type=int,
        ),
        Flag(
            "instances",
            "Shuffler instances K. Default: the recipe's own; a recipe made for another K is "
            "re-issued as <name>-k<K> with uniform instance weights.",
            type=int,
        ),
        Flag(
            "parallel_shuffles",
            "How many shuffler instances run at once, each in its own process. Default: the "
            "number of CPUs.",
            type=int,
        ),
        Flag("seed", "Simulation seed. Default: random.", type=int),
        Flag(
            "crowd_threshold",
            f"Shuffler crowd threshold. Default {ShuffleConfig.crowd_threshold}.",
            default=ShuffleConfig.crowd_threshold,
            type=int,
        ),
        Flag(
            "deletion_epsilon",
            "eps_cr of randomized deletion in every shuffler (with --deletion-delta). Default: "
            "no deletion.",
            type=float,
        ),
        Flag("deletion_delta", "delta_cr, see above.", type=float),
        Flag(
            "postprocessing",
            "Post-processing column next to the unbiased estimate. Default norm_sub.",
            default="norm_sub",
            choices=POSTPROCESSING,
        ),
        Flag("overwrite", "Replace an existing --output directory.", default=False, switch=True),
        Flag(
            "stream",
            "Live: devices write window after window, K streaming shufflers and the streaming "
            "analyzer follow; one line per analyzed window (pipelines/stream_run.py).",
            default=False,
            switch=True,
        ),
        Flag("windows", "With --stream: windows of device time. Default 2.", default=2, type=int),
        Flag(
            "window_seconds",
            "With --stream: wall-clock seconds per window. Default 10.",
            default=10.0,
            type=float,
        ),
    ) + keys_cli.RUN_FLAGS  # --keys, --unsealed (sealed payloads), --unsigned (commits)

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        return errors_of(
            int_in("--respondents", value("respondents"), 1, MAX_RESPONDENTS),
            int_in("--instances", value("instances"), 1, 1024),
            int_in("--parallel-shuffles", value("parallel_shuffles"), 1, 1024),
            int_in("--seed", value("seed"), 0),
            int_in("--crowd-threshold", value("crowd_threshold"), 1),
            deletion_errors(value("deletion_epsilon"), value("deletion_delta")),
            output_directory("--output", value("output")),
            int_in("--windows", value("windows"), 1, 10_000),
            positive_finite("--window-seconds", value("window_seconds")),
        )

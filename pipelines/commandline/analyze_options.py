"""Flags of ``esa analyze``: :class:`AnalyzeOptions` (pipelines/analyze.py).

Declared as :class:`~pipelines.commandline.flags.Flag` entries (``pipelines/commandline/options.py``
says how stage options work).
"""

from __future__ import annotations

from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines.commandline import analyzer_key_flags
from pipelines.commandline.flags import (
    MAX_BATCH_RECORDS,
    MAX_DENSE_LIMIT,
    Flag,
    StageFlags,
    apart,
    deletion_errors,
    errors_of,
    existing_paths,
    int_in,
    output_directory,
    positive_finite,
)
from transforms.analyzer.aggregate import DEFAULT_RANGE_RECORDS
from transforms.analyzer.analyze import AnalysisConfig
from transforms.analyzer.arithmetic import DENSE_LIMIT
from transforms.common.avro_io import DEFAULT_BATCH_RECORDS

POSTPROCESSING = ("none", "clip_nonnegative", "norm_sub")


class AnalyzeOptions(StageFlags, PipelineOptions):
    """Flags of ``esa analyze`` (pipelines/analyze.py: transforms/analyzer/aggregate.py + analyze.py);
    Beam-side ``--analyze_<name>``."""

    PREFIX = "analyze"
    FLAGS = (
        (
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
                f"Records per column batch. Default {DEFAULT_BATCH_RECORDS}; "
                f"1..{MAX_BATCH_RECORDS:,}.",
                default=DEFAULT_BATCH_RECORDS,
                type=int,
            ),
            Flag(
                "range_records",
                "Most records of a release file one worker reads at a time (files are read in "
                f"ranges of whole blocks). Default {DEFAULT_RANGE_RECORDS:,}; "
                f"1..{MAX_BATCH_RECORDS:,}.",
                default=DEFAULT_RANGE_RECORDS,
                type=int,
            ),
            Flag(
                "dense_limit",
                f"Largest domain counted densely; larger ones sparsely. Default {DENSE_LIMIT}; "
                f"0..{MAX_DENSE_LIMIT:,}.",
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
        )
        + analyzer_key_flags.ANALYZE_FLAGS
    )  # --key-ring (sealed payloads), --shuffler-keys (signed commits)

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
            int_in("--batch-records", value("batch_records"), 1, MAX_BATCH_RECORDS),
            int_in("--range-records", value("range_records"), 1, MAX_BATCH_RECORDS),
            int_in("--dense-limit", value("dense_limit"), 0, MAX_DENSE_LIMIT),
            output_directory("--output", value("output")),
            apart(
                "--output", value("output"), [("--input", path) for path in value("input") or ()]
            ),
        )

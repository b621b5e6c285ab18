"""Flags of ``esa shuffle``: :class:`ShuffleOptions` (pipelines/shuffle.py).

Declared as :class:`~pipelines.commandline.flags.Flag` entries (``pipelines/commandline/options.py``
says how stage options work).
"""

from __future__ import annotations

from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines.commandline import shuffler_key_flags
from pipelines.commandline.flags import (
    MAX_BATCH_RECORDS,
    MAX_MESSAGES_PER_FILE,
    MAX_MESSAGES_PER_SHARD,
    Flag,
    StageFlags,
    apart,
    deletion_errors,
    errors_of,
    format_duration_ms,
    glob_base,
    int_in,
    lateness_error,
    matching_glob,
    output_directory,
    positive_finite,
    window_error,
)
from schemas.release.crowd_buckets import MAX_CROWD_BUCKETS
from schemas.windows import WindowSpec
from transforms.shuffler.shuffle import ShuffleConfig

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
            f"Records per column batch read from Avro. Default {_SHUFFLE.batch_records}; "
            f"1..{MAX_BATCH_RECORDS:,}.",
            default=_SHUFFLE.batch_records,
            type=int,
        ),
        Flag(
            "messages_per_shard",
            "Target messages per origin shard of a crowd bucket (memory per worker). Default "
            f"{_SHUFFLE.messages_per_shard}; 1..{MAX_MESSAGES_PER_SHARD:,}.",
            default=_SHUFFLE.messages_per_shard,
            type=int,
        ),
        Flag(
            "messages_per_file",
            "Target messages per output file (and per worker holding one). Default "
            f"{_SHUFFLE.messages_per_file}; 1..{MAX_MESSAGES_PER_FILE:,}.",
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
            "passes its end plus this much (0, 30s, 1h, ...). Default: one window (--window), "
            "so that reports of a window may still arrive while the next one is under way.",
        ),
    ) + shuffler_key_flags.SHUFFLE_FLAGS  # --signing-key (signed commit records)

    def validate(self, validator: Any = None) -> list[str]:
        streaming = bool(self.view_as(StandardOptions).streaming)
        return errors_of(
            int_in("--crowd-threshold", self.crowd_threshold, 1),
            deletion_errors(self.deletion_epsilon, self.deletion_delta),
            window_error(self.window),
            int_in("--instance", self.instance, 0, 2**31 - 1),
            int_in("--batch-records", self.batch_records, 1, MAX_BATCH_RECORDS),
            int_in("--messages-per-shard", self.messages_per_shard, 1, MAX_MESSAGES_PER_SHARD),
            int_in("--messages-per-file", self.messages_per_file, 1, MAX_MESSAGES_PER_FILE),
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

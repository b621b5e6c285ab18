"""Flags of ``esa run``: :class:`RunOptions` (pipelines/run.py: devices -> K shufflers -> analyzer).

Declared as :class:`~pipelines.commandline.flags.Flag` entries (``pipelines/commandline/options.py``
says how stage options work).
"""

from __future__ import annotations

from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline import keys as keys_cli
from pipelines.commandline.analyze_options import POSTPROCESSING
from pipelines.commandline.flags import (
    MAX_INSTANCES,
    MAX_PARALLEL_SHUFFLES,
    Flag,
    StageFlags,
    deletion_errors,
    errors_of,
    int_in,
    output_directory,
    positive_finite,
)
from simulators.populations import MAX_RESPONDENTS
from transforms.shuffler.shuffle import ShuffleConfig

DEFAULT_RESPONDENTS = 40_000


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
            "Simulated respondents. Default: the recipe's default_respondents (the small "
            "recipes': a size every crowd releases at), else 40000 (each of the default "
            f"recipe's two instances keeps its minimum crowd); 1..{MAX_RESPONDENTS:,}.",
            type=int,
        ),
        Flag(
            "instances",
            "Shuffler instances K. Default: the recipe's own; a recipe made for another K is "
            f"re-issued as <name>-k<K> with uniform instance weights; 1..{MAX_INSTANCES}.",
            type=int,
        ),
        Flag(
            "parallel_shuffles",
            "How many shuffler instances run at once, each in its own process. Default: one "
            "after the other in this process while each instance has under 500,000 messages, "
            f"else the number of CPUs; 1..{MAX_PARALLEL_SHUFFLES}.",
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
        Flag(
            "collect",
            "Devices upload over HTTPS to one esa collect per shuffler instance (on 127.0.0.1, "
            "free ports; enrolment keys in OUTPUT/devices, TLS in OUTPUT/collector_tls); the "
            "shufflers read the collectors' committed files in OUTPUT/collected/instance=<u>.",
            default=False,
            switch=True,
        ),
        Flag(
            "connections",
            "Concurrent HTTPS connections of the fleet's uploads (with --collect). Default 16.",
            default=16,
            type=int,
        ),
    ) + keys_cli.RUN_FLAGS  # --keys, --unsealed (sealed payloads), --unsigned (commits)

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        return errors_of(
            int_in("--respondents", value("respondents"), 1, MAX_RESPONDENTS),
            int_in("--instances", value("instances"), 1, MAX_INSTANCES),
            int_in("--parallel-shuffles", value("parallel_shuffles"), 1, MAX_PARALLEL_SHUFFLES),
            int_in("--seed", value("seed"), 0),
            int_in("--connections", value("connections"), 1, 10_000),
            int_in("--crowd-threshold", value("crowd_threshold"), 1),
            deletion_errors(value("deletion_epsilon"), value("deletion_delta")),
            output_directory("--output", value("output")),
            int_in("--windows", value("windows"), 1, 10_000),
            positive_finite("--window-seconds", value("window_seconds")),
        )

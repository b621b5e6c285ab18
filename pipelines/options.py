"""PipelineOptions of the ESA stages (Beam's habit: one options class per pipeline).

Each class declares its flags once in ``_add_argparse_args``; the ``esa`` subcommand registers the
same flags on its subparser with :func:`add_stage_arguments`, and Beam's own flags (``--runner``,
``--streaming``, ``--direct_num_workers``, ...) pass through to ``PipelineOptions`` untouched.
"""

from __future__ import annotations

import argparse
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

__all__ = [
    "DEFAULT_BATCH_RUNNER",
    "ShuffleOptions",
    "add_stage_arguments",
    "stage_option_values",
    "with_default_runner",
]

# Batch runs default to the in-process portable runner: Beam 2.77's plain DirectRunner first tries
# to download Prism, which cannot work offline (DESIGN.md, Beam facts).
DEFAULT_BATCH_RUNNER = "FnApiRunner"


def with_default_runner(options: PipelineOptions) -> PipelineOptions:
    """``options`` with a runner when none was given: FnApiRunner for batch, DirectRunner (the
    one that runs TestStream and unbounded sources) for ``--streaming``."""
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = "DirectRunner" if standard.streaming else DEFAULT_BATCH_RUNNER
    return options


class ShuffleOptions(PipelineOptions):
    """Flags of ``esa shuffle`` (the shuffler stage: transforms/shuffle.py)."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument(
            "--input",
            dest="input",
            help="Glob of report Avro files (schemas/report.avsc); in --streaming mode, the "
            "pattern watched for new files.",
        )
        parser.add_argument(
            "--output",
            dest="output",
            help="Output directory: messages/, manifest.avro, dead_letter/, metrics.json.",
        )
        parser.add_argument(
            "--crowd-threshold",
            dest="crowd_threshold",
            type=int,
            default=100,
            help="Smallest number of distinct respondents a crowd is released with (raised to "
            "every message's and the recipe's minimum crowd size). Default 100.",
        )
        parser.add_argument(
            "--deletion-epsilon",
            dest="deletion_epsilon",
            type=float,
            default=None,
            help="eps_cr of randomized report deletion (Algorithm 3, esa-privacy-revisited); "
            "give it with --deletion-delta. Default: no deletion.",
        )
        parser.add_argument(
            "--deletion-delta",
            dest="deletion_delta",
            type=float,
            default=None,
            help="delta_cr of randomized report deletion.",
        )
        parser.add_argument(
            "--window",
            dest="window",
            default="1d",
            help="Event-time window length: 1d, 6h, 30m, 90s, 500ms. Default 1d.",
        )
        parser.add_argument(
            "--instance",
            dest="instance",
            type=int,
            default=None,
            help="Run as shuffler instance I only: reports for other instances are "
            "dead-lettered (wrong_instance). Default: every instance, kept apart in the crowd key.",
        )
        parser.add_argument(
            "--recipe",
            dest="recipe",
            action="append",
            default=None,
            help="Recipe JSON file or shipped recipe name the shuffler accepts (repeatable). "
            "Default: every shipped recipe.",
        )
        parser.add_argument(
            "--batch-records",
            dest="batch_records",
            type=int,
            default=50_000,
            help="Records per column batch read from Avro. Default 50000.",
        )
        parser.add_argument(
            "--messages-per-shard",
            dest="messages_per_shard",
            type=int,
            default=200_000,
            help="Target messages per origin shard of a crowd (memory per worker). Default 200000.",
        )
        parser.add_argument(
            "--messages-per-file",
            dest="messages_per_file",
            type=int,
            default=200_000,
            help="Target messages per output file (and per worker holding one). Default 200000.",
        )
        parser.add_argument(
            "--watch-interval",
            dest="watch_interval",
            type=float,
            default=10.0,
            help="Streaming: seconds between looks for new input files. Default 10.",
        )
        parser.add_argument(
            "--watch-for",
            dest="watch_for",
            type=float,
            default=None,
            help="Streaming: stop watching after this many seconds. Default: never.",
        )


def add_stage_arguments(
    parser: argparse.ArgumentParser, options_class: type[PipelineOptions]
) -> None:
    """Register an options class's flags on an ``esa`` subcommand parser."""
    options_class._add_argparse_args(parser)  # noqa: SLF001 - Beam's documented extension point


def stage_option_values(
    args: argparse.Namespace, options_class: type[PipelineOptions]
) -> dict[str, Any]:
    """The values of an options class's flags from a parsed namespace (keyword arguments for
    ``PipelineOptions(flags, **values)``)."""
    probe = argparse.ArgumentParser(add_help=False)
    options_class._add_argparse_args(probe)  # noqa: SLF001
    actions = probe._actions  # noqa: SLF001
    return {action.dest: getattr(args, action.dest) for action in actions if action.dest != "help"}


class SimulateOptions(PipelineOptions):
    """Flags of ``esa simulate`` (pipelines/simulate.py: the simulated device fleet).

    Beam parses every options class's flags with one parser, so two stages must not share a flag:
    here the Beam-side flags carry a ``simulate_`` prefix (``--simulate_recipe``), and ``esa
    simulate`` offers the same settings as ``--recipe``, ``--output``, ... (:meth:`add_cli_arguments`).
    """

    # (name, argparse keyword arguments): the single definition of both spellings.
    FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
        (
            "recipe",
            {
                "default": "image_grid_onehot",
                "help": "Shipped recipe name (or name@version) or recipe JSON file. Default image_grid_onehot.",
            },
        ),
        (
            "population",
            {
                "default": "image:disc",
                "help": "Population spec KIND[:NAME][,KEY=VALUE]...: uniform, zipf[,exponent=S], heavy-hitters[,heavy=H,exponent=A,heavy_fraction=F], image:NAME[,size=RxC] (disc, gradient; horse, camera, moon need .[images]; or an image file), longitudinal[,changes=K]. Default image:disc.",
            },
        ),
        (
            "respondents",
            {
                "type": int,
                "default": None,
                "help": "Number of devices. Required except for images (default: one respondent per unit of luminosity; given, the image is scaled to it).",
            },
        ),
        (
            "output",
            {
                "default": None,
                "help": "Output directory: instance=<u>/reports-<shard>.avro, truth.parquet, simulation.json (written to a temporary sibling and renamed at the end).",
            },
        ),
        (
            "seed",
            {
                "type": int,
                "default": None,
                "help": "Master seed (same seed, same files). Default: a random seed, recorded in simulation.json.",
            },
        ),
        (
            "rounds",
            {
                "type": int,
                "default": 1,
                "help": "Reporting rounds per device (one window each; longitudinal: d windows each). Default 1.",
            },
        ),
        (
            "start",
            {
                "default": "2024-01-01T00:00:00+00:00",
                "help": "Start of window 0 (ISO 8601; UTC if no zone). Default 2024-01-01T00:00:00+00:00.",
            },
        ),
        (
            "device_budget",
            {
                "type": float,
                "default": None,
                "help": "Cohort epsilon each device allows the recipe's analysis and data fields (basic composition over rounds). Default: exactly enough for every round.",
            },
        ),
        (
            "query_class_fields",
            {
                "default": None,
                "help": "Comma-separated data fields the devices' query class allows. Default: the fields the recipe reads.",
            },
        ),
        (
            "instance_weights",
            {
                "default": None,
                "help": "Comma-separated trust distribution over the K shuffler instances. Default: the recipe's.",
            },
        ),
        (
            "no_device_budget",
            {
                "action": "store_true",
                "default": False,
                "help": "Simulate devices without an on-device accountant (needed for recipes without local privacy, e.g. zero_sum_histogram).",
            },
        ),
        (
            "codec",
            {
                "default": "deflate",
                "choices": ("deflate", "null", "snappy"),
                "help": "Avro codec. Default deflate (snappy needs the cramjam package).",
            },
        ),
        (
            "compression_level",
            {"type": int, "default": 1, "help": "Deflate level 0-9 (-1: zlib default). Default 1."},
        ),
        (
            "messages_per_shard",
            {
                "type": int,
                "default": 2_000_000,
                "help": "Target messages per shard (one file per shard and instance). Default 2000000.",
            },
        ),
        (
            "messages_per_chunk",
            {
                "type": int,
                "default": 250_000,
                "help": "Target messages generated at once in a worker (memory bound). Default 250000.",
            },
        ),
        (
            "overwrite",
            {
                "action": "store_true",
                "default": False,
                "help": "Replace an existing non-empty output directory.",
            },
        ),
    )

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        for name, kwargs in cls.FLAGS:
            parser.add_argument(f"--simulate_{name}", dest=f"simulate_{name}", **kwargs)

    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Register the flags on the ``esa simulate`` subparser as ``--recipe``, ``--output``, ..."""
        for name, kwargs in cls.FLAGS:
            parser.add_argument("--" + name.replace("_", "-"), dest=f"simulate_{name}", **kwargs)

    @classmethod
    def cli_values(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The ``simulate_*`` values of a parsed ``esa simulate`` namespace."""
        return {f"simulate_{name}": getattr(args, f"simulate_{name}") for name, _ in cls.FLAGS}


def _prefixed_options(
    prefix: str, flags: tuple[tuple[str, dict[str, Any]], ...]
) -> tuple[Any, Any, Any]:
    """The three hooks of a prefixed options class (as SimulateOptions does): Beam-side flags
    ``--<prefix>_<name>``, ``esa`` flags ``--<name>`` and the values of a parsed namespace."""

    def add_argparse_args(cls: Any, parser: Any) -> None:
        for name, kwargs in flags:
            parser.add_argument(f"--{prefix}_{name}", dest=f"{prefix}_{name}", **kwargs)

    def add_cli_arguments(cls: Any, parser: argparse.ArgumentParser) -> None:
        for name, kwargs in flags:
            shown = {}
            if kwargs.get("action") != "store_true" and "choices" not in kwargs:
                shown["metavar"] = name.upper()
            parser.add_argument(
                "--" + name.replace("_", "-"), dest=f"{prefix}_{name}", **shown, **kwargs
            )

    def cli_values(cls: Any, args: argparse.Namespace) -> dict[str, Any]:
        return {f"{prefix}_{name}": getattr(args, f"{prefix}_{name}") for name, _ in flags}

    return classmethod(add_argparse_args), classmethod(add_cli_arguments), classmethod(cli_values)


class AnalyzeOptions(PipelineOptions):
    """Flags of ``esa analyze`` (pipelines/analyze.py: transforms/aggregate.py + analyze.py).

    Beam-side flags carry an ``analyze_`` prefix (``--analyze_input``); ``esa analyze`` offers
    them as ``--input``, ``--output``, ...
    """

    FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
        (
            "input",
            {
                "action": "append",
                "default": None,
                "help": "A shuffler release (DIR with messages/, manifest.avro, metrics.json; its "
                "instance from a name instance=<u>, the manifest or metrics.json) or a directory "
                "of instance=<u>/ releases. Repeatable: one release per shuffler instance.",
            },
        ),
        ("output", {"default": None, "help": "Output directory for the analysis."}),
        (
            "recipe",
            {
                "action": "append",
                "default": None,
                "help": "Recipe JSON file or shipped recipe name to accept (repeatable). Default: "
                "every shipped recipe.",
            },
        ),
        (
            "truth",
            {
                "action": "append",
                "default": None,
                "help": "A simulation directory (truth.parquet + simulation.json) or truth.parquet "
                "(then give --truth-recipe): adds the truth column and the accuracy metrics. "
                "Repeatable, one per recipe.",
            },
        ),
        (
            "truth_recipe",
            {"default": None, "help": "Recipe id the --truth file describes (name@version)."},
        ),
        (
            "postprocessing",
            {
                "default": "none",
                "choices": ["none", "clip_nonnegative", "norm_sub"],
                "help": "Optional post-processing of the unbiased estimate, written to its own "
                "column estimate_<name>. Default none.",
            },
        ),
        (
            "failure_probability",
            {
                "type": float,
                "default": 0.05,
                "help": "beta of the longitudinal error bound (Theorem 6). Default 0.05.",
            },
        ),
        (
            "deletion_epsilon",
            {
                "type": float,
                "default": None,
                "help": "eps_cr of every instance's randomized deletion, when its metrics.json "
                "does not say (with --deletion-delta).",
            },
        ),
        ("deletion_delta", {"type": float, "default": None, "help": "delta_cr, see above."}),
        (
            "batch_records",
            {"type": int, "default": 50_000, "help": "Records per column batch. Default 50000."},
        ),
        (
            "dense_limit",
            {
                "type": int,
                "default": 1 << 20,
                "help": "Largest domain counted densely; larger ones sparsely. Default 1048576.",
            },
        ),
        ("no_pictures", {"action": "store_true", "default": False, "help": "Skip the PNGs."}),
        (
            "overwrite",
            {
                "action": "store_true",
                "default": False,
                "help": "Replace results already in --output.",
            },
        ),
    )

    _add_argparse_args, add_cli_arguments, cli_values = _prefixed_options("analyze", FLAGS)


class RunOptions(PipelineOptions):
    """Flags of ``esa run`` (pipelines/run.py: simulate -> shuffle per instance -> analyze).

    Beam-side flags carry a ``run_`` prefix; ``esa run`` offers them as ``--output``, ...
    """

    FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
        (
            "output",
            {"default": "results", "help": "Output directory. Default results."},
        ),
        (
            "recipe",
            {
                "default": "image_grid_onehot",
                "help": "Shipped recipe name or recipe JSON file. Default image_grid_onehot.",
            },
        ),
        (
            "population",
            {
                "default": None,
                "help": "Population spec (see esa simulate). Default image:horse when "
                "scikit-image is installed, else the generated image:disc.",
            },
        ),
        (
            "respondents",
            {
                "type": int,
                "default": 120_000,
                "help": "Simulated respondents. Default 120000 (the recipe's minimum crowd is "
                "100000 per instance).",
            },
        ),
        (
            "instances",
            {
                "type": int,
                "default": None,
                "help": "Shuffler instances K. Default: the recipe's own; a recipe made for "
                "another K is re-issued as <name>-k<K> with uniform instance weights.",
            },
        ),
        (
            "parallel_shuffles",
            {
                "type": int,
                "default": None,
                "help": "How many shuffler instances run at once, each in its own process. "
                "Default: the number of CPUs.",
            },
        ),
        ("seed", {"type": int, "default": None, "help": "Simulation seed. Default: random."}),
        (
            "crowd_threshold",
            {"type": int, "default": 100, "help": "Shuffler crowd threshold. Default 100."},
        ),
        (
            "deletion_epsilon",
            {
                "type": float,
                "default": None,
                "help": "eps_cr of randomized deletion in every shuffler (with "
                "--deletion-delta). Default: no deletion.",
            },
        ),
        ("deletion_delta", {"type": float, "default": None, "help": "delta_cr, see above."}),
        (
            "postprocessing",
            {
                "default": "norm_sub",
                "choices": ["none", "clip_nonnegative", "norm_sub"],
                "help": "Post-processing column next to the unbiased estimate. Default norm_sub.",
            },
        ),
        (
            "overwrite",
            {
                "action": "store_true",
                "default": False,
                "help": "Replace an existing --output directory.",
            },
        ),
    )

    _add_argparse_args, add_cli_arguments, cli_values = _prefixed_options("run", FLAGS)

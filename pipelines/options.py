"""PipelineOptions of the ESA stages (Beam's habit: one options class per pipeline).

One registration style: each class lists its flags once, as :class:`Flag` entries in ``FLAGS``;
defaults come from the config dataclasses the stage builds (``ShuffleConfig``, ``SimulationPlan``,
``AnalysisConfig``), so a default is written in one place. A class with a ``PREFIX`` registers its
flags on Beam's parser as ``--<prefix>_<name>`` (Beam parses every options class with one parser,
so two stages must not share a flag) and on its ``esa`` subcommand as ``--<name-with-hyphens>``;
ShuffleOptions has no prefix. Adding a flag is adding one ``Flag`` to ``FLAGS`` (and, if it can
be wrong, a check to ``validate``).

``validate()`` follows Beam's convention (a list of error strings, empty when fine): each error is
one line naming the flag, and ``pipelines.cli`` runs it before any work. Durations have one
grammar, ``transforms.shuffle_core.parse_duration_ms``. Beam's own flags (``--runner``,
``--streaming``, ``--direct_num_workers``, ...) pass through; any other flag is an error
(:func:`unknown_beam_flags`).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from simulators.fleet import DEFAULT_START
from transforms.analyze import AnalysisConfig
from transforms.analyze_core import DENSE_LIMIT
from transforms.encode import SimulationPlan
from transforms.shuffle import ShuffleConfig
from transforms.shuffle_core import MAX_EVENT_TIME_MS, WindowSpec, parse_duration_ms

__all__ = [
    "DEFAULT_BATCH_RUNNER",
    "INT64_MAX",
    "AnalyzeOptions",
    "Flag",
    "RunOptions",
    "ShuffleOptions",
    "SimulateOptions",
    "StageFlags",
    "add_stage_arguments",
    "format_duration_ms",
    "stage_option_values",
    "unknown_beam_flags",
    "with_default_runner",
]

# Batch runs default to the in-process portable runner: Beam 2.77's plain DirectRunner first tries
# to download Prism, which cannot work offline (DESIGN.md, Beam facts).
DEFAULT_BATCH_RUNNER = "FnApiRunner"
INT64_MAX = 2**63 - 1
# The latest event time whose window fits an Avro timestamp-millis every reader can decode
# (year 9999, the end of Python's datetime), as the shuffler enforces on data.
LATEST_WINDOW_END_MS = MAX_EVENT_TIME_MS + 1
POSTPROCESSING = ("none", "clip_nonnegative", "norm_sub")


def with_default_runner(options: PipelineOptions) -> PipelineOptions:
    """``options`` with a runner when none was given: FnApiRunner for batch, DirectRunner (the
    one that runs TestStream and unbounded sources) for ``--streaming``."""
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = "DirectRunner" if standard.streaming else DEFAULT_BATCH_RUNNER
    return options


_UNITS_MS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


def format_duration_ms(ms: int) -> str:
    """The shortest text ``parse_duration_ms`` reads back as ``ms`` (86400000 -> ``"1d"``)."""
    for unit, size in _UNITS_MS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise AssertionError("unreachable: every duration is a whole number of ms")


@dataclass(frozen=True)
class Flag:
    """One flag: attribute ``name`` (``crowd_threshold``), shown as ``--crowd-threshold``.

    ``type``: converter (int, float; str when None); ``switch``: a store_true flag; ``repeat``:
    may be given several times (a list); ``choices``: the allowed values.
    """

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    repeat: bool = False

    def argparse_keywords(self) -> dict[str, Any]:
        keywords: dict[str, Any] = {"default": self.default, "help": self.help}
        if self.switch:
            keywords["action"] = "store_true"
            return keywords
        if self.repeat:
            keywords["action"] = "append"
        if self.type is not None:
            keywords["type"] = self.type
        if self.choices is not None:
            keywords["choices"] = self.choices
        else:
            keywords["metavar"] = self.name.upper()
        return keywords


class StageFlags:
    """Mixin of the stage options classes: registers ``FLAGS`` on Beam's parser and on an ``esa``
    subcommand parser, reads them back, and validates them.

    Beam looks for ``_add_argparse_args`` in each options class's own ``__dict__`` (and lists
    only direct subclasses of PipelineOptions), so every subclass gets its own hook here and
    stays a direct subclass: ``class XOptions(StageFlags, PipelineOptions)``.
    """

    PREFIX: ClassVar[str] = ""
    FLAGS: ClassVar[tuple[Flag, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)

        def add_argparse_args(klass: Any, parser: Any) -> None:
            for flag in klass.FLAGS:
                parser.add_argument(
                    klass.beam_flag(flag), dest=klass.dest(flag), **flag.argparse_keywords()
                )

        cls._add_argparse_args = classmethod(add_argparse_args)

    @classmethod
    def dest(cls, flag: Flag) -> str:
        return f"{cls.PREFIX}_{flag.name}" if cls.PREFIX else flag.name

    @classmethod
    def cli_flag(cls, flag: Flag) -> str:
        return "--" + flag.name.replace("_", "-")

    @classmethod
    def beam_flag(cls, flag: Flag) -> str:
        return f"--{cls.dest(flag)}" if cls.PREFIX else cls.cli_flag(flag)

    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Register the flags on an ``esa`` subcommand parser as ``--crowd-threshold``, ..."""
        for flag in cls.FLAGS:
            parser.add_argument(cls.cli_flag(flag), dest=cls.dest(flag), **flag.argparse_keywords())

    @classmethod
    def cli_values(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The option values of a parsed ``esa`` namespace (keyword arguments for
        ``PipelineOptions(flags, **values)``)."""
        return {cls.dest(flag): getattr(args, cls.dest(flag)) for flag in cls.FLAGS}

    def value(self, name: str) -> Any:
        """The value of flag ``name`` (without the prefix)."""
        return getattr(self, f"{self.PREFIX}_{name}" if self.PREFIX else name)

    def validate(self, validator: Any = None) -> list[str]:
        """One-line errors (Beam's ``validate`` convention); empty when every flag is fine."""
        return []


def add_stage_arguments(parser: argparse.ArgumentParser, options_class: type[StageFlags]) -> None:
    """Register an options class's flags on an ``esa`` subcommand parser."""
    options_class.add_cli_arguments(parser)


def stage_option_values(
    args: argparse.Namespace, options_class: type[StageFlags]
) -> dict[str, Any]:
    """The values of an options class's flags from a parsed namespace."""
    return options_class.cli_values(args)


# ---------------------------------------------------------------------------------------------
# Checks shared by the validate() methods: each returns an error line or None
# ---------------------------------------------------------------------------------------------


def _int_in(flag: str, value: Any, low: int, high: int = INT64_MAX) -> str | None:
    if value is None or low <= value <= high:
        return None
    if high == INT64_MAX:
        return f"{flag} must be an integer >= {low} and < 2^63, got {value}"
    return f"{flag} must be an integer in [{low}, {high}], got {value}"


def _positive_finite(flag: str, value: float | None, allow_zero: bool = False) -> str | None:
    if value is None:
        return None
    if math.isfinite(value) and (value > 0 or (allow_zero and value == 0)):
        return None
    return f"{flag} must be a finite number {'>=' if allow_zero else '>'} 0, got {value}"


def _deletion(epsilon: float | None, delta: float | None) -> list[str]:
    if (epsilon is None) != (delta is None):
        return ["--deletion-epsilon and --deletion-delta go together"]
    if epsilon is None:
        return []
    errors = [_positive_finite("--deletion-epsilon", epsilon)]
    if not 0 < delta < 1:
        errors.append(f"--deletion-delta must be in (0, 1), got {delta}")
    return [error for error in errors if error]


def _window(text: str) -> str | None:
    try:
        period = parse_duration_ms(text)
    except ValueError as error:
        return f"--window: {error}"
    if period > LATEST_WINDOW_END_MS:
        return (
            f"--window {text} is longer than Avro timestamps reach (windows must end by year "
            f"9999: at most {format_duration_ms(LATEST_WINDOW_END_MS)})"
        )
    return None


def _is_local(path: str) -> bool:
    return "://" not in path


def _output_directory(flag: str, path: str | None, required: bool = True) -> str | None:
    """A directory the run may create or fill: not a file, under a writable directory."""
    if not path:
        return f"{flag} DIR is required" if required else None
    if not _is_local(path):
        return None
    target = Path(path)
    if target.exists() and not target.is_dir():
        return f"{flag} {path} exists and is not a directory"
    ancestor = target
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{flag} {path} cannot be created: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{flag} {path} cannot be created: {ancestor} is not writable"
    return None


def _existing_paths(flag: str, paths: Iterable[str] | None) -> str | None:
    for path in paths or ():
        if _is_local(path) and not Path(path).exists():
            return f"{flag} {path}: no such file or directory"
    return None


def _matching_glob(flag: str, pattern: str | None) -> str | None:
    if not pattern:
        return f"{flag} is required"
    from apache_beam.io.filesystems import FileSystems

    try:
        matches = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # noqa: BLE001 - a bad pattern is the user's to fix
        return f"cannot list {flag} {pattern!r}: {str(error).splitlines()[0]}"
    if not matches:
        return f"{flag} {pattern!r} matches no file"
    return None


def _errors(*found: str | None | Sequence[str]) -> list[str]:
    errors: list[str] = []
    for item in found:
        if isinstance(item, str):
            errors.append(item)
        elif item:
            errors.extend(item)
    return errors


# ---------------------------------------------------------------------------------------------
# The stages
# ---------------------------------------------------------------------------------------------

_SHUFFLE = ShuffleConfig  # defaults of the shuffler (transforms/shuffle.py)


class ShuffleOptions(StageFlags, PipelineOptions):
    """Flags of ``esa shuffle`` (the shuffler stage: transforms/shuffle.py)."""

    FLAGS = (
        Flag(
            "input",
            "Glob of report Avro files (schemas/report.avsc); in --streaming mode, the pattern "
            "watched for new files.",
        ),
        Flag("output", "Output directory: messages/, manifest.avro, dead_letter/, metrics.json."),
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
            "Target messages per origin shard of a crowd (memory per worker). Default "
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
    )

    def validate(self, validator: Any = None) -> list[str]:
        streaming = bool(self.view_as(StandardOptions).streaming)
        return _errors(
            _int_in("--crowd-threshold", self.crowd_threshold, 1),
            _deletion(self.deletion_epsilon, self.deletion_delta),
            _window(self.window),
            _int_in("--instance", self.instance, 0, 2**31 - 1),
            _int_in("--batch-records", self.batch_records, 1, 2**31 - 1),
            _int_in("--messages-per-shard", self.messages_per_shard, 1),
            _int_in("--messages-per-file", self.messages_per_file, 1),
            _positive_finite("--watch-interval", self.watch_interval),
            _positive_finite("--watch-for", self.watch_for, allow_zero=True),
            _output_directory("--output", self.output),
            ("--input is required" if not self.input else None)
            if streaming
            else _matching_glob("--input", self.input),
        )


_PLAN = SimulationPlan  # defaults of the device fleet (transforms/encode.py)


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
    )

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        errors = _errors(
            _int_in("--respondents", value("respondents"), 1),
            _int_in("--seed", value("seed"), 0),
            _int_in("--rounds", value("rounds"), 1, 2**31 - 1),
            _positive_finite("--device-budget", value("device_budget"), allow_zero=True),
            _int_in("--compression-level", value("compression_level"), -1, 9),
            _int_in("--messages-per-shard", value("messages_per_shard"), 1),
            _int_in("--messages-per-chunk", value("messages_per_chunk"), 1),
            _output_directory("--output", value("output")),
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
    """Flags of ``esa analyze`` (pipelines/analyze.py: transforms/aggregate.py + analyze.py);
    Beam-side ``--analyze_<name>``."""

    PREFIX = "analyze"
    FLAGS = (
        Flag(
            "input",
            "A shuffler release (DIR with messages/, manifest.avro, metrics.json; its instance "
            "from a name instance=<u>, the manifest or metrics.json) or a directory of "
            "instance=<u>/ releases. Repeatable: one release per shuffler instance.",
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
            "eps_cr of every instance's randomized deletion, when its metrics.json does not say "
            "(with --deletion-delta).",
            type=float,
        ),
        Flag("deletion_delta", "delta_cr, see above.", type=float),
        Flag(
            "batch_records",
            f"Records per column batch. Default {ShuffleConfig.batch_records}.",
            default=ShuffleConfig.batch_records,
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
    )

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        probability = value("failure_probability")
        return _errors(
            "--input is required (a release, or a directory of instance=<u>/)"
            if not value("input")
            else _existing_paths("--input", value("input")),
            _existing_paths("--truth", value("truth")),
            None
            if 0 < probability < 1
            else f"--failure-probability must be in (0, 1), got {probability}",
            _deletion(value("deletion_epsilon"), value("deletion_delta")),
            _int_in("--batch-records", value("batch_records"), 1, 2**31 - 1),
            _int_in("--dense-limit", value("dense_limit"), 0, 2**40),
            _output_directory("--output", value("output")),
        )


class RunOptions(StageFlags, PipelineOptions):
    """Flags of ``esa run`` (pipelines/run.py: simulate -> shuffle per instance -> analyze);
    Beam-side ``--run_<name>``."""

    PREFIX = "run"
    FLAGS = (
        Flag("output", "Output directory. Default results.", default="results"),
        Flag(
            "recipe",
            "Shipped recipe name or recipe JSON file. Default image_grid_onehot.",
            default="image_grid_onehot",
        ),
        Flag(
            "population",
            "Population spec (see esa simulate). Default: one that fits the recipe (an image "
            "for image recipes: image:horse with scikit-image installed, else image:disc; "
            "zipf for histograms; longitudinal for longitudinal recipes).",
        ),
        Flag(
            "respondents",
            "Simulated respondents. Default 120000 (the recipe's minimum crowd is 100000 per "
            "instance).",
            default=120_000,
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
    )

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        return _errors(
            _int_in("--respondents", value("respondents"), 1),
            _int_in("--instances", value("instances"), 1, 1024),
            _int_in("--parallel-shuffles", value("parallel_shuffles"), 1, 1024),
            _int_in("--seed", value("seed"), 0),
            _int_in("--crowd-threshold", value("crowd_threshold"), 1),
            _deletion(value("deletion_epsilon"), value("deletion_delta")),
            _output_directory("--output", value("output")),
        )


# ---------------------------------------------------------------------------------------------
# Beam's own flags
# ---------------------------------------------------------------------------------------------


class _BeamFlagsParser(argparse.ArgumentParser):
    """Parser of Beam's own option classes only (some register value-provider arguments)."""

    def add_value_provider_argument(self, *args: Any, **kwargs: Any) -> Any:
        return self.add_argument(*args, **kwargs)


def _beam_option_classes() -> list[type[PipelineOptions]]:
    found: dict[str, type[PipelineOptions]] = {}
    pending = list(PipelineOptions.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("apache_beam.") and "_add_argparse_args" in cls.__dict__:
            found.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    return list(found.values())


def unknown_beam_flags(arguments: Sequence[str]) -> list[str]:
    """The arguments among ``arguments`` that no Beam options class registers (positional
    leftovers included); ``--runner=X``, ``--streaming``, ... are known."""
    parser = _BeamFlagsParser(add_help=False, allow_abbrev=False)
    for cls in _beam_option_classes():
        cls._add_argparse_args(parser)  # noqa: SLF001 - Beam's extension point
    _, unknown = parser.parse_known_args(list(arguments))
    return unknown

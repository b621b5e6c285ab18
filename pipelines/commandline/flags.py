"""How the stage options are declared, read and checked (pipelines/commandline/options.py holds the stages).

One registration style: a stage lists its flags once, as :class:`Flag` entries in ``FLAGS`` of a
``class XOptions(StageFlags, PipelineOptions)``. A class with a ``PREFIX`` registers its flags on
Beam's parser as ``--<prefix>_<name>`` (Beam parses every options class with one parser, so two
stages must not share a flag) and on its ``esa`` subcommand as ``--<name-with-hyphens>``.

``validate()`` follows Beam's convention (a list of error strings, empty when fine); the checks
here make each error one line naming the flag. Durations have one grammar,
``transforms.shuffler.report_rows.parse_duration_ms``. :func:`unknown_beam_flags` tells Beam's own flags
(``--runner``, ``--streaming``, ...) from everything else.
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing
import os
import tempfile
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from apache_beam.options.pipeline_options import (
    DirectOptions,
    FlinkRunnerOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
)

from pipelines.engines import forked_workers
from pipelines.engines.process_workers import sdk_workers_asked, whole_number
from privacy.accounting.deletion import deletion_noise
from schemas.windows import MAX_EVENT_TIME_MS, parse_duration_ms

__all__ = [
    "lateness_error",
    "multi_process_flags",
    "runner_chosen",
    "parse_lateness_ms",
    "DEFAULT_BATCH_RUNNER",
    "INT64_MAX",
    "LATEST_WINDOW_END_MS",
    "Flag",
    "StageFlags",
    "add_stage_arguments",
    "format_duration_ms",
    "stage_option_values",
    "unknown_beam_flags",
    "with_default_runner",
    "worker_processes_of",
]

# Batch runs default to the in-process portable runner: Beam 2.77's plain DirectRunner first tries
# to download Prism, which cannot work offline (DESIGN.md, Beam facts).
DEFAULT_BATCH_RUNNER = "FnApiRunner"
INT64_MAX = 2**63 - 1
# Ranges of the size-like flags, checked before any work and stated in each flag's help: a size
# beyond them is a typo or an attack (a batch, shard or dense array no worker could hold).
MAX_BATCH_RECORDS = 1 << 22  # records per column batch: about 0.5 GB of report columns
MAX_MESSAGES_PER_SHARD = 100_000_000  # messages one worker holds while counting a shard
MAX_MESSAGES_PER_FILE = 100_000_000  # messages in one released file (and one worker)
MAX_MESSAGES_PER_CHUNK = 10_000_000  # messages a simulating worker generates at once
MAX_DENSE_LIMIT = 1 << 26  # a domain counted densely: 512 MB of int64 counts per crowd
MAX_INSTANCES = 1024  # shuffler instances of one esa run
MAX_PARALLEL_SHUFFLES = 64  # processes esa run starts at once
# The latest window end an Avro timestamp-millis every reader can decode holds (the last
# millisecond of year 9999, the end of Python's datetime), as the shuffler enforces on data.
LATEST_WINDOW_END_MS = MAX_EVENT_TIME_MS


def runner_chosen(options: PipelineOptions) -> bool:
    """Whether ``options`` name a runner or set one of Beam's DirectRunner options
    (``--direct_num_workers``, ``--direct_running_mode``, ...) to other than its default."""
    if options.view_as(StandardOptions).runner is not None:
        return True
    return any(name.startswith("direct_") for name in options.get_all_options(drop_default=True))


def multi_process_flags(workers: int) -> list[str]:
    """Beam flags of the multi-process DirectRunner with ``workers`` worker processes (named
    FnApiRunner: a bare DirectRunner hands a pipeline to Prism when a Prism job server is up)."""
    return [
        f"--runner={DEFAULT_BATCH_RUNNER}",
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={workers}",
    ]


def with_default_runner(options: PipelineOptions, worker_processes: int = 1) -> PipelineOptions:
    """``options`` with a runner when none was given: FnApiRunner for batch, DirectRunner (the
    one that runs TestStream and unbounded sources) for ``--streaming``. FnApiRunner's workers
    are closed together at the end (``pipelines/engines/worker_shutdown.py``) and a stage is
    sent only to the workers its input reaches (``pipelines/engines/busy_bundles.py``); the
    process is tuned for running bundles (``pipelines/engines/process_tuning.py``: Beam's DoFn
    specs found once per DoFn, short state-sampler sleeps, fewer garbage collections). On Prism
    and Flink, more than one SDK worker (``--sdk_worker_parallelism``) are processes forked
    from this driver, not threads of it (``pipelines/engines/process_workers.py``); Flink with
    ``--parallelism=N`` and workers on this machine gets N of them unless told otherwise.

    ``worker_processes`` > 1: the caller's work is large enough to spread over processes; then a
    batch pipeline given no runner and no ``--direct_*`` setting runs on the multi-process
    DirectRunner with that many workers, at most one per CPU (one CPU: in this process).

    Multi-process batch pipelines on FnApiRunner (chosen here or named with
    ``--direct_running_mode=multi_processing``) run on its subclass ForkedWorkerRunner, whose
    workers are forked, not spawned: by ``esa run``'s fork server, else by a fork of this driver
    where that is safe (``pipelines/engines/forked_workers.py``)."""
    from pipelines.engines.busy_bundles import send_only_busy_bundles
    from pipelines.engines.process_tuning import tune_this_process
    from pipelines.engines.process_workers import fork_sdk_workers
    from pipelines.engines.worker_shutdown import close_workers_together

    close_workers_together()
    send_only_busy_bundles()
    fork_sdk_workers()
    tune_this_process()
    standard = options.view_as(StandardOptions)
    direct = options.view_as(DirectOptions)
    workers = min(worker_processes, os.cpu_count() or 1)
    if workers > 1 and not standard.streaming and not runner_chosen(options):
        direct.direct_running_mode = "multi_processing"
        direct.direct_num_workers = workers
        standard.runner = forked_workers.RUNNER
    if standard.runner is None:
        standard.runner = "DirectRunner" if standard.streaming else DEFAULT_BATCH_RUNNER
    # After the default: --direct_running_mode=multi_processing given without --runner is
    # FnApiRunner's multi-process mode too (Beam's DirectRunner runs batch on it).
    if (
        standard.runner == DEFAULT_BATCH_RUNNER
        and direct.direct_running_mode == "multi_processing"
        and not standard.streaming
    ):
        standard.runner = forked_workers.RUNNER
    _sdk_workers_per_slot(options)
    return options


def _sdk_workers_per_slot(options: PipelineOptions) -> None:
    """On Flink with workers on this machine (``LOOPBACK``, given or Flink's default for a
    local master) and ``--parallelism=N`` > 1 but no ``--sdk_worker_parallelism`` above 1: N
    SDK workers (forked processes, ``engines/process_workers.py``); Beam's 1 would run every
    slot's Python in one interpreter. Flink gives each task of a fused stage one of them,
    round robin in the order the tasks start, so two tasks of one stage can still share a
    worker. (Beam's ``loadBalanceBundles``, which hands each bundle to a free worker instead,
    left a 12-element test pipeline without a result for 10 minutes: most likely a bundle
    waiting for a worker held by the bundle that feeds it.)"""
    portable = options.view_as(PortableOptions)
    flink = options.view_as(FlinkRunnerOptions)
    environment = (portable.environment_type or "").upper()
    local_master = (flink.flink_master or "[auto]") in ("[auto]", "[local]")
    if environment != "LOOPBACK" and not (environment == "" and local_master):
        return
    runner = (options.view_as(StandardOptions).runner or "").rsplit(".", 1)[-1]
    if runner not in ("FlinkRunner", "PortableRunner"):
        return
    slots = whole_number(flink.parallelism)
    if slots is not None and slots > 1 and portable.sdk_worker_parallelism in (1, "1", None):
        portable.sdk_worker_parallelism = slots


def worker_processes_of(options: PipelineOptions) -> int:
    """The worker processes ``options`` run the pipeline on (the shuffler and the analyzer cut
    their files into more ranges for more): the multi-process DirectRunner's workers
    (``--direct_num_workers=0``: one per CPU, as FnApiRunner reads it); else the most of a
    portable runner's ``--parallelism`` (Flink's task slots in use) and
    ``--sdk_worker_parallelism`` (its SDK worker processes, ``engines/process_workers.py``);
    else 1."""
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode == "multi_processing":
        if direct.direct_num_workers == 0:
            return multiprocessing.cpu_count()
        return direct.direct_num_workers or 1
    asked = (whole_number(options.view_as(FlinkRunnerOptions).parallelism),
             sdk_workers_asked(options))  # fmt: skip
    return max([1, *(number for number in asked if number is not None)])


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


class _StoreOnce(argparse.Action):
    """A one-value flag given twice is an error, not a silent last-one-wins
    (``--crowd-threshold 5 ... --crowd-threshold 100000``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._given: list[weakref.ref[argparse.Namespace]] = []  # Namespace is unhashable

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        self._given = [ref for ref in self._given if ref() is not None]
        if any(ref() is namespace for ref in self._given):
            parser.error(f"argument {option_string}: given more than once")
        self._given.append(weakref.ref(namespace))
        setattr(namespace, self.dest, values)


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

        if "_add_argparse_args" not in cls.__dict__:  # a class may still write its own
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
            keywords = flag.argparse_keywords()
            if not flag.switch and not flag.repeat:
                keywords["action"] = _StoreOnce
            parser.add_argument(cls.cli_flag(flag), dest=cls.dest(flag), **keywords)

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


def int_in(flag: str, value: Any, low: int, high: int = INT64_MAX) -> str | None:
    if value is None or low <= value <= high:
        return None
    if high == INT64_MAX:
        return f"{flag} must be an integer >= {low} and < 2^63, got {value}"
    return f"{flag} must be an integer in [{low}, {high}], got {value}"


def positive_finite(flag: str, value: float | None, allow_zero: bool = False) -> str | None:
    if value is None:
        return None
    if math.isfinite(value) and (value > 0 or (allow_zero and value == 0)):
        return None
    return f"{flag} must be a finite number {'>=' if allow_zero else '>'} 0, got {value}"


def deletion_errors(epsilon: float | None, delta: float | None) -> list[str]:
    if (epsilon is None) != (delta is None):
        return ["--deletion-epsilon and --deletion-delta go together"]
    if epsilon is None:
        return []
    errors = [positive_finite("--deletion-epsilon", epsilon)]
    if not 0 < delta < 1:
        errors.append(f"--deletion-delta must be in (0, 1), got {delta}")
    if not any(errors):
        try:
            deletion_noise(epsilon, delta)
        except ValueError as error:
            errors.append(f"--deletion-epsilon/--deletion-delta: {error}")
    return [error for error in errors if error]


def window_error(text: str) -> str | None:
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


def parse_lateness_ms(text: str) -> int:
    """``--allowed-lateness``: ``0`` or a duration (``30s``, ``1h``) in ms (ValueError)."""
    if str(text).strip() in ("0", "0s", "0ms"):
        return 0
    try:
        return parse_duration_ms(text)
    except ValueError as error:
        raise ValueError(f"--allowed-lateness: {error}") from None


def lateness_error(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        lateness = parse_lateness_ms(text)
    except ValueError as error:
        return str(error)
    if lateness > LATEST_WINDOW_END_MS:
        return f"--allowed-lateness {text} is longer than Avro timestamps reach"
    return None


def is_local(path: str) -> bool:
    return "://" not in path


def glob_base(pattern: str) -> str:
    """The directory a glob searches: its leading components without a wildcard."""
    parts = pattern.split("/")
    fixed = list(itertools.takewhile(lambda part: not any(c in part for c in "*?["), parts))
    if len(fixed) == len(parts):
        fixed = fixed[:-1]  # a plain file name: its directory
    return "/".join(fixed) or ("/" if pattern.startswith("/") else ".")


def apart(flag: str, path: str | None, others: Iterable[tuple[str, str | None]]) -> str | None:
    """An output directory that is neither inside nor around an input (a release written into
    the directory the analyzer reads, or an --overwrite that would remove the inputs)."""
    if not path or not is_local(path):
        return None
    target = os.path.realpath(path)
    for other_flag, other in others:
        if not other or not is_local(other):
            continue
        source = os.path.realpath(other)
        common = os.path.commonpath([target, source])
        if common == source:
            return f"{flag} {path} must not be inside {other_flag} {other}"
        if common == target:
            return f"{other_flag} {other} must not be inside {flag} {path}"
    return None


def output_directory(flag: str, path: str | None, required: bool = True) -> str | None:
    """A directory the run may create or fill: not a file, under a writable directory."""
    if not path:
        return f"{flag} DIR is required" if required else None
    if not is_local(path):
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
    try:  # os.access says yes to root everywhere: /proc, read-only mounts; try it for real
        os.rmdir(tempfile.mkdtemp(prefix=".esa-probe-", dir=ancestor))
    except OSError as error:
        return f"{flag} {path} cannot be created in {ancestor}: {error.strerror or error}"
    return None


def existing_paths(flag: str, paths: Iterable[str] | None) -> str | None:
    for path in paths or ():
        if is_local(path) and not Path(path).exists():
            return f"{flag} {path}: no such file or directory"
    return None


def matching_glob(flag: str, pattern: str | None) -> str | None:
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


def errors_of(*found: str | None | Sequence[str]) -> list[str]:
    errors: list[str] = []
    for item in found:
        if isinstance(item, str):
            errors.append(item)
        elif item:
            errors.extend(item)
    return errors


# ---------------------------------------------------------------------------------------------
# Beam's own flags
# ---------------------------------------------------------------------------------------------


class _BeamFlagsParser(argparse.ArgumentParser):
    """Parser of Beam's own option classes only (some register value-provider arguments)."""

    def add_value_provider_argument(self, *args: Any, **kwargs: Any) -> Any:
        return self.add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # A Beam flag with a bad value (e.g. --flink_version 1.18): one line, not Beam's usage.
        raise ValueError(message.splitlines()[0])


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
    leftovers included); ``--runner=X``, ``--streaming``, ... are known. ValueError (one line)
    when a Beam flag has a value Beam refuses."""
    parser = _BeamFlagsParser(add_help=False, allow_abbrev=False)
    for cls in _beam_option_classes():
        cls._add_argparse_args(parser)  # noqa: SLF001 - Beam's extension point
    _, unknown = parser.parse_known_args(list(arguments))
    return unknown

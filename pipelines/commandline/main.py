"""The ``esa`` command line.

Each subcommand lives in its own module that exposes ``register(subparsers)``; the module's
handler returns a process exit code. Every error the user can fix (a flag nobody knows, a bad
value, an unknown recipe, unreadable input, an output that cannot be written) is printed as ONE
line, ``esa <command>: error: <what>``, with exit status 2, before any work starts: argparse's
errors, the stage options' ``validate()`` (pipelines/commandline/options.py) and ``UsageError`` raised by a
handler.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
from typing import Any, NoReturn

# command -> module under pipelines/ that registers it. Only the module of the command being run is
# imported, so `esa privacy ...` does not pay for importing Beam.
COMMANDS = {
    "privacy": "pipelines.commandline.privacy",
    "recipes": "pipelines.commandline.recipes",
    "simulate": "pipelines.simulate",
    "shuffle": "pipelines.shuffle",
    "analyze": "pipelines.analyze",
    "aggregate": "pipelines.aggregate",
    "unshard": "pipelines.unshard",
    "run": "pipelines.run",
    "experiment": "pipelines.experiment",
    "train": "pipelines.train",
    "keys": "pipelines.commandline.keys",
    "analysis": "pipelines.interactive",
    "collect": "pipelines.collect",
}
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))
# command -> (module, class) of its options (validated before the handler runs); one module per
# stage, so a stage's command line loads no other party's code.
STAGE_OPTIONS = {
    "simulate": ("pipelines.commandline.simulate_options", "SimulateOptions"),
    "shuffle": ("pipelines.commandline.shuffle_options", "ShuffleOptions"),
    "analyze": ("pipelines.commandline.analyze_options", "AnalyzeOptions"),
    "run": ("pipelines.commandline.run_options", "RunOptions"),
}
USAGE_ERROR_STATUS = 2
IO_FAILURE_STATUS = 1  # the machine failed (a full disk, a denied permission): io_errors.py


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


class EsaArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (``<prog>: error: <message>``, exit 2) and no abbreviated
    flags (``--crowd`` is not ``--crowd-threshold``)."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR_STATUS, f"{self.prog}: error: {message.splitlines()[0]}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for ``command`` alone, or for every command when it is unknown or None."""
    parser = EsaArgumentParser(
        prog="esa",
        description="Encode-Shuffle-Analyze telemetry with shuffled differential privacy.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for module_name in modules:
        importlib.import_module(module_name).register(subparsers)
    _add_verbose(parser)
    return parser


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` on every command that runs pipelines (pipelines/commandline/stage_logs.py)."""
    from pipelines.commandline.stage_logs import VERBOSE_HELP

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if sub.get_default("accepts_pipeline_args"):
                    sub.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
                _add_verbose(sub)


def _fail(command: str, message: str, status: int = USAGE_ERROR_STATUS) -> int:
    print(
        f"esa {command}: error: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr
    )
    return status


def _check_stage_flags(command: str, args: argparse.Namespace, extra: list[str]) -> str | None:
    """The first problem with a stage's flags: one unknown to the stage and to Beam, or one
    its options class refuses."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    from pipelines.commandline import options as stage_options

    unknown = stage_options.unknown_beam_flags(extra)
    if unknown:
        return f"unrecognized arguments: {' '.join(unknown)}"
    if command not in STAGE_OPTIONS:
        return None
    module_name, class_name = STAGE_OPTIONS[command]
    options_class = getattr(importlib.import_module(module_name), class_name)
    view = PipelineOptions(extra, **options_class.cli_values(args))
    errors = view.view_as(options_class).validate()
    workers = view.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 0:  # Beam fails with an IndexError deep in its runner
        errors.append(f"--direct_num_workers must be >= 0 (0: one per core), got {workers}")
    return errors[0] if errors else None


HELP_FLAGS = ("-h", "--help")
HELP_COLUMNS = 100  # the width help_texts.py is rendered at


def render_help(command: str | None) -> str:
    """What ``esa --help`` (command None) or ``esa COMMAND --help`` prints, at
    :data:`HELP_COLUMNS` columns (importing the command's module, and so Beam)."""
    import contextlib
    import io
    import os

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        parser = build_parser(command)
        if command is not None:
            parser = parser._subparsers._group_actions[0].choices[command]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            parser.print_help()
        return out.getvalue()
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def _cached_help(argv: list[str]) -> str | None:
    """``esa --help`` and ``esa COMMAND --help`` answered from help_texts.py without importing
    any command (Beam takes seconds to import); None for anything else."""
    if argv in ([flag] for flag in HELP_FLAGS):
        key = ""
    elif len(argv) == 2 and argv[0] in COMMANDS and argv[1] in HELP_FLAGS:
        key = argv[0]
    else:
        return None
    from pipelines.commandline.help_texts import HELP

    return HELP.get(key)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cached = _cached_help(argv)
    if cached is not None:
        sys.stdout.write(cached)
        return 0
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command)
    # Beam's own flags (--runner, --direct_num_workers, ...) are left over; nothing else may be.
    args, extra = parser.parse_known_args(argv)
    handler = args.handler
    try:
        if not getattr(args, "accepts_pipeline_args", False):
            if extra:
                return _fail(args.command, f"unrecognized arguments: {' '.join(extra)}")
            with _locked_outputs(args):
                return int(handler(args) or 0)
        problem = _check_stage_flags(args.command, args, extra)
        if problem:
            return _fail(args.command, problem)
        from pipelines.commandline.stage_logs import stage_logs
        from pipelines.engines.runners import quiet_worker_hangups

        quiet_worker_hangups()  # Flink's job-end hang-up is not an error (pipelines/engines/runners.py)
        verbose = getattr(args, "verbose", False)
        with (
            _locked_outputs(args),
            stage_logs(args.command, verbose, usage_errors=(UsageError, ValueError, IOFailure)),
        ):
            try:
                return int(handler(args, extra) or 0)
            except Exception as error:  # a machine failure is one line, with no log to read
                if isinstance(error, UsageError) or (line := _io_failure(error, args)) is None:
                    raise
                raise IOFailure(line) from error
    except IOFailure as error:
        return _fail(args.command, str(error), IO_FAILURE_STATUS)
    except (UsageError, ValueError) as error:
        if not isinstance(error, UsageError) and (line := _io_failure(error, args)) is not None:
            return _fail(args.command, line, IO_FAILURE_STATUS)
        return _fail(args.command, str(error))
    except Exception as error:
        line = _io_failure(error, args)
        if line is None:
            raise  # a bug: its traceback is what a developer needs
        return _fail(args.command, line, IO_FAILURE_STATUS)


class IOFailure(Exception):
    """A full disk, a denied permission, ...: said in one line naming the path (io_errors.py)."""


def _io_failure(error: BaseException, args: argparse.Namespace) -> str | None:
    from pipelines.commandline.io_errors import io_failure

    return io_failure(error, [path for _, path in _output_paths(args)])


# The flags (argparse destinations) that name a folder a command writes: each is locked for the
# run (pipelines/commandline/output_lock.py). esa keys writes its files exclusively (O_EXCL) instead.
OUTPUT_DESTINATIONS = {
    "output": "--output",
    "private_output": "--private-output",
    "analyze_output": "--output",
    "simulate_output": "--output",
    "run_output": "--output",
    "analyze_runs_ledger": "--runs-ledger",
}


def _locked_outputs(args: argparse.Namespace) -> Any:
    """The exclusive locks of the folders ``args`` names for writing."""
    if args.command == "keys":
        return contextlib.nullcontext()
    from pipelines.commandline.output_lock import output_locks

    return output_locks(args.command, _output_paths(args))


def _output_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(flag, path)`` of every folder ``args`` names for writing (a shuffle's private folder
    too, given or not)."""
    outputs = [
        (flag, value)
        for name, flag in OUTPUT_DESTINATIONS.items()
        if isinstance(value := getattr(args, name, None), str) and value
    ]
    if args.command == "shuffle" and getattr(args, "output", None) and not args.private_output:
        outputs.append(("--private-output", args.output.rstrip("/\\") + ".private"))
    return outputs


def entry() -> NoReturn:
    """``esa`` (the console script, and ``python -m pipelines.commandline.main``): :func:`main`
    in this process, which then ends with its exit status without the interpreter's teardown.
    A pipeline command leaves Beam, gRPC, Arrow and its results' objects behind, which Python
    tears down object by object at exit: 0.33-0.41 s (three runs; 0.02-0.03 s now) from the
    return of ``esa analyze`` of 99,518 crowds on 2 cores to the end of its process. What exit
    must still do is done first, in exit's order: threading's exit hooks (an executor never
    shut down tells its idle workers to stop) and the joining of every thread that is not a
    daemon, then the ``atexit`` functions (logging's flush, ``weakref.finalize``'s clean-ups),
    then the standard streams' flush. An exception (a bug, argparse's exit) leaves the ordinary
    way."""
    status = main()
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls at exit:
    if shutdown is not None:  # threading's own exit hooks (an executor's idle workers are
        shutdown()  # told to stop), then every thread that is not a daemon joined
    else:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()  # then the atexit functions, in the same order as at exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    entry()

"""The ``esa`` command line.

Each subcommand lives in its own module that exposes ``register(subparsers)``; the module's
handler returns a process exit code. Errors the user can fix (bad parameters, unknown recipe,
unreadable input) are raised as ``UsageError`` and printed as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> module under pipelines/ that registers it. Only the module of the command being run is
# imported, so `esa privacy ...` does not pay for importing Beam.
COMMANDS = {
    "privacy": "pipelines.privacy_cli",
    "recipes": "pipelines.simulate",
    "simulate": "pipelines.simulate",
    "shuffle": "pipelines.shuffle",
    "analyze": "pipelines.analyze",
    "run": "pipelines.run",
    "experiment": "pipelines.experiment",
}
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for ``command`` alone, or for every command when it is unknown or None."""
    parser = argparse.ArgumentParser(
        prog="esa",
        description="Encode-Shuffle-Analyze telemetry with shuffled differential privacy.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for module_name in modules:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command)
    # Beam's standard flags (--runner, --direct_num_workers, ...) pass through untouched.
    args, extra = parser.parse_known_args(argv)
    handler = args.handler
    try:
        if getattr(args, "accepts_pipeline_args", False):
            return int(handler(args, extra) or 0)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return int(handler(args) or 0)
    except (UsageError, ValueError) as error:
        print(f"esa {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

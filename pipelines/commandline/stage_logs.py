"""Beam's, Prism's and Flink's logs go to a log file, not the terminal, unless ``--verbose``.

A pipeline's runner and its worker processes (multi-process DirectRunner, Prism, Flink's job
server, LOOPBACK workers) write their logs to file descriptor 2, which they inherit. While a stage
runs, :func:`stage_logs` points descriptor 2 at ``esa-<command>-<time>-<pid>.log`` under
``$ESA_LOG_DIR`` (default: the system's temporary directory, ``esa-logs/``) and Python's logging
at the same file; the terminal keeps stdout (summaries, tables) and gets the log's path when the
command fails, and a log that stayed empty is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["VERBOSE_HELP", "log_directory", "stage_logs", "terminal"]

VERBOSE_HELP = (
    "Show Beam's, Prism's and Flink's logs on stderr. Default: they go to a log file under "
    "$ESA_LOG_DIR (default: the temporary directory's esa-logs/), named when a command fails."
)
_TERMINAL: list[TextIO] = []


def log_directory() -> Path:
    return Path(os.environ.get("ESA_LOG_DIR") or Path(tempfile.gettempdir()) / "esa-logs")


def terminal() -> TextIO:
    """Where progress and messages for the person at the terminal go while logs are diverted."""
    return _TERMINAL[-1] if _TERMINAL else sys.stderr


@contextlib.contextmanager
def stage_logs(
    command: str, verbose: bool, usage_errors: tuple[type[BaseException], ...] = ()
) -> Iterator[Path | None]:
    """Divert descriptor 2 and Python's logging to a log file for the block (module docstring);
    yields the log's path (None with ``verbose``). A ``usage_errors`` exception is the user's
    one-line error and names no log."""
    if verbose:
        yield None
        return
    directory = log_directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"esa-{command}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        log = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        yield None  # no place for a log: leave the terminal as it is
        return
    sys.stderr.flush()
    saved = os.dup(2)
    terminal_stream = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8")
    root = logging.getLogger()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    previous_handlers = root.handlers[:]
    failed = True
    try:
        os.dup2(log.fileno(), 2)
        root.handlers = [handler]
        _TERMINAL.append(terminal_stream)
        yield path
        failed = False
    except usage_errors:
        failed = False
        raise
    finally:
        _TERMINAL.pop() if _TERMINAL and _TERMINAL[-1] is terminal_stream else None
        root.handlers = previous_handlers
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        terminal_stream.close()
        log.close()
        if path.stat().st_size == 0:
            path.unlink(missing_ok=True)
        elif failed:
            print(f"esa {command}: Beam's log: {path}", file=sys.stderr)

"""A progress line for stages that take more than a few seconds (tqdm), on the terminal only.

:func:`stage_progress` shows the stage and its elapsed time and, when the stage reports a count,
the rate, and against a known total the time left. :func:`counted_stage` feeds it the records
the pipeline's workers count (``schemas/progress_counts.py``: every process on this host writes
its running total into a directory the stage names in ``$ESA_PROGRESS_DIR``); its total may be
set once the driver knows it (``esa analyze`` after verifying its releases). Once all is
counted the line reads ``<stage>, finishing`` while the stage's later steps (grouping, writing)
run.
:func:`avro_input_records` is such a total: the records the input files' block headers state.

The line writes to the terminal's stderr even while Beam's logs are diverted
(``stage_logs.terminal``), appears only after ``delay`` seconds, is cleared when the stage ends,
and is off when stderr is not a terminal (pipes, CI, tests) or ``ESA_PROGRESS=0``; off, nothing
is counted (no directory, no variable).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from schemas import progress_counts

__all__ = [
    "StageLine",
    "avro_input_records",
    "counted_stage",
    "line_wanted",
    "print_above",
    "stage_progress",
]

POLL_SECONDS = 0.5
_DRAWN: list[Any] = []  # the tqdm bars being drawn now (print_above clears them)


class StageLine:
    """What a stage may tell its line while it runs: the total, once known (None: none)."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total

    def set_total(self, total: int | None) -> None:
        self.total = None if total is None else int(total)


def line_wanted() -> bool:
    """Whether a progress line is drawn: stderr is a terminal and ``ESA_PROGRESS`` is not 0."""
    from pipelines.commandline.stage_logs import terminal

    stream = terminal()
    return os.environ.get("ESA_PROGRESS") != "0" and getattr(stream, "isatty", lambda: False)()


@contextlib.contextmanager
def stage_progress(
    label: str,
    total: int | None = None,
    unit: str = "it",
    count: Callable[[], int] | None = None,
    delay: float = 2.0,
) -> Iterator[StageLine]:
    """The progress line of one stage for the duration of the block (module docstring)."""
    from pipelines.commandline.stage_logs import terminal

    line = StageLine(total)
    if not line_wanted():
        yield line
        return
    stream = terminal()
    started = time.time()
    done = threading.Event()

    def draw() -> None:
        if done.wait(delay):
            return
        from tqdm import tqdm

        sized = _columns(stream) > 0
        bar = tqdm(
            total=line.total,
            desc=label,
            unit=f" {unit}",
            unit_scale=True,
            file=stream,
            leave=False,
            # A terminal that states no size (some pseudo-terminals) gets 80 x 24.
            dynamic_ncols=sized,
            ncols=None if sized else 80,
            nrows=None if sized else 24,
            bar_format=None if count is not None else "{desc}: {elapsed}",
            delay=float("inf"),  # not drawn before its clock is set
        )
        # The elapsed time (and the rate) count from the start of the stage.
        bar.start_t = bar.last_print_t = started
        bar.delay = 0
        _DRAWN.append(bar)
        try:
            while True:
                if count is not None:
                    bar.total = line.total
                    done_now = count()
                    if line.total:
                        done_now = min(done_now, line.total)
                    if done_now > bar.n:
                        bar.update(done_now - bar.n)  # feeds tqdm's smoothed rate
                    if line.total and done_now >= line.total:  # counted all; the rest follows
                        bar.set_description(f"{label}, finishing", refresh=False)
                bar.refresh()
                if done.wait(POLL_SECONDS):
                    return
        finally:
            bar.close()
            _DRAWN.remove(bar)

    thread = threading.Thread(target=draw, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield line
    finally:
        done.set()
        thread.join()


def print_above(text: str) -> None:
    """``print(text)`` (stdout) on a line of its own above the progress line being drawn, if
    any: the line is cleared first and drawn again after, so the two never share a line."""
    bar = _DRAWN[-1] if _DRAWN else None
    if bar is None:
        print(text, flush=True)
        return
    with bar.get_lock():
        bar.clear(nolock=True)
        print(text, flush=True)
        bar.refresh(nolock=True)


def _columns(stream: object) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return 0


@contextlib.contextmanager
def counted_stage(
    label: str, total: int | None = None, unit: str = "records", delay: float = 2.0
) -> Iterator[StageLine]:
    """:func:`stage_progress` counting what the workers report (module docstring): sets
    ``$ESA_PROGRESS_DIR`` to a fresh directory for the block, restores it and removes the
    directory afterwards. Off a terminal it sets nothing."""
    if not line_wanted():
        yield StageLine(total)
        return
    directory = tempfile.mkdtemp(prefix="esa-progress-")
    previous = os.environ.get(progress_counts.ENVIRONMENT)
    os.environ[progress_counts.ENVIRONMENT] = directory
    try:
        with stage_progress(
            label, total, unit, count=lambda: progress_counts.total(directory), delay=delay
        ) as line:
            yield line
    finally:
        if previous is None:
            os.environ.pop(progress_counts.ENVIRONMENT, None)
        else:
            os.environ[progress_counts.ENVIRONMENT] = previous
        shutil.rmtree(directory, ignore_errors=True)


def avro_input_records(patterns: Iterable[str]) -> int | None:
    """The records the block headers of the local Avro files matching ``patterns`` state
    (``schemas.avro.container.records_in_blocks``: no data read or decompressed); None when a
    pattern names another file system or matches nothing readable. A total for the line only:
    any problem with the files is the pipeline's to report."""
    import glob

    from schemas.avro.container import Corrupt, records_in_blocks
    from schemas.regular_files import open_regular

    records, found = 0, False
    for pattern in patterns:
        if "://" in pattern:
            return None
        for path in glob.glob(pattern):
            with contextlib.suppress(OSError, ValueError, Corrupt):
                with open_regular(path, "rb") as handle:
                    records += records_in_blocks(handle)
                    found = True
    return records if found else None

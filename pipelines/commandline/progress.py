"""A progress line for stages that take more than a few seconds (tqdm), on the terminal only.

:func:`stage_progress` shows the stage, its elapsed time and, when the stage reports a count
against a known total, the rate and the time left. It writes to the terminal's stderr even while
Beam's logs are diverted (``stage_logs.terminal``), appears only after ``delay`` seconds, is
cleared when the stage ends, and is off when stderr is not a terminal (pipes, CI, tests) or
``ESA_PROGRESS=0``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

__all__ = ["stage_progress"]

POLL_SECONDS = 0.5


@contextlib.contextmanager
def stage_progress(
    label: str,
    total: int | None = None,
    unit: str = "it",
    count: Callable[[], int] | None = None,
    delay: float = 2.0,
) -> Iterator[None]:
    """The progress line of one stage for the duration of the block (module docstring)."""
    from pipelines.commandline.stage_logs import terminal

    stream = terminal()
    if os.environ.get("ESA_PROGRESS") == "0" or not getattr(stream, "isatty", lambda: False)():
        yield
        return
    from tqdm import tqdm

    bar = tqdm(
        total=total if count is not None else None,
        desc=label,
        unit=f" {unit}",
        unit_scale=True,
        file=stream,
        leave=False,
        delay=delay,
        dynamic_ncols=True,
        bar_format=None if count is not None and total else "{desc}: {elapsed}",
    )
    done = threading.Event()

    def poll() -> None:
        while not done.wait(POLL_SECONDS):
            if count is not None:
                bar.n = min(count(), total) if total else count()
            bar.refresh()

    thread = threading.Thread(target=poll, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        bar.close()

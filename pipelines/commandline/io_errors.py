"""I/O failures as one line: a full disk, a denied permission, a vanished file.

A stage that fails to write (``ENOSPC`` while a worker writes a release file, ``EACCES`` on an
output folder) used to end in a traceback of a hundred lines, the useful part buried in a
worker's stack. :func:`io_failure` finds the operating system's error in an exception, raised
directly or carried in the text of a runner's error (Beam wraps a worker's exception in its own),
and says it as ``<path>: <what>``; ``esa`` prints that as ``esa <command>: error: ...`` and exits
1. The stages themselves remove what a failed run wrote (``pipelines/shuffle.py``,
``pipelines/analyze.py``, ``pipelines/simulate.py`` stages and renames), so nothing is committed
and nothing is left that would make the next run refuse.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence

__all__ = ["IO_FAILURE_STATUS", "io_failure"]

IO_FAILURE_STATUS = 1
# What Python prints for an OSError with a file name: [Errno 28] No space left on device: '/x'
_PRINTED = re.compile(r"\[Errno (\d+)\] ([^\n\[\]]+?): '([^'\n]+)'")
_PRINTED_BARE = re.compile(r"\[Errno (\d+)\] ([^\n\[\]':]+)")
# Errors of the machine, not of the program: reported in one line.
_SYSTEM_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.EIO,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ENAMETOOLONG,
        errno.EMFILE,
        errno.ENFILE,
        errno.EFBIG,
        errno.ESTALE,
        errno.EBUSY,
        errno.ENXIO,
    }
)


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return seen


def io_failure(error: BaseException, outputs: Sequence[str] = ()) -> str | None:
    """``"<path>: <what>"`` when ``error`` is (or wraps, or carries the text of) an operating
    system error of the machine (a full disk, a denied permission, ...); None otherwise. An
    error that names no file (a ``write`` that found the disk full) names the command's
    ``outputs``, where it was writing."""
    found = _found(error)
    if found is None:
        return None
    path, what = found
    if path is None and outputs:
        path = " or ".join(outputs)
    return f"{path}: {what}" if path else what


def _found(error: BaseException) -> tuple[str | None, str] | None:
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in _SYSTEM_ERRNOS:
            what = link.strerror or os.strerror(link.errno)
            return (str(link.filename) if link.filename else None), what
    text = "\n".join(str(link) for link in _chain(error))
    for match in _PRINTED.finditer(text):
        if int(match[1]) in _SYSTEM_ERRNOS:
            return match[3], match[2].strip()
    for match in _PRINTED_BARE.finditer(text):
        if int(match[1]) in _SYSTEM_ERRNOS:
            return None, match[2].strip()
    return None

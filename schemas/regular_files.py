"""Opening only regular files: a FIFO, device or socket where a file was expected is refused
before it can block a reader forever.

``open()`` on a FIFO blocks until a writer appears, so a FIFO dropped where a stage looks for
its input (a report, a key, a recipe, a commit record) would hang the stage. :func:`open_regular`
opens with ``O_NONBLOCK`` (which never blocks, for any kind of file), checks the descriptor with
``fstat`` (so a file swapped in after a check is still caught) and only then hands back an
ordinary blocking file object; anything else raises :class:`NotRegularFile`, an ``OSError``
naming the path and what it is, which every caller already turns into its one-line refusal or
dead letter.
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import IO, Any

__all__ = [
    "ExposedPrivateFile",
    "NotRegularFile",
    "kind_of",
    "open_regular",
    "read_bytes",
    "check_private_mode",
    "read_text_and_mode",
    "read_text",
]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a regular file`` included)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """``path`` exists but is not a regular file (never opened for reading)."""

    def __init__(self, path: str | os.PathLike[str], mode: int) -> None:
        super().__init__(f"{kind_of(mode)}, not a regular file")
        self.strerror = f"{kind_of(mode)}, not a regular file"
        self.filename = os.fspath(path)

    def __str__(self) -> str:  # the callers' messages name the path already
        return self.strerror


def open_regular(path: str | os.PathLike[str], mode: str = "rb", **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` for reading ("rb" or "r") a regular file (symlinks followed);
    :class:`NotRegularFile` without blocking for anything else."""
    if mode not in ("r", "rb"):
        raise ValueError(f"open_regular reads only, got mode {mode!r}")
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise NotRegularFile(path, status.st_mode)
        flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
        fcntl.fcntl(descriptor, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(descriptor, mode, **kwargs)
    except BaseException:
        os.close(descriptor)
        raise


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    with open_regular(path, "rb") as handle:
        return handle.read()


def read_text(path: str | os.PathLike[str], encoding: str = "utf-8") -> str:
    with open_regular(path, "r", encoding=encoding) as handle:
        return handle.read()


class ExposedPrivateFile(OSError):
    """A private key file that group or others may read (mode & 0o077): refused, as ssh refuses
    an unprotected private key, naming the file and the fix."""

    def __init__(self, path: str | os.PathLike[str], mode: int) -> None:
        path = os.fspath(path)
        words = (
            f"permissions {stat.S_IMODE(mode):04o} let group or others read this private key; "
            f"refusing it: chmod 600 {path}"
        )
        super().__init__(words)
        self.strerror = words
        self.filename = path

    def __str__(self) -> str:
        return self.strerror


def check_private_mode(path: str | os.PathLike[str], mode: int) -> None:
    """:class:`ExposedPrivateFile` when ``mode`` lets group or others read or write a private
    key file."""
    if mode & 0o077:
        raise ExposedPrivateFile(path, mode)


def read_text_and_mode(path: str | os.PathLike[str], encoding: str = "utf-8") -> tuple[str, int]:
    """:func:`read_text` and the file's mode, both of the one open descriptor (check a private
    key's mode with :func:`check_private_mode` once its content says it is one)."""
    with open_regular(path, "r", encoding=encoding) as handle:
        return handle.read(), os.fstat(handle.fileno()).st_mode

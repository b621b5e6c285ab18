"""One writer per output: every ``esa`` command that writes an output folder holds an exclusive
lock on it (and on its private folder) for the whole run.

Two runs into one ``--output`` used to interleave: one run's release vanished, or one commit
record listed both runs' files. Each output path has a lock file named by the SHA-256 of its
absolute, symlink-resolved path in a lock directory (``$ESA_LOCK_DIR``, default
``<temp dir>/esa-locks``), locked with ``fcntl.flock(LOCK_EX | LOCK_NB)``: a second run finds it
taken and stops before any work with one line naming the output, exit 2. The kernel releases
the lock when the process ends, killed or not, so a crashed run never leaves its output locked.
Lock files live outside the outputs (nothing is added to a release or its parent folder) and
hold the path they lock, for whoever looks. flock coordinates the processes of one host (and of
hosts whose shared file system supports it for the lock directory); a commit record lists only
its own run's files (``pipelines/shuffle.py``'s run id) whatever happens across hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator, Sequence

__all__ = ["LOCK_DIR_VARIABLE", "OutputInUse", "lock_directory", "lock_path", "output_locks"]

LOCK_DIR_VARIABLE = "ESA_LOCK_DIR"
_REMOTE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")  # gs://, s3://, hdfs://: not locked here


class OutputInUse(ValueError):
    """Another run holds an output's lock (``esa`` prints it as one line, exit 2)."""


def lock_directory() -> str:
    return os.environ.get(LOCK_DIR_VARIABLE) or os.path.join(tempfile.gettempdir(), "esa-locks")


def _resolved(path: str) -> str:
    return os.path.realpath(os.path.abspath(path.rstrip("/\\") or "/"))


def lock_path(path: str) -> str:
    """The lock file of output ``path`` (local paths only)."""
    digest = hashlib.sha256(_resolved(path).encode()).hexdigest()[:32]
    return os.path.join(lock_directory(), f"{digest}.lock")


@contextlib.contextmanager
def output_locks(command: str, outputs: Sequence[tuple[str, str]]) -> Iterator[None]:
    """Hold the exclusive lock of every ``(flag, path)`` output for the ``with`` body;
    :class:`OutputInUse` (one line) when another run holds one. Paths on other file systems (``gs://``)
    are not locked here."""
    held: list[int] = []
    try:
        for flag, path in outputs:
            if not path or _REMOTE.match(path):
                continue
            directory = lock_directory()
            os.makedirs(directory, mode=0o700, exist_ok=True)
            descriptor = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                raise OutputInUse(
                    f"{flag} {path!r} is in use by another esa run (lock {lock_path(path)}); "
                    f"wait for it to finish: a second esa {command} into it would mix their files"
                ) from None
            held.append(descriptor)
            os.ftruncate(descriptor, 0)
            os.write(descriptor, f"{_resolved(path)}\n{os.getpid()}\n".encode())
        yield
    finally:
        for descriptor in held:
            os.close(descriptor)  # releases the lock

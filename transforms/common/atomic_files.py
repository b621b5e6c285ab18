"""Write-then-rename for files that workers publish under deterministic names.

A retried bundle re-runs its writes: a file named only by what it holds (a crowd's group, a part
index) is then written again under the same name, so retries never add files. Writing to a
temporary name first and renaming when the bytes are complete also means a reader never sees a
half-written file, and two attempts of one bundle (a retry beside a zombie attempt) never
interleave their bytes: the last rename wins with one attempt's whole file (the contract of
Beam's ``fileio.WriteToFiles`` and ``FileBasedSink``: write temporary, then finalize).

Temporary files go to ``<directory>/_temporary/`` of the file's top directory (given by the
caller), which the driver removes once the pipeline has finished (:func:`remove_temporary`), on
success and on failure, before anything is committed.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import IO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

TEMPORARY_DIR = "_temporary"


def temporary_path(root: str, name: str) -> str:
    """A fresh temporary path for ``name`` under ``root/_temporary`` (random per attempt)."""
    leaf = name.replace("/", "_")
    return FileSystems.join(root, TEMPORARY_DIR, f"{secrets.token_hex(8)}-{leaf}")


def publish(root: str, name: str, write: Callable[[IO[bytes]], None]) -> str:
    """Write ``root/name`` through ``write(handle)`` into a temporary file, then rename it to its
    final name (replacing an earlier attempt's file); returns the final path. A local path is
    written with the operating system's calls directly (:func:`_publish_local`)."""
    if FileSystems.get_scheme(root) is None:
        return _publish_local(root, name, write)
    final = FileSystems.join(root, *name.split("/"))
    temporary = temporary_path(root, name)
    with FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        write(sink)
    if FileSystems.get_scheme(final) is None:  # a local path: the rename needs the directory
        os.makedirs(os.path.dirname(final), exist_ok=True)
    FileSystems.rename([temporary], [final])
    return final


def _publish_local(root: str, name: str, write: Callable[[IO[bytes]], None]) -> str:
    """:func:`publish` of a local path: the same temporary name, write and rename as through
    Beam's ``LocalFileSystem`` (``os.rename``), without its per-call lookups of the file
    system; a directory is made only when a call finds it missing."""
    final = os.path.join(root, *name.split("/"))
    temporary = os.path.join(
        root, TEMPORARY_DIR, f"{secrets.token_hex(8)}-{name.replace('/', '_')}"
    )
    try:
        sink = open(temporary, "wb")  # closed by the with below
    except FileNotFoundError:
        os.makedirs(os.path.dirname(temporary), exist_ok=True)
        sink = open(temporary, "wb")
    with sink:
        write(sink)
    try:
        os.rename(temporary, final)
    except FileNotFoundError:
        if not os.path.exists(temporary):
            raise
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.rename(temporary, final)
    return final


def publish_bytes(root: str, name: str, content: bytes) -> str:
    """:func:`publish` of bytes already in memory."""
    return publish(root, name, lambda sink: sink.write(content))


def remove_temporary(root: str) -> bool:
    """Remove ``root/_temporary`` (left by failed attempts); returns whether there was one."""
    path = FileSystems.join(root, TEMPORARY_DIR)
    try:
        if FileSystems.exists(path):
            FileSystems.delete([path])
            return True
    except OSError:
        return False
    return False

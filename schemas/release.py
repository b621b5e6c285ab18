"""Committed outputs: the commit record ``_COMMIT.json`` that makes a directory a release.

A directory of output files is complete only when its commit record is there (Hadoop and Spark
mark success with a file written last; Beam's file sinks finalize temporary files in one step). The
record lists every file with its size, record count and SHA-256, plus whatever the reader needs to
interpret the files. It is written last and atomically (temporary file, then ``os.replace``), so a
killed writer leaves either no commit or the previous one, never half of one.

Two formats share this module:

* ``esa-release/1``: a shuffler release (``esa shuffle --output DIR``): ``messages/*.avro`` files
  and, per crowd, its status and the number of distinct respondents released
  (``respondents_released``: what the analyzer's n comes from, never counted from messages);
* ``esa-reports/1``: the report files of ``esa simulate``.

:func:`verify_release` is what a reader calls before it trusts a directory: it refuses (raises
:class:`ReleaseError` with a one-line message naming the file) an uncommitted directory, a file
listed but missing, a file present but not listed (a copy counted twice), a file whose size,
SHA-256 or record count differs from the record (truncated or altered), and any shuffler-private
file (dead letters with origins, manifests with exact counts, metrics, spill data) inside it.

**Signed records.** A shuffler release may carry its instance's Ed25519 signature in the field
``"signature"`` (``{"algorithm": "Ed25519", "key_id", "signed_at_ms", "value"}``) over the
canonical JSON of the whole record minus ``signature.value``, prefixed by a context string
(``schemas/commit_signing.py`` states the canonical form and what it does and does not protect).
:func:`write_commit` signs when given a ``signing_key``; :func:`verify_release` given
``shuffler_keys`` refuses an unsigned record, an unknown, wrong-instance or expired key, and a
record altered after signing.

Pure: the local file system and the standard library only (plus fastavro and pyarrow to count\nrecords).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro

from schemas import commit_signing
from schemas.signing_keys import ShufflerKeys, SigningKey

__all__ = [
    "COMMIT_FILE",
    "RELEASE_FORMAT",
    "REPORTS_FORMAT",
    "PRIVATE_NAMES",
    "ReleaseError",
    "FileEntry",
    "VerifiedRelease",
    "file_entry",
    "release_files",
    "sha256_of",
    "count_records",
    "count_avro_records",
    "write_commit",
    "read_commit",
    "verify_release",
    "is_private_path",
]

COMMIT_FILE = "_COMMIT.json"
RELEASE_FORMAT = "esa-release/1"
REPORTS_FORMAT = "esa-reports/1"
# Top-level names that are shuffler-private: never inside a release (SPEC: release layout).
PRIVATE_NAMES = frozenset({"dead_letter", "manifest.avro", "manifest", "metrics.json", "spill"})
_PRIVATE_PREFIXES = ("_spill",)
_CHUNK = 1 << 20
_STATUSES = ("released", "withheld")
# Bounds a commit record's numbers must keep: an instance is an Avro int; a threshold a long; no
# crowd is larger than the accountant accepts (privacy/accounting/variation_ratio.py,
# MAX_RESPONDENTS), so an absurd n is refused before any privacy computation.
_MAX_INSTANCE = 2**31 - 1
_MAX_THRESHOLD = 2**63 - 1
MAX_RESPONDENTS_RELEASED = 10**10


class ReleaseError(ValueError):
    """A directory that is not a complete, unaltered release; the message names the file."""


@dataclass(frozen=True)
class FileEntry:
    """One committed file: ``path`` relative to the directory, with '/' separators."""

    path: str
    bytes: int
    records: int | None  # None: not a record file (e.g. a JSON summary); never for .avro
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "records": self.records,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class VerifiedRelease:
    """A directory whose files all match its commit record: ``files`` are the committed files'
    paths (``path`` joined with each entry's path, in commit order), ``entries`` their records."""

    path: str
    commit: Mapping[str, Any]
    files: tuple[str, ...]
    entries: tuple[FileEntry, ...]
    signed_by: str | None = None  # the key id whose signature was verified

    @property
    def directory(self) -> str:
        return self.path

    @property
    def paths(self) -> tuple[str, ...]:
        return self.files

    @property
    def format(self) -> str:
        return str(self.commit["format"])

    @property
    def records(self) -> int:
        return sum(entry.records or 0 for entry in self.entries)


def is_private_path(relative: str) -> bool:
    """Whether a path relative to a release directory names shuffler-private data (any of its
    components is a private name)."""
    parts = relative.replace(os.sep, "/").split("/")
    return any(part in PRIVATE_NAMES or part.startswith(_PRIVATE_PREFIXES) for part in parts)


def sha256_of(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    return _sha256_and_size(path)[0]


def _sha256_and_size(path: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def count_avro_records(path: str) -> int:
    """Records in an Avro container file, summed from its block headers (ValueError if damaged)."""
    try:
        with open(path, "rb") as handle:
            return sum(block.num_records for block in fastavro.block_reader(handle))
    except (OSError, EOFError, ValueError, TypeError, KeyError, AssertionError) as error:
        raise ValueError(f"{path} is not a readable Avro file: {error}") from error


def count_records(path: str) -> int | None:
    """Records of an Avro container (block headers) or a Parquet file (footer); None for any
    other file. ValueError if an Avro or Parquet file is damaged."""
    if path.endswith(".avro"):
        return count_avro_records(path)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return int(pq.ParquetFile(path).metadata.num_rows)
        except (OSError, ValueError) as error:
            raise ValueError(f"{path} is not a readable Parquet file: {error}") from error
    return None


def file_entry(directory: str, relative: str, records: int | None = None) -> dict[str, Any]:
    """The commit entry (JSON form) of ``directory/relative``: size, SHA-256 and records
    (counted with :func:`count_records` unless given)."""
    relative = relative.replace(os.sep, "/")
    path = os.path.join(directory, *relative.split("/"))
    digest, size = _sha256_and_size(path)
    if records is None:
        records = count_records(path)
    return FileEntry(relative, size, None if records is None else int(records), digest).to_json()


def release_files(directory: str, pattern_dirs: Sequence[str] = ("messages",)) -> list[str]:
    """Relative paths ('/'-separated, sorted) of the regular files under ``directory/<dir>``."""
    found = []
    for top in pattern_dirs:
        for root, _, names in os.walk(os.path.join(directory, top)):
            found.extend(os.path.relpath(os.path.join(root, n), directory) for n in names)
    return sorted(name.replace(os.sep, "/") for name in found)


def _check_entry(raw: Any, index: int) -> FileEntry:
    if not isinstance(raw, Mapping):
        raise ReleaseError(f"{COMMIT_FILE}: files[{index}] is not an object")
    path, size, records, digest = (raw.get(k) for k in ("path", "bytes", "records", "sha256"))
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or ".." in path.split("/")
        or "\\" in path
    ):
        raise ReleaseError(f"{COMMIT_FILE}: files[{index}].path {path!r} is not a relative path")
    for name, value in (("bytes", size), ("records", records)):
        if value is None and name == "records" and not path.endswith((".avro", ".parquet")):
            continue  # not a record file
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ReleaseError(f"{COMMIT_FILE}: files[{index}].{name} {value!r} is not an int >= 0")
    if (
        not isinstance(digest, str)
        or len(digest) != 64
        or not all(c in "0123456789abcdef" for c in digest)
    ):
        raise ReleaseError(f"{COMMIT_FILE}: files[{index}].sha256 is not a hex SHA-256")
    return FileEntry(path, size, records, digest)


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_release_fields(commit: Mapping[str, Any], files: Sequence[FileEntry]) -> None:
    """The fields of an ``esa-release/1`` record (SPEC: release layout)."""
    for name, kind in (
        ("instance", (int, type(None))),
        ("recipes", list),
        ("parameters", dict),
        ("crowds", list),
    ):
        if name not in commit or not isinstance(commit[name], kind):
            raise ReleaseError(f"{COMMIT_FILE}: field {name!r} is missing or has the wrong type")
    instance = commit["instance"]
    if instance is not None and not _int_in(instance, 0, _MAX_INSTANCE):
        raise ReleaseError(f"{COMMIT_FILE}: instance {instance!r} is not an int in [0, 2^31 - 1]")
    parameters = commit["parameters"]
    threshold = parameters.get("crowd_threshold")
    if "crowd_threshold" in parameters and not _int_in(threshold, 1, _MAX_THRESHOLD):
        raise ReleaseError(
            f"{COMMIT_FILE}: parameters.crowd_threshold {threshold!r} is not an int in "
            "[1, 2^63 - 1]"
        )
    window_ms = parameters.get("window_ms")
    if "window_ms" in parameters and not _int_in(window_ms, 1, _MAX_THRESHOLD):
        raise ReleaseError(f"{COMMIT_FILE}: parameters.window_ms {window_ms!r} is not an int >= 1")
    released = commit.get("records_released")
    if any(entry.records is None for entry in files):
        raise ReleaseError(f"{COMMIT_FILE}: a release file does not state its records")
    if not isinstance(released, int) or released != sum(entry.records or 0 for entry in files):
        raise ReleaseError(
            f"{COMMIT_FILE}: records_released {released!r} is not the sum of the files' records"
        )
    messages = 0
    for index, crowd in enumerate(commit["crowds"]):
        if not isinstance(crowd, Mapping) or crowd.get("status") not in _STATUSES:
            raise ReleaseError(f"{COMMIT_FILE}: crowds[{index}] has no valid status")
        count = crowd.get("messages_released")
        respondents = crowd.get("respondents_released")
        if not isinstance(count, int) or count < 0:
            raise ReleaseError(f"{COMMIT_FILE}: crowds[{index}].messages_released is invalid")
        if crowd["status"] == "released":
            if not _int_in(respondents, 0, MAX_RESPONDENTS_RELEASED):
                raise ReleaseError(
                    f"{COMMIT_FILE}: crowds[{index}].respondents_released {respondents!r} is not "
                    f"an int in [0, {MAX_RESPONDENTS_RELEASED:.0e}]"
                )
            if isinstance(threshold, int) and respondents < threshold:
                raise ReleaseError(
                    f"{COMMIT_FILE}: crowds[{index}] is released with {respondents} respondents, "
                    f"below the crowd_threshold {threshold}"
                )
        elif respondents is not None or count:
            raise ReleaseError(f"{COMMIT_FILE}: withheld crowds[{index}] states counts")
        messages += count
    if messages != released:
        raise ReleaseError(
            f"{COMMIT_FILE}: crowds release {messages} messages, files hold {released} records"
        )


def write_commit(
    directory: str, record: Mapping[str, Any], signing_key: SigningKey | None = None
) -> str:
    """Write ``record`` as ``directory/_COMMIT.json`` atomically; returns its path.

    ``record`` must have ``format`` and ``files`` (FileEntry objects or their JSON form); an
    ``esa-release/1`` record is checked field by field before anything is written, then signed
    with ``signing_key`` when given (ValueError if the key is another instance's or expired).
    """
    body = dict(record)
    if not isinstance(body.get("format"), str) or not body["format"]:
        raise ValueError("commit record needs a non-empty 'format'")
    entries = [
        entry if isinstance(entry, FileEntry) else _check_entry(entry, index)
        for index, entry in enumerate(body.get("files") or [])
    ]
    body["files"] = [entry.to_json() for entry in sorted(entries, key=lambda e: e.path)]
    if len({entry.path for entry in entries}) != len(entries):
        raise ValueError("commit record lists a file twice")
    if body["format"] == RELEASE_FORMAT:
        try:
            _check_release_fields(body, entries)
        except ReleaseError as error:
            raise ValueError(str(error)) from error
    if signing_key is not None:
        body = commit_signing.sign_commit(body, signing_key)
    target = os.path.join(directory, COMMIT_FILE)
    temporary = os.path.join(directory, f".{COMMIT_FILE}.{secrets.token_hex(8)}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(body, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    return target


def read_commit(directory: str) -> dict[str, Any]:
    """The commit record of ``directory`` (ReleaseError if absent or not a valid record)."""
    if not os.path.isdir(directory):
        raise ReleaseError(f"{directory}: not a directory")
    path = os.path.join(directory, COMMIT_FILE)
    if not os.path.isfile(path):
        raise ReleaseError(
            f"{directory}: no {COMMIT_FILE}: the output is uncommitted (a partial or killed run)"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError, RecursionError) as error:
        raise ReleaseError(f"{path}: unreadable commit record: {error}") from error
    if not isinstance(record, dict) or not isinstance(record.get("format"), str):
        raise ReleaseError(f"{path}: not a commit record (an object with 'format')")
    if not isinstance(record.get("files"), list):
        raise ReleaseError(f"{path}: 'files' is not a list")
    return record


def _present_files(directory: str) -> Iterable[str]:
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(root, name), directory)
            yield relative.replace(os.sep, "/")
        for name in dirs:
            relative = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if is_private_path(relative):
                raise ReleaseError(
                    f"{os.path.join(directory, relative)}: shuffler-private data inside a release"
                )


def verify_release(
    directory: str,
    formats: Sequence[str] = (RELEASE_FORMAT, REPORTS_FORMAT),
    check_records: bool = True,
    shuffler_keys: ShufflerKeys | None = None,
) -> VerifiedRelease:
    """Check every file of ``directory`` against its commit record (see the module docstring).

    ``formats``: the commit formats the caller accepts (check ``.format`` when both are fine).
    ``check_records``: also count every Avro or Parquet file's records (block headers, footer) (a file whose SHA-256 matches holds what its
    writer committed; the count catches a record that states a wrong number).
    ``shuffler_keys``: require a release's record to carry a valid signature by one of them.
    """
    directory = directory.rstrip("/") or "/"
    commit = read_commit(directory)
    if commit["format"] not in formats:
        raise ReleaseError(
            f"{os.path.join(directory, COMMIT_FILE)}: format {commit['format']!r} is not one of "
            f"{list(formats)}"
        )
    signed_by = None
    if shuffler_keys is not None and commit["format"] == RELEASE_FORMAT:
        try:
            signed_by = commit_signing.verify_commit(commit, shuffler_keys).key_id
        except commit_signing.SignatureError as error:
            raise ReleaseError(f"{os.path.join(directory, COMMIT_FILE)}: {error}") from None
    entries = [_check_entry(raw, index) for index, raw in enumerate(commit["files"])]
    listed = {entry.path: entry for entry in entries}
    if len(listed) != len(entries):
        raise ReleaseError(f"{os.path.join(directory, COMMIT_FILE)}: a file is listed twice")
    if commit["format"] == RELEASE_FORMAT:
        _check_release_fields(commit, entries)
    for relative in _present_files(directory):
        if relative == COMMIT_FILE:
            continue
        path = os.path.join(directory, relative)
        if is_private_path(relative):
            raise ReleaseError(f"{path}: shuffler-private data inside a release")
        if relative not in listed:
            raise ReleaseError(f"{path}: not listed in {COMMIT_FILE} (a copy or a stray file)")
    for entry in entries:
        path = os.path.join(directory, *entry.path.split("/"))
        if not os.path.isfile(path):
            raise ReleaseError(f"{path}: listed in {COMMIT_FILE} but missing")
        digest, size = _sha256_and_size(path)
        if size != entry.bytes:
            raise ReleaseError(
                f"{path}: {size} bytes, committed {entry.bytes} (truncated or grown)"
            )
        if digest != entry.sha256:
            raise ReleaseError(f"{path}: SHA-256 differs from {COMMIT_FILE} (altered)")
        if check_records and entry.records is not None:
            try:
                counted = count_records(path)
            except ValueError as error:
                raise ReleaseError(f"{path}: unreadable record file") from error
            if counted != entry.records:
                raise ReleaseError(f"{path}: {counted} records, committed {entry.records}")
    paths = tuple(os.path.join(directory, *entry.path.split("/")) for entry in entries)
    return VerifiedRelease(directory, commit, paths, tuple(entries), signed_by)

"""Committed outputs: the commit record ``_COMMIT.json`` that makes a directory a release.

A directory of output files is complete only when its commit record is there (Hadoop and Spark
mark success with a file written last; Beam's file sinks finalize temporary files in one step). The
record lists every file with its size, record count and SHA-256, plus whatever the reader needs to
interpret the files. It is written last and atomically (temporary file, then ``os.replace``), so a
killed writer leaves either no commit or the previous one, never half of one.

Two formats share this module:

* ``esa-release/2``: a shuffler release (``esa shuffle --output DIR``) in crowd buckets
  (``schemas/release/crowd_buckets.py``): ``messages/<stem>-g<group>.avro`` message files and, per bucket
  of a window and instance, a crowd table ``crowds/<stem>.avro`` stating each crowd's status and
  the distinct respondents released (``respondents_released``: what the analyzer's n comes from,
  never counted from messages). The record lists both kinds of files and the totals
  (``records_released``, ``crowds_released``, ``crowds_withheld``, ``respondents_released``) and
  states ``parameters.crowd_buckets`` and (written since run ids) ``run``: the writing run's
  random id, commit time and window range (``pipelines/runs_ledger.py``); it lists no crowd
  (``schemas/release/crowd_tables.py`` reads the tables a few at a time and checks each). ``esa-release/1`` (one commit entry per crowd) is refused;
* ``esa-reports/1``: the report files of ``esa simulate``.

:func:`verify_release` is what a reader calls before it trusts a directory: it refuses (raises
:class:`ReleaseError` with a one-line message naming the file) an uncommitted directory, a file
listed but missing, a file present but not listed (a copy counted twice), a file whose size,
SHA-256 or record count differs from the record (truncated or altered), any shuffler-private
file (dead letters with origins, manifests with exact counts, metrics, spill data) inside it, and
a shuffler release whose crowd tables disagree with their stems, the parameters or the totals.

**Signed records.** A shuffler release may carry its instance's Ed25519 signature in the field
``"signature"`` (``{"algorithm": "Ed25519", "key_id", "signed_at_ms", "value"}``) over the
canonical JSON of the whole record minus ``signature.value``, prefixed by a context string
(``schemas/crypto/commit_signing.py`` states the canonical form and what it does and does not protect).
:func:`write_commit` signs when given a ``signing_key``; :func:`verify_release` given
``shuffler_keys`` refuses an unsigned record, an unknown, wrong-instance or expired key, and a
record altered after signing.

Pure: the local file system and the standard library only (plus fastavro and pyarrow to count
records).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro

from schemas.avro import container
from schemas.crypto import commit_signing
from schemas.crypto.signing_keys import ShufflerKeys, SigningKey
from schemas.regular_files import open_regular
from schemas.release.crowd_buckets import (
    CROWDS_DIR,
    MAX_CROWD_BUCKETS,
    BucketKey,
    parse_release_path,
)
from schemas.release.crowd_tables import (
    MAX_RESPONDENTS_RELEASED,
    CrowdTotals,
    ReleaseError,
    check_crowd_table,
    crowd_table_paths,
    crowd_table_totals,
    iter_crowds,
    parse_crowd_table,
    parse_crowd_table_columns,
    read_crowd_table,
)

__all__ = [
    "COMMIT_FILE",
    "RELEASE_FORMAT",
    "OLD_RELEASE_FORMATS",
    "MAX_RESPONDENTS_RELEASED",
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
    "crowd_table_paths",
    "read_crowd_table",
    "iter_crowds",
]

COMMIT_FILE = "_COMMIT.json"
RELEASE_FORMAT = "esa-release/2"
OLD_RELEASE_FORMATS = ("esa-release/1",)  # refused: written by an older esa shuffle
REPORTS_FORMAT = "esa-reports/1"
# Top-level names that are shuffler-private: never inside a release (SPEC: release layout).
PRIVATE_NAMES = frozenset({"dead_letter", "manifest.avro", "manifest", "metrics.json", "spill"})
_PRIVATE_PREFIXES = ("_spill",)
_CHUNK = 1 << 20
# Bounds a commit record's numbers must keep: an instance is an Avro int; a threshold a long
# (the largest n, MAX_RESPONDENTS_RELEASED, is schemas/release/crowd_tables.py's).
_MAX_INSTANCE = 2**31 - 1
_MAX_THRESHOLD = 2**63 - 1
_TOTALS = ("records_released", "crowds_released", "crowds_withheld", "respondents_released")


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
        """Records of the committed files (of a shuffler release: its messages, not its crowd
        tables)."""
        return sum(entry.records or 0 for entry in self.entries if not _is_table(self, entry))


def _is_table(release: VerifiedRelease, entry: FileEntry) -> bool:
    return release.format == RELEASE_FORMAT and entry.path.startswith(CROWDS_DIR + "/")


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
    with open_regular(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def count_avro_records(path: str) -> int:
    """Records in an Avro container file, summed from its block headers (ValueError if damaged).

    fastavro reads the header (writer schema and codec checked); the blocks' counts come from
    their headers, the data seeked over (``schemas.avro.container.walk_blocks``), unless the
    file is not whole blocks each followed by its sync marker: then fastavro reads it block by
    block (decompressing each), as it always did. A 1 MB-block file of a million released
    messages: 1-10 ms instead of 70-130 ms."""
    try:
        with open_regular(path, "rb") as handle:
            fastavro.block_reader(handle)  # the header, as before
            handle.seek(0)
            try:
                _, blocks = container.walk_blocks(handle, container.MAX_DECOMPRESSED_BYTES)
                return sum(block.count for block in blocks)
            except container.Corrupt:
                pass
        with open_regular(path, "rb") as handle:
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


def _old_format(commit: Mapping[str, Any]) -> str:
    return (
        f"format {commit['format']!r} is no longer read (one commit entry per crowd, written by "
        "an older esa shuffle); shuffle again"
    )


def _check_run(run: Any) -> None:
    """A release's ``run`` (``esa shuffle``: its id, commit time and window range)."""
    ok = isinstance(run, Mapping) and set(run) == {"id", "committed_at_ms", "windows"}
    if ok:
        run_id, windows = run["id"], run["windows"]
        ok = (
            isinstance(run_id, str)
            and len(run_id) == 32
            and all(c in "0123456789abcdef" for c in run_id)
            and _int_in(run["committed_at_ms"], 0, _MAX_THRESHOLD)
            and (
                windows is None
                or (
                    isinstance(windows, list)
                    and len(windows) == 2
                    and all(_int_in(w, 0, _MAX_THRESHOLD) for w in windows)
                    and windows[0] < windows[1]
                )
            )
        )
    if not ok:
        raise ReleaseError(
            f"{COMMIT_FILE}: run must be {{id: 32 hex digits, committed_at_ms: int, windows: "
            "[start, end] or null}"
        )


def _check_release_fields(commit: Mapping[str, Any], files: Sequence[FileEntry]) -> None:
    """The fields of an ``esa-release/2`` record (SPEC: release layout): types, parameters, the
    files' paths and the totals the files' entries imply (not the crowd tables' contents)."""
    for name, kind in (("instance", (int, type(None))), ("recipes", list), ("parameters", dict)):
        if name not in commit or not isinstance(commit[name], kind):
            raise ReleaseError(f"{COMMIT_FILE}: field {name!r} is missing or has the wrong type")
    if "crowds" in commit:
        raise ReleaseError(f"{COMMIT_FILE}: {commit['format']} lists no crowds (crowds/ tables do)")
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
    buckets = parameters.get("crowd_buckets")
    if not _int_in(buckets, 1, MAX_CROWD_BUCKETS):
        raise ReleaseError(
            f"{COMMIT_FILE}: parameters.crowd_buckets {buckets!r} is not an int in "
            f"[1, {MAX_CROWD_BUCKETS}]"
        )
    if "run" in commit:
        _check_run(commit["run"])
    for name in _TOTALS:
        if not _int_in(commit.get(name), 0, _MAX_THRESHOLD):
            raise ReleaseError(f"{COMMIT_FILE}: {name} {commit.get(name)!r} is not an int >= 0")
    messages = tables = 0
    table_stems = set()
    message_stems = {}
    for entry in files:
        parsed = parse_release_path(entry.path)
        if parsed is None:
            raise ReleaseError(
                f"{COMMIT_FILE}: {entry.path!r} is neither messages/<stem>-g<group>.avro nor "
                "crowds/<stem>.avro"
            )
        directory, key, _ = parsed
        if key.bucket >= buckets or (instance is not None and key.instance != instance):
            raise ReleaseError(
                f"{COMMIT_FILE}: {entry.path!r} is not a bucket of instance {instance!r} "
                f"with {buckets} buckets"
            )
        if entry.records is None:
            raise ReleaseError(f"{COMMIT_FILE}: {entry.path!r} does not state its records")
        if directory == CROWDS_DIR:
            tables += entry.records
            table_stems.add(key)
        else:
            messages += entry.records
            message_stems.setdefault(key, entry.path)
    if commit["records_released"] != messages:
        raise ReleaseError(
            f"{COMMIT_FILE}: records_released {commit['records_released']} is not the sum of the "
            f"message files' records ({messages})"
        )
    if commit["crowds_released"] + commit["crowds_withheld"] != tables:
        raise ReleaseError(
            f"{COMMIT_FILE}: crowds_released + crowds_withheld is not the sum of the crowd "
            f"tables' records ({tables})"
        )
    for key, path in message_stems.items():
        if key not in table_stems:
            raise ReleaseError(f"{COMMIT_FILE}: {path!r} has no crowd table of its bucket")


def write_commit(
    directory: str, record: Mapping[str, Any], signing_key: SigningKey | None = None
) -> str:
    """Write ``record`` as ``directory/_COMMIT.json`` atomically; returns its path.

    ``record`` must have ``format`` and ``files`` (FileEntry objects or their JSON form); an
    ``esa-release/2`` record is checked field by field before anything is written (its crowd
    tables' contents are not read), then signed with ``signing_key`` when given (ValueError if
    the key is another instance's or expired). ``esa-release/1`` is no longer written.
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
    if body["format"] in OLD_RELEASE_FORMATS:
        raise ValueError(_old_format(body))
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
        with open_regular(path, "r", encoding="utf-8") as handle:
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
    on_crowd_table: CrowdTableVisitor | None = None,
) -> VerifiedRelease:
    """Check every file of ``directory`` against its commit record (see the module docstring).

    ``formats``: the commit formats the caller accepts (check ``.format`` when both are fine).
    ``check_records``: also count every Avro or Parquet file's records (block headers, footer) (a
    file whose SHA-256 matches holds what its writer committed; the count catches a record that
    states a wrong number). A shuffler release's crowd tables are always read (after every
    message file is checked), a few at a time (at most :data:`TABLES_PER_READ`, decoded
    together as columns), and each checked column by column, row by row only to say what is
    wrong (``schemas.release.crowd_tables.check_crowd_table``), and against the record's totals.
    ``shuffler_keys``: require a release's record to carry a valid signature by one of them.
    ``on_crowd_table(commit, table_path, rows, message_paths)``: called with each crowd table's
    rows (crowd dicts, or ``CrowdColumns`` whose rows they are) once they are checked, and the (already checked) message files of its bucket, so that a
    reader counts, selects and cross-checks in this one pass over the release instead of reading
    its tables again.
    """
    directory = directory.rstrip("/") or "/"
    commit = read_commit(directory)
    if commit["format"] in OLD_RELEASE_FORMATS and RELEASE_FORMAT in formats:
        raise ReleaseError(f"{os.path.join(directory, COMMIT_FILE)}: {_old_format(commit)}")
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
    shuffled = commit["format"] == RELEASE_FORMAT
    if shuffled:
        _check_release_fields(commit, entries)
    for relative in _present_files(directory):
        if relative == COMMIT_FILE:
            continue
        path = os.path.join(directory, relative)
        if is_private_path(relative):
            raise ReleaseError(f"{path}: shuffler-private data inside a release")
        if relative not in listed:
            raise ReleaseError(f"{path}: not listed in {COMMIT_FILE} (a copy or a stray file)")
    stem_records = _stem_records(entries) if shuffled else {}
    stem_files: dict[BucketKey, list[str]] = {}
    for entry in entries if shuffled else ():
        parsed = parse_release_path(entry.path)
        if parsed is not None and parsed[0] != CROWDS_DIR:
            stem_files.setdefault(parsed[1], []).append(
                os.path.join(directory, *entry.path.split("/"))
            )
    totals = CrowdTotals()
    is_table = (lambda entry: entry.path.startswith(CROWDS_DIR + "/")) if shuffled else None
    tables = [entry for entry in entries if is_table and is_table(entry)]
    for entry in entries:  # every message file checked first
        if is_table and is_table(entry):
            continue
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
    for group in _table_groups(tables):  # read as a few tables at a time, checked one by one
        read = []
        for entry in group:
            path = os.path.join(directory, *entry.path.split("/"))
            if not os.path.isfile(path):
                break  # said in turn below, after the tables before it
            data = _table_bytes(path, entry)
            if data is None:
                break
            read.append((data, path))
        parsed = parse_crowd_table_columns(read) if len(read) > 1 else None
        checked: list[CrowdTotals | None] = []
        if parsed is not None:  # column by column, all the tables read at once
            stems = [parse_release_path(entry.path)[1] for entry in group[: len(parsed)]]  # type: ignore[index]
            checked = crowd_table_totals(parsed, stems, commit["parameters"], commit["instance"])
        for index, entry in enumerate(group):
            path = os.path.join(directory, *entry.path.split("/"))
            if parsed is not None and index < len(parsed):
                rows: Sequence[Mapping[str, Any]] = parsed[index]
            else:
                if not os.path.isfile(path):
                    raise ReleaseError(f"{path}: listed in {COMMIT_FILE} but missing")
                rows = _table_rows(path, entry)
            column_totals = checked[index] if index < len(checked) else None
            totals.add(_check_table(path, entry, commit, stem_records, rows, column_totals))
            if on_crowd_table is not None:
                key = parse_release_path(entry.path)[1]  # type: ignore[index]
                on_crowd_table(commit, path, rows, stem_files.get(key, []))
    if shuffled and (problem := totals.problem(commit)) is not None:
        raise ReleaseError(f"{os.path.join(directory, COMMIT_FILE)}: {problem}")
    paths = tuple(os.path.join(directory, *entry.path.split("/")) for entry in entries)
    return VerifiedRelease(directory, commit, paths, tuple(entries), signed_by)


# on_crowd_table(commit, table_path, rows, message_paths) of verify_release
CrowdTableVisitor = Callable[
    [Mapping[str, Any], str, Sequence[Mapping[str, Any]], Sequence[str]], None
]


def _stem_records(entries: Sequence[FileEntry]) -> dict[BucketKey, int]:
    """Records of each stem's message files (one number per bucket, not per crowd)."""
    records: dict[BucketKey, int] = {}
    for entry in entries:
        parsed = parse_release_path(entry.path)
        if parsed is not None and parsed[0] != CROWDS_DIR:
            records[parsed[1]] = records.get(parsed[1], 0) + (entry.records or 0)
    return records


# Crowd tables the verifying pass decodes together (parse_crowd_table_columns: numpy's cost is per
# call): at most this many, of at most this many bytes in all.
TABLES_PER_READ = 32
TABLE_BYTES_PER_READ = 8 << 20


def _table_groups(tables: Sequence[FileEntry]) -> Iterator[list[FileEntry]]:
    group: list[FileEntry] = []
    size = 0
    for entry in tables:
        if group and (len(group) >= TABLES_PER_READ or size + entry.bytes > TABLE_BYTES_PER_READ):
            yield group
            group, size = [], 0
        group.append(entry)
        size += entry.bytes
    if group:
        yield group


def _table_bytes(path: str, entry: FileEntry) -> bytes | None:
    """A committed crowd table's bytes, None unless they are its committed size and SHA-256
    (:func:`_table_rows` then says what differs)."""
    try:
        with open_regular(path, "rb") as handle:
            data = handle.read(entry.bytes + 1)
    except Exception:  # noqa: BLE001 - _table_rows says what is wrong, in turn
        return None
    if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        return None
    return data


def _table_rows(path: str, entry: FileEntry) -> list[dict[str, Any]]:
    """A committed crowd table's rows: size and SHA-256 of the bytes read once, then parsed."""
    with open_regular(path, "rb") as handle:
        data = handle.read(entry.bytes + 1)
    if len(data) != entry.bytes:
        raise ReleaseError(
            f"{path}: {len(data)}{'+' if len(data) > entry.bytes else ''} bytes, committed "
            f"{entry.bytes} (truncated or grown)"
        )
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise ReleaseError(f"{path}: SHA-256 differs from {COMMIT_FILE} (altered)")
    return parse_crowd_table(data, path)


def _check_table(
    path: str,
    entry: FileEntry,
    commit: Mapping[str, Any],
    stem_records: Mapping[BucketKey, int],
    rows: Sequence[Mapping[str, Any]],
    checked: CrowdTotals | None = None,
) -> CrowdTotals:
    """Check a committed crowd table's rows (schemas/release/crowd_tables.py; ``checked``: what
    ``crowd_table_totals`` gave for them); its totals."""
    if len(rows) != entry.records:
        raise ReleaseError(f"{path}: {len(rows)} records, committed {entry.records}")
    key = parse_release_path(entry.path)[1]  # type: ignore[index]  # checked by the fields
    return check_crowd_table(
        path,
        key,
        rows,
        commit["parameters"],
        commit["instance"],
        stem_records.get(key, 0),
        checked,
    )

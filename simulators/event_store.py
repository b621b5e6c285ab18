"""The on-device event store: one SQLite database per device (samplable-anonymous-aggregation 4.1-4.4).

A device keeps its events in streams of fixed schema (:data:`STREAMS`, e.g. ``keyboard(ts,
locale, text)``), deletes events older than the retention window (:meth:`EventStore.retain`), and
runs a recipe's query only through :meth:`EventStore.run_query`: on a read-only in-memory
projection that holds nothing but the approved columns, under an SQLite authorizer
(``sqlite3.Connection.set_authorizer``) that allows reading exactly the approved columns (the
query class's data fields plus the analysis' non-sensitive fields, Section 4.2) and a short list
of pure functions, and denies everything else: other columns and tables, the device's own audit
log, the schema, writes, ``ATTACH``, ``PRAGMA``. A query that reaches outside its class therefore
fails inside the database ("not authorized"), and :class:`QueryRefused` carries what it tried to
touch. Columns are named ``stream.column`` (``keyboard.text``).

A query also runs under the device's :class:`QueryLimits`: SQLite's progress handler
(``sqlite3.Connection.set_progress_handler``) aborts it after an instruction budget or a wall
time, and it may return at most one row per event it can read (a query of this class returns
events, or fewer rows; more means a join multiplied them). A query over a limit is aborted inside
the database and refused with the limit it hit; the store serves the next query as before.

The audit log (Section 4.4) lives in the same file, in a table no query may read: per query the
recipe, the decision, the value the device encoded and everything that left the device
(:meth:`EventStore.log`, :meth:`EventStore.amend`, :meth:`EventStore.audit`). It is also the
device's budget ledger, so it is append-only and hash-chained: entry i carries
``HMAC-SHA256(secret, mac_(i-1) || [i, round, kind, entry])`` under a 32-byte secret the device
draws from the OS CSPRNG (``secrets``) at enrollment and keeps in its keystore, a file beside the
database (``*.keystore.json``, mode 0600) that no query can reach, together with the number of
entries and the last MAC. A deleted, edited, reordered or truncated log, a dropped ``_audit``
table, a deleted database or a deleted keystore no longer matches the keystore's head, and
:meth:`EventStore.ledger` raises :class:`LedgerBroken`; the device then refuses to answer (it is
never reset to a full budget). The keystore also holds the device's configuration (its privacy
policy and query limits), set once at enrollment (:meth:`EventStore.configure`). Not covered:
restoring an older copy of both the database and the keystore together (a rollback), which a
real device prevents with a hardware monotonic counter.

Simulated devices write with ``synchronous=OFF`` and without fsync: a simulation survives no power
cut anyway, and an fsync per device would dominate the run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "STREAMS",
    "AUDIT_TABLE",
    "KEYSTORE_SUFFIX",
    "QueryLimits",
    "QueryRefused",
    "QueryResult",
    "LedgerBroken",
    "EventStore",
    "device_path",
    "keystore_path",
]

# stream -> its columns and SQLite types (fixed schema; ts is event time in ms since the epoch).
STREAMS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "keyboard": (("ts", "INTEGER"), ("locale", "TEXT"), ("text", "TEXT")),
    "contacts": (("ts", "INTEGER"), ("name", "TEXT"), ("phone", "TEXT")),
}
AUDIT_TABLE = "_audit"
KEYSTORE_SUFFIX = ".keystore.json"
_FUNCTIONS = frozenset(
    {"lower", "upper", "length", "substr", "trim", "coalesce", "count", "max", "min", "like"}
)
# Pure reading actions of a SELECT; everything else (writes, ATTACH, PRAGMA, ...) is denied.
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT})
# The progress handler runs every this many SQLite virtual-machine instructions.
_PROGRESS_STEP = 100
# Every query may spend this many instructions whatever the device holds (an empty store's
# honest query costs a few dozen).
_INSTRUCTION_FLOOR = 10_000
_KEYSTORE_VERSION = 1
_SCHEMA_VERSION = 1  # PRAGMA user_version of a database whose tables were created
_GENESIS = bytes(32)  # mac_0: the head of an empty ledger


@dataclass(frozen=True)
class QueryLimits:
    """How much one on-device query may cost (device configuration, never the recipe's).

    ``instructions_per_event``: SQLite VM instructions per event the query can read (plus a floor
    of 10,000); a query of this class scans its streams once (about 6 instructions per event for
    the keyboard query), a cross join costs the product of its tables. ``rows_per_event``: rows it
    may return per event it can read (at least 1). ``seconds``: wall time, checked every 100
    instructions.
    """

    instructions_per_event: int = 200
    rows_per_event: int = 1
    seconds: float = 0.25

    def __post_init__(self) -> None:
        for name, high in (("instructions_per_event", 10**6), ("rows_per_event", 10**3)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ValueError(
                    f"query limit {name} must be an integer in [1, {high}], got {value!r}"
                )
        seconds = self.seconds
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not math.isfinite(seconds)
            or not 0 < seconds <= 60
        ):
            raise ValueError(f"query limit seconds must be in (0, 60], got {seconds!r}")

    def instructions(self, events: int) -> int:
        return _INSTRUCTION_FLOOR + self.instructions_per_event * events

    def rows(self, events: int) -> int:
        return max(1, self.rows_per_event * events)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class QueryRefused(Exception):
    """The device did not run the query to its end. ``reason``: ``query_denied`` (it reached
    outside its query class or did not parse), ``query_instruction_limit``, ``query_row_limit``
    or ``query_time_limit`` (:class:`QueryLimits`)."""

    def __init__(self, message: str, denied: Sequence[str] = (), reason: str = "query_denied"):
        super().__init__(message)
        self.denied = tuple(denied)
        self.reason = reason


class LedgerBroken(Exception):
    """The audit log no longer matches the head its keystore recorded (or a part is missing)."""

    reason = "ledger_broken"


@dataclass(frozen=True)
class QueryResult:
    rows: list[tuple[Any, ...]]
    fields_read: frozenset[str]


def keystore_path(path: str | os.PathLike[str]) -> Path:
    """Where the keystore of the database at ``path`` lives (beside it)."""
    return Path(os.fspath(path) + KEYSTORE_SUFFIX)


def _mac(secret: bytes, previous: bytes, seq: int, round_id: str, kind: str, entry: str) -> bytes:
    record = json.dumps([seq, round_id, kind, entry], separators=(",", ":")).encode()
    return hmac.new(secret, previous + record, hashlib.sha256).digest()


class EventStore:
    """One device's SQLite database (a file, or ``:memory:``) and its keystore.

    Opening a file that does not exist enrolls a new device (a fresh keystore, then the
    database). A database whose keystore is missing, or a keystore whose database is missing,
    opens, but its ledger is broken."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._keystore_path = None if self.path == ":memory:" else keystore_path(self.path)
        database_existed = self.path != ":memory:" and os.path.exists(self.path)
        self._keystore: dict[str, Any] | None
        if self._keystore_path is None:
            self._keystore = self._new_keystore()
        elif self._keystore_path.exists():
            self._keystore = self._read_keystore()
        elif database_existed:
            self._keystore = None  # the database outlived its keystore: broken, never re-keyed
        else:
            self._keystore = self._new_keystore()
            self._write_keystore()
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA journal_mode=MEMORY")
        if self._db.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA_VERSION:
            self._create_schema()
        self._verified: tuple[int, bytes] | None = None  # (entries, head) checked this session

    def _create_schema(self) -> None:
        """The streams, the audit log and its append-only triggers (once per database: a table
        dropped later stays dropped, and its ledger broken)."""
        for stream, columns in STREAMS.items():
            spec = ", ".join(f"{name} {kind}" for name, kind in columns)
            self._db.execute(f"CREATE TABLE IF NOT EXISTS {stream} ({spec})")
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {AUDIT_TABLE} (seq INTEGER PRIMARY KEY, "
            "round TEXT NOT NULL, kind TEXT NOT NULL, entry TEXT NOT NULL, mac TEXT NOT NULL)"
        )
        # Append-only inside the database too (the chain is what an edit cannot get past).
        for verb in ("UPDATE", "DELETE"):
            self._db.execute(
                f"CREATE TRIGGER IF NOT EXISTS {AUDIT_TABLE}_no_{verb.lower()} BEFORE {verb} "
                f"ON {AUDIT_TABLE} BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"
            )
        self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- keystore ---------------------------------------------------------------------------------

    @staticmethod
    def _new_keystore() -> dict[str, Any]:
        return {
            "version": _KEYSTORE_VERSION,
            "secret": secrets.token_bytes(32).hex(),
            "ledger_entries": 0,
            "ledger_head": _GENESIS.hex(),
            "configuration": None,
        }

    def _read_keystore(self) -> dict[str, Any] | None:
        assert self._keystore_path is not None
        try:
            data = json.loads(self._keystore_path.read_text())
            if data.get("version") != _KEYSTORE_VERSION or len(bytes.fromhex(data["secret"])) != 32:
                return None
            int(data["ledger_entries"]), bytes.fromhex(data["ledger_head"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # unreadable: the ledger cannot be verified
        return data

    def _write_keystore(self) -> None:
        """Rewrite the keystore in place (mode 0600), padded with blanks to its old length rather
        than truncated (ext4 flushes a file truncated or renamed over on close: milliseconds per
        device). Not atomic, as nothing in a simulated device is durable (no fsync); a torn write
        leaves it unreadable, which breaks the ledger (fail closed) rather than resetting it."""
        if self._keystore_path is None:
            return
        assert self._keystore is not None
        data = json.dumps(self._keystore, sort_keys=True).encode()
        descriptor = os.open(self._keystore_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(descriptor, data.ljust(os.fstat(descriptor).st_size), 0)
        finally:
            os.close(descriptor)

    def configure(self, configuration: Mapping[str, Any]) -> None:
        """Set the device's configuration (privacy policy, query limits): once, at enrollment."""
        if self._keystore is None:
            raise LedgerBroken(f"{self.path}: the device's keystore is missing or unreadable")
        if self._keystore.get("configuration") is not None:
            raise ValueError(f"{self.path}: the device's configuration is set at enrollment only")
        self._keystore["configuration"] = json.loads(json.dumps(dict(configuration)))
        self._write_keystore()

    def configuration(self) -> dict[str, Any] | None:
        """The configuration set at enrollment (None when none was)."""
        if self._keystore is None:
            raise LedgerBroken(f"{self.path}: the device's keystore is missing or unreadable")
        configuration = self._keystore.get("configuration")
        return None if configuration is None else dict(configuration)

    # -- events ------------------------------------------------------------------------------

    def append(self, stream: str, rows: Iterable[Sequence[Any]]) -> int:
        """Append events to ``stream`` (tuples in the stream's column order); returns how many."""
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}; streams: {sorted(STREAMS)}")
        width = len(STREAMS[stream])
        rows = [tuple(row) for row in rows]
        if any(len(row) != width for row in rows):
            raise ValueError(f"stream {stream!r} rows have {width} columns")
        marks = ", ".join("?" * width)
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(f"INSERT INTO {stream} VALUES ({marks})", rows)
        return len(rows)

    def retain(self, now_ms: int, window_ms: int) -> int:
        """Retention policy: delete every event older than ``now_ms - window_ms``; returns how many."""
        deleted = 0
        with self._db:
            self._db.execute("BEGIN")
            for stream in STREAMS:
                cursor = self._db.execute(
                    f"DELETE FROM {stream} WHERE ts < ?", (now_ms - window_ms,)
                )
                deleted += cursor.rowcount
        return deleted

    def count(self, stream: str) -> int:
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        return int(self._db.execute(f"SELECT count(*) FROM {stream}").fetchone()[0])

    # -- queries under the authorizer and the limits ------------------------------------------------

    def run_query(
        self,
        sql: str,
        allowed_fields: Iterable[str],
        params: Sequence[Any] | Mapping[str, Any] = (),
        limits: QueryLimits | None = None,
    ) -> QueryResult:
        """Run ``sql`` reading only ``allowed_fields`` (``stream.column``) within ``limits``
        (default :class:`QueryLimits`); raise QueryRefused when the database denies it (an
        authorizer denial, or a table or column absent from the projection) or it goes over a
        limit (aborted by the progress handler, or too many rows)."""
        limits = limits or QueryLimits()
        allowed = frozenset(allowed_fields)
        read: set[str] = set()
        denied: list[str] = []

        def authorize(
            action: int, arg1: str | None, arg2: str | None, db: str | None, _: Any
        ) -> int:
            if action == sqlite3.SQLITE_READ:
                name = f"{arg1}.{arg2}"
                if db == "main" and arg1 in STREAMS and name in allowed:
                    read.add(name)
                    return sqlite3.SQLITE_OK
                # SQLITE_IGNORE would silently read NULL; a query outside its class must fail.
                denied.append(name)
                return sqlite3.SQLITE_DENY
            if action == sqlite3.SQLITE_FUNCTION:
                if (arg2 or "").lower() in _FUNCTIONS:
                    return sqlite3.SQLITE_OK
                denied.append(f"function {arg2}")
                return sqlite3.SQLITE_DENY
            if action in _ALLOWED_ACTIONS:
                return sqlite3.SQLITE_OK
            denied.append(f"action {action}" + (f" on {arg1}" if arg1 else ""))
            return sqlite3.SQLITE_DENY

        view, events = self._projection(allowed)
        max_steps = math.ceil(limits.instructions(events) / _PROGRESS_STEP)
        max_rows = limits.rows(events)
        tripped: list[str] = []
        steps = 0
        began = time.monotonic()

        def progress() -> int:
            nonlocal steps
            steps += 1
            if steps > max_steps:
                tripped.append("query_instruction_limit")
                return 1
            if time.monotonic() - began > limits.seconds:
                tripped.append("query_time_limit")
                return 1
            return 0

        try:
            view.execute("PRAGMA query_only=ON")
            view.set_authorizer(authorize)
            view.set_progress_handler(progress, _PROGRESS_STEP)
            rows = view.execute(sql, params).fetchmany(max_rows + 1)
        except (sqlite3.Error, ValueError, OverflowError) as error:
            # ValueError: text Python cannot hand to SQLite (a NUL, a lone surrogate).
            if tripped:
                raise self._over_limit(tripped[0], limits, events) from None
            raise QueryRefused(
                f"the database refused the query: {error}", denied or [str(error)]
            ) from None
        finally:
            view.close()
        if len(rows) > max_rows:
            raise self._over_limit("query_row_limit", limits, events)
        return QueryResult(rows, frozenset(read))

    @staticmethod
    def _over_limit(reason: str, limits: QueryLimits, events: int) -> QueryRefused:
        what = {
            "query_instruction_limit": f"{limits.instructions(events):,} SQLite instructions",
            "query_row_limit": f"{limits.rows(events):,} rows",
            "query_time_limit": f"{limits.seconds} s",
        }[reason]
        return QueryRefused(
            f"{reason}: the query went over the device's limit of {what} (for {events:,} "
            "events it can read) and was aborted",
            reason=reason,
        )

    def _projection(self, allowed: frozenset[str]) -> tuple[sqlite3.Connection, int]:
        """An in-memory database holding only the allowed columns of the streams (the query
        cannot name what is not there; the authorizer alone misses the columns of a
        ``JOIN ... USING``/``NATURAL JOIN``, which SQLite does not report to it), and how many
        events it holds."""
        view = sqlite3.connect(":memory:", isolation_level=None)
        events = 0
        for stream, columns in STREAMS.items():
            names = [name for name, _ in columns if f"{stream}.{name}" in allowed]
            if not names:
                continue
            spec = ", ".join(f"{name} {kind}" for name, kind in columns if name in names)
            view.execute(f"CREATE TABLE {stream} ({spec})")
            picked = ", ".join(names)
            rows = self._db.execute(f"SELECT {picked} FROM {stream}").fetchall()
            view.executemany(f"INSERT INTO {stream} VALUES ({', '.join('?' * len(names))})", rows)
            events += len(rows)
        return view, events

    # -- audit log: the hash-chained budget ledger ------------------------------------------------

    def _secret(self) -> bytes:
        if self._keystore is None:
            raise LedgerBroken(f"{self.path}: the device's keystore is missing or unreadable")
        return bytes.fromhex(self._keystore["secret"])

    def _records(self) -> list[tuple[int, str, str, str]]:
        """Every ledger record ``(seq, round, kind, entry)``, verified against the keystore's
        head; raises LedgerBroken."""
        secret = self._secret()
        assert self._keystore is not None
        try:
            rows = self._db.execute(
                f"SELECT seq, round, kind, entry, mac FROM {AUDIT_TABLE} ORDER BY seq"
            ).fetchall()
        except sqlite3.DatabaseError as error:
            raise LedgerBroken(f"{self.path}: the audit log cannot be read: {error}") from None
        head = _GENESIS
        for position, (seq, round_id, kind, entry, mac) in enumerate(rows, start=1):
            if seq != position:
                raise LedgerBroken(f"{self.path}: audit entry {position} is missing or moved")
            if not all(isinstance(v, str) for v in (round_id, kind, entry, mac)):
                raise LedgerBroken(f"{self.path}: audit entry {position} is malformed")
            head = _mac(secret, head, seq, round_id, kind, entry)
            if not hmac.compare_digest(head.hex(), mac):
                raise LedgerBroken(f"{self.path}: audit entry {position} does not match its MAC")
        recorded = int(self._keystore["ledger_entries"])
        if len(rows) != recorded or head.hex() != self._keystore["ledger_head"]:
            raise LedgerBroken(
                f"{self.path}: the audit log holds {len(rows)} entries and ends elsewhere than "
                f"the {recorded} entries the device's keystore recorded"
            )
        self._verified = (len(rows), head)
        return [(seq, round_id, kind, entry) for seq, round_id, kind, entry, _ in rows]

    def _append(self, round_id: str, kind: str, entry: str) -> None:
        if self._verified is None:
            self._records()
        assert self._verified is not None and self._keystore is not None
        count, head = self._verified
        seq = count + 1
        mac = _mac(self._secret(), head, seq, round_id, kind, entry)
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                f"INSERT INTO {AUDIT_TABLE} (seq, round, kind, entry, mac) VALUES (?, ?, ?, ?, ?)",
                (seq, round_id, kind, entry, mac.hex()),
            )
        self._keystore["ledger_entries"] = seq
        self._keystore["ledger_head"] = mac.hex()
        self._write_keystore()
        self._verified = (seq, mac)

    def log(self, round_id: str, entry: Mapping[str, Any]) -> None:
        """Append one audit entry (JSON) for ``round_id``; raises LedgerBroken on a broken ledger."""
        self._append(round_id, "entry", json.dumps(entry, sort_keys=True))

    def amend(self, round_id: str, key: str, value: Any) -> None:
        """Add ``key`` to the latest entry of ``round_id`` (what the transport sent, after the
        fact): appended as a record of its own (the log is append-only); :meth:`audit` shows it
        on that entry."""
        if not any(r == round_id and kind == "entry" for _, r, kind, _ in self._records()):
            raise KeyError(f"no audit entry for round {round_id!r}")
        self._append(round_id, "amend", json.dumps({"key": key, "value": value}, sort_keys=True))

    def ledger(self) -> list[dict[str, Any]]:
        """The verified audit entries, oldest first, amendments applied; raises LedgerBroken."""
        entries: list[dict[str, Any]] = []
        latest: dict[str, dict[str, Any]] = {}
        for _, round_id, kind, text in self._records():
            data = json.loads(text)
            if kind == "entry":
                entry = {"round": round_id, **data}
                entries.append(entry)
                latest[round_id] = entry
            else:
                latest[round_id][data["key"]] = data["value"]
        return entries

    def audit(self) -> list[dict[str, Any]]:
        """The device's audit log, oldest first (verified: raises LedgerBroken)."""
        return self.ledger()


def device_path(directory: str | os.PathLike[str], device: int) -> Path:
    """Where device ``device``'s database lives under a fleet directory."""
    return Path(directory) / f"{device // 1000:04d}" / f"device-{device:07d}.sqlite"

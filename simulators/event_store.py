"""The on-device event store: one SQLite database per device (samplable-anonymous-aggregation 4.1-4.4).

A device keeps its events in streams of fixed schema (:data:`STREAMS`, e.g. ``keyboard(ts,
locale, text)``), deletes events older than the retention window (:meth:`EventStore.retain`), and
runs a recipe's query only through :meth:`EventStore.run_query`: on a read-only in-memory
projection that holds nothing but the approved columns, under an SQLite authorizer
(``sqlite3.Connection.set_authorizer``) that allows reading exactly the approved columns (the query class's data fields plus the analysis' non-sensitive fields, Section 4.2) and a
short list of pure functions, and denies everything else: other columns and tables, the device's
own audit log, the schema, writes, ``ATTACH``, ``PRAGMA``. A query that reaches outside its
class therefore fails inside the database ("not authorized"), and :class:`QueryRefused` carries
what it tried to touch. Columns are named ``stream.column`` (``keyboard.text``).

The audit log (Section 4.4) lives in the same file, in a table no query may read: per query the
recipe, the decision, the value the device encoded and everything that left the device
(:meth:`EventStore.log`, :meth:`EventStore.audit`).

Simulated devices write with ``synchronous=OFF``: a simulation survives no power cut anyway, and
an fsync per device would dominate the run.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "STREAMS",
    "AUDIT_TABLE",
    "QueryRefused",
    "QueryResult",
    "EventStore",
    "device_path",
]

# stream -> its columns and SQLite types (fixed schema; ts is event time in ms since the epoch).
STREAMS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "keyboard": (("ts", "INTEGER"), ("locale", "TEXT"), ("text", "TEXT")),
    "contacts": (("ts", "INTEGER"), ("name", "TEXT"), ("phone", "TEXT")),
}
AUDIT_TABLE = "_audit"
_FUNCTIONS = frozenset(
    {"lower", "upper", "length", "substr", "trim", "coalesce", "count", "max", "min", "like"}
)
# Pure reading actions of a SELECT; everything else (writes, ATTACH, PRAGMA, ...) is denied.
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT})


class QueryRefused(Exception):
    """The database denied the query: it reached outside its query class (or did not parse)."""

    def __init__(self, message: str, denied: Sequence[str]) -> None:
        super().__init__(message)
        self.denied = tuple(denied)


@dataclass(frozen=True)
class QueryResult:
    rows: list[tuple[Any, ...]]
    fields_read: frozenset[str]


class EventStore:
    """One device's SQLite database (a file, or ``:memory:``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA journal_mode=MEMORY")
        for stream, columns in STREAMS.items():
            spec = ", ".join(f"{name} {kind}" for name, kind in columns)
            self._db.execute(f"CREATE TABLE IF NOT EXISTS {stream} ({spec})")
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {AUDIT_TABLE} (seq INTEGER PRIMARY KEY, "
            "round TEXT, entry TEXT)"
        )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    # -- queries under the authorizer -----------------------------------------------------------

    def run_query(
        self,
        sql: str,
        allowed_fields: Iterable[str],
        params: Sequence[Any] | Mapping[str, Any] = (),
    ) -> QueryResult:
        """Run ``sql`` reading only ``allowed_fields`` (``stream.column``); raise QueryRefused when
        the database denies it (an authorizer denial, or a table or column absent from the
        projection)."""
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

        view = self._projection(allowed)
        try:
            view.execute("PRAGMA query_only=ON")
            view.set_authorizer(authorize)
            rows = view.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as error:
            raise QueryRefused(
                f"the database refused the query: {error}", denied or [str(error)]
            ) from None
        finally:
            view.close()
        return QueryResult(rows, frozenset(read))

    def _projection(self, allowed: frozenset[str]) -> sqlite3.Connection:
        """An in-memory database holding only the allowed columns of the streams: the query
        cannot name what is not there. (The authorizer alone misses the columns of a
        ``JOIN ... USING``/``NATURAL JOIN``, which SQLite does not report to it.)"""
        view = sqlite3.connect(":memory:", isolation_level=None)
        for stream, columns in STREAMS.items():
            names = [name for name, _ in columns if f"{stream}.{name}" in allowed]
            if not names:
                continue
            spec = ", ".join(f"{name} {kind}" for name, kind in columns if name in names)
            view.execute(f"CREATE TABLE {stream} ({spec})")
            picked = ", ".join(names)
            rows = self._db.execute(f"SELECT {picked} FROM {stream}").fetchall()
            view.executemany(f"INSERT INTO {stream} VALUES ({', '.join('?' * len(names))})", rows)
        return view

    # -- audit log --------------------------------------------------------------------------------

    def log(self, round_id: str, entry: Mapping[str, Any]) -> None:
        """Append one audit entry (JSON) for ``round_id``."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                f"INSERT INTO {AUDIT_TABLE} (round, entry) VALUES (?, ?)",
                (round_id, json.dumps(entry, sort_keys=True)),
            )

    def amend(self, round_id: str, key: str, value: Any) -> None:
        """Add ``key`` to the latest entry of ``round_id`` (what the transport sent, after the fact)."""
        row = self._db.execute(
            f"SELECT seq, entry FROM {AUDIT_TABLE} WHERE round = ? ORDER BY seq DESC LIMIT 1",
            (round_id,),
        ).fetchone()
        if row is None:
            raise KeyError(f"no audit entry for round {round_id!r}")
        entry = json.loads(row[1])
        entry[key] = value
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                f"UPDATE {AUDIT_TABLE} SET entry = ? WHERE seq = ?",
                (json.dumps(entry, sort_keys=True), row[0]),
            )

    def audit(self) -> list[dict[str, Any]]:
        """The device's audit log, oldest first."""
        return [
            {"round": r, **json.loads(e)}
            for r, e in self._db.execute(f"SELECT round, entry FROM {AUDIT_TABLE} ORDER BY seq")
        ]


def device_path(directory: str | os.PathLike[str], device: int) -> Path:
    """Where device ``device``'s database lives under a fleet directory."""
    return Path(directory) / f"{device // 1000:04d}" / f"device-{device:07d}.sqlite"

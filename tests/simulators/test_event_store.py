"""The on-device SQLite event store: retention, the authorizer, query limits, the hash-chained
audit log."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time

import pytest

from simulators.event_store import (
    AUDIT_TABLE,
    EventStore,
    LedgerBroken,
    QueryLimits,
    QueryRefused,
    keystore_path,
)

APPROVED = ("keyboard.text", "keyboard.locale")


@pytest.fixture()
def store(tmp_path):
    with EventStore(tmp_path / "device.sqlite") as db:
        db.append("keyboard", [(10, "en_US", "hello world"), (50, "en_GB", "good bye")])
        db.append("contacts", [(10, "bob", "+15550001")])
        yield db


def test_approved_query_reads_only_approved_fields(store):
    result = store.run_query("SELECT text FROM keyboard WHERE locale LIKE 'en%'", APPROVED)
    assert sorted(result.rows) == [("good bye",), ("hello world",)]
    assert result.fields_read == frozenset(APPROVED)


def test_star_reads_only_the_approved_columns(store):
    result = store.run_query("SELECT * FROM keyboard WHERE locale = 'en_US'", APPROVED)
    assert result.rows == [("en_US", "hello world")]


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT text, ts FROM keyboard", "no such column: ts"),
        ("SELECT text FROM keyboard ORDER BY ts", "no such column: ts"),
        ("SELECT phone FROM contacts", "no such table: contacts"),
        ("SELECT k.text FROM keyboard k JOIN contacts c ON c.ts = k.ts", "no such table"),
        # SQLite does not show the authorizer the columns of USING/NATURAL joins; the
        # projection holds no contacts table and no keyboard.ts, so these fail too.
        ("SELECT text FROM keyboard JOIN contacts USING (ts)", "no such table"),
        ("SELECT text FROM keyboard NATURAL JOIN contacts", "no such table"),
        ("SELECT text FROM keyboard k JOIN keyboard j USING (ts)", "ts"),
        ("SELECT entry FROM _audit", "no such table: _audit"),
        ("SELECT name FROM sqlite_master", "sqlite_master.name is prohibited"),
        ("SELECT text FROM keyboard WHERE rowid > 0", "ROWID is prohibited"),
        ("DELETE FROM keyboard", "not authorized"),
        ("SELECT sqlite_version()", "not authorized to use function"),
        ("ATTACH DATABASE ':memory:' AS other", "not authorized"),
        ("PRAGMA table_info(keyboard)", "not authorized"),
    ],
)
def test_query_outside_its_class_fails_inside_the_database(store, sql, reason):
    with pytest.raises(QueryRefused, match="the database refused") as refused:
        store.run_query(sql, APPROVED)
    assert reason in str(refused.value) and refused.value.denied
    # Nothing changed and the store is usable (and writable by the device) again.
    assert store.count("keyboard") == 2 and store.count("contacts") == 1
    store.append("keyboard", [(60, "en_US", "again")])


@pytest.mark.parametrize(
    "sql", ["SELECT text FROM keyboard WHERE text = '\udc80'", "SELECT text FROM keyboard\x00"]
)
def test_text_sqlite_cannot_take_is_refused(store, sql):
    with pytest.raises(QueryRefused, match="the database refused"):
        store.run_query(sql, APPROVED)


def test_two_statements_are_refused(store):
    with pytest.raises(QueryRefused):
        store.run_query("SELECT text FROM keyboard; DELETE FROM keyboard", APPROVED)
    assert store.count("keyboard") == 2


def test_retention_deletes_events_older_than_the_window(store):
    assert store.retain(now_ms=100, window_ms=60) == 2  # keyboard ts 10 and contacts ts 10
    assert store.run_query("SELECT text FROM keyboard", APPROVED).rows == [("good bye",)]


def test_audit_log_appends_amends_and_persists(tmp_path):
    path = tmp_path / "d.sqlite"
    with EventStore(path) as db:
        db.log("round-1", {"status": "answered", "bucket": 3})
        db.amend("round-1", "sent", [{"payload_hex": "00"}])
    with EventStore(path) as db:
        assert db.audit() == [
            {"round": "round-1", "status": "answered", "bucket": 3, "sent": [{"payload_hex": "00"}]}
        ]
        with pytest.raises(KeyError):
            db.amend("round-2", "sent", [])


def test_unknown_stream_and_bad_rows(store):
    with pytest.raises(ValueError, match="unknown stream"):
        store.append("location", [(1, 2, 3)])
    with pytest.raises(ValueError, match="columns"):
        store.append("keyboard", [(1, "en_US")])


# -- query limits: a query bomb is aborted inside the database, refused, and the store serves on --

# Every joined table names the approved column (a table joined without naming a column is already
# denied by the authorizer, which sees it read as "keyboard.").
TRIPLE_CROSS_JOIN = (
    "SELECT a.text FROM keyboard a, keyboard b, keyboard c WHERE b.text <> '' AND c.text <> ''"
)
SIX_WAY_COUNT = "SELECT count(*) FROM keyboard a, keyboard b, keyboard c, keyboard d, " + (
    "keyboard e, keyboard f WHERE a.text || b.text || c.text || d.text || e.text || f.text <> ''"
)


@pytest.fixture()
def busy_store(tmp_path):
    """A device holding 40 keyboard events: a six-way cross join is 40^6 = 4.1e9 rows."""
    with EventStore(tmp_path / "busy.sqlite") as db:
        db.append("keyboard", [(i, "en_US", f"sentence {i}") for i in range(40)])
        yield db


@pytest.mark.parametrize(
    ("sql", "limits", "reason"),
    [
        # 64,000 rows from 40 events: more than one row per event.
        (TRIPLE_CROSS_JOIN, QueryLimits(), "query_row_limit"),
        # One row, 4.1e9 joined rows of work: the instruction budget (10,000 + 200 x 40) ends it.
        (SIX_WAY_COUNT, QueryLimits(), "query_instruction_limit"),
        # The same with an instruction budget it cannot reach: the wall time ends it.
        (
            SIX_WAY_COUNT,
            QueryLimits(instructions_per_event=10**6, seconds=0.05),
            "query_time_limit",
        ),
    ],
)
def test_query_bomb_is_aborted_refused_and_the_store_serves_on(busy_store, sql, limits, reason):
    began = time.monotonic()
    with pytest.raises(QueryRefused) as refused:
        busy_store.run_query(sql, APPROVED, limits=limits)
    assert time.monotonic() - began < 2.0
    assert refused.value.reason == reason and str(refused.value).startswith(reason)
    honest = busy_store.run_query("SELECT text FROM keyboard WHERE locale LIKE 'en%'", APPROVED)
    assert len(honest.rows) == 40


def test_honest_query_fits_the_limits_of_a_large_store(tmp_path):
    with EventStore(tmp_path / "large.sqlite") as db:
        db.append("keyboard", [(i, "en_US", f"a longer sentence number {i}") for i in range(5000)])
        rows = db.run_query("SELECT lower(text) FROM keyboard WHERE locale LIKE 'en%'", APPROVED)
        assert len(rows.rows) == 5000


def test_query_limits_are_checked():
    for bad in ({"instructions_per_event": 0}, {"rows_per_event": 10**4},
                {"seconds": float("nan")}, {"seconds": -1.0}, {"seconds": True}):  # fmt: skip
        with pytest.raises(ValueError, match="query limit"):
            QueryLimits(**bad)


# -- the audit log is a hash-chained ledger ---------------------------------------------------------


def _ledger_store(path):
    with EventStore(path) as db:
        for round_id in ("round-1", "round-2", "round-3"):
            db.log(round_id, {"status": "answered", "bucket": 1})
            db.amend(round_id, "sent", [{"payload_hex": "00"}])


def _raw(path, *statements):
    db = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        db.execute(statement)
    db.close()


TAMPERINGS = {
    "table dropped": lambda p: _raw(p, f"DROP TABLE {AUDIT_TABLE}"),
    "database deleted": lambda p: p.unlink(),
    "keystore deleted": lambda p: keystore_path(p).unlink(),
    "entry edited": lambda p: _raw(
        p,
        f"DROP TRIGGER {AUDIT_TABLE}_no_update",
        f"UPDATE {AUDIT_TABLE} SET entry = replace(entry, 'answered', 'refused') WHERE seq = 1",
    ),
    "entry deleted": lambda p: _raw(
        p, f"DROP TRIGGER {AUDIT_TABLE}_no_delete", f"DELETE FROM {AUDIT_TABLE} WHERE seq = 3"
    ),
    "log truncated": lambda p: _raw(
        p, f"DROP TRIGGER {AUDIT_TABLE}_no_delete", f"DELETE FROM {AUDIT_TABLE} WHERE seq > 4"
    ),
    "entries reordered": lambda p: _raw(
        p,
        f"DROP TRIGGER {AUDIT_TABLE}_no_update",
        f"UPDATE {AUDIT_TABLE} SET seq = -1 WHERE seq = 1",
        f"UPDATE {AUDIT_TABLE} SET seq = 1 WHERE seq = 3",
        f"UPDATE {AUDIT_TABLE} SET seq = 3 WHERE seq = -1",
    ),
    "keystore head rolled back": lambda p: keystore_path(p).write_text(
        keystore_path(p).read_text().replace('"ledger_entries": 6', '"ledger_entries": 4')
    ),
}


@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_a_tampered_ledger_is_broken_and_stays_broken(tmp_path, tampering):
    path = tmp_path / "d.sqlite"
    _ledger_store(path)
    with EventStore(path) as db:
        assert len(db.ledger()) == 3
    TAMPERINGS[tampering](path)
    for _ in range(2):  # reopening never heals it, and nothing can be appended
        with EventStore(path) as db:
            with pytest.raises(LedgerBroken):
                db.ledger()
            with pytest.raises(LedgerBroken):
                db.log("round-4", {"status": "answered"})


def test_the_log_is_append_only_in_the_database_too(tmp_path):
    path = tmp_path / "d.sqlite"
    _ledger_store(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        _raw(path, f"DELETE FROM {AUDIT_TABLE}")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        _raw(path, f"UPDATE {AUDIT_TABLE} SET entry = '{{}}'")


def test_keystore_holds_a_fresh_secret_outside_the_database(tmp_path):
    _ledger_store(tmp_path / "a.sqlite")
    _ledger_store(tmp_path / "b.sqlite")
    a, b = (json.loads(keystore_path(tmp_path / f"{n}.sqlite").read_text()) for n in "ab")
    assert len(bytes.fromhex(a["secret"])) == 32 and a["secret"] != b["secret"]
    assert a["ledger_entries"] == 6 and a["ledger_head"] != b["ledger_head"]
    assert stat.S_IMODE(os.stat(keystore_path(tmp_path / "a.sqlite")).st_mode) == 0o600
    db = sqlite3.connect(tmp_path / "a.sqlite")
    dump = "\n".join(db.iterdump())
    assert a["secret"] not in dump
    # The device's configuration is set once, at enrollment.
    with EventStore(tmp_path / "a.sqlite") as store:
        store.configure({"analysis_epsilon": 1.0})
        with pytest.raises(ValueError, match="enrollment"):
            store.configure({"analysis_epsilon": 100.0})
        assert store.configuration() == {"analysis_epsilon": 1.0}

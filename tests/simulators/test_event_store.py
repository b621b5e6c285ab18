"""The on-device SQLite event store: retention, the authorizer, the audit log."""

from __future__ import annotations

import pytest

from simulators.event_store import EventStore, QueryRefused

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

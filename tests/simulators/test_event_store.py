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


@pytest.mark.parametrize(
    ("sql", "denied"),
    [
        ("SELECT text, ts FROM keyboard", "keyboard.ts"),
        ("SELECT * FROM keyboard", "keyboard.ts"),
        ("SELECT phone FROM contacts", "contacts.phone"),
        ("SELECT k.text FROM keyboard k JOIN contacts c ON c.ts = k.ts", "contacts.ts"),
        ("SELECT entry FROM _audit", "_audit.entry"),
        ("SELECT name FROM sqlite_master", "sqlite_master.name"),
        ("DELETE FROM keyboard", "action"),
        ("SELECT sqlite_version()", "function sqlite_version"),
        ("ATTACH DATABASE ':memory:' AS other", "action"),
        ("PRAGMA table_info(keyboard)", "action"),
    ],
)
def test_query_outside_its_class_fails_inside_the_database(store, sql, denied):
    with pytest.raises(QueryRefused, match="refused") as refused:
        store.run_query(sql, APPROVED)
    assert any(d.startswith(denied) for d in refused.value.denied)
    # Nothing changed and the connection is usable (and writable by the device) again.
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

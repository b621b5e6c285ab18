"""Signed release commit records on disk (schemas/release/commit.py with schemas/crypto/commit_signing.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.crypto import signing_keys as sk
from schemas.release import commit as rel
from schemas.release import crowd_tables as rc
from tests import release_fixtures as fx
from tests.schemas.release.test_commit import TABLE, _release


@pytest.fixture(scope="module")
def key() -> sk.SigningKey:
    return sk.generate_signing_key(0)


def _signed(directory: Path, key: sk.SigningKey) -> dict:
    _release(directory, signing_key=key)
    return json.loads((directory / rel.COMMIT_FILE).read_text())


def test_a_signed_release_verifies_and_names_its_key(tmp_path: Path, key) -> None:
    on_disk = _signed(tmp_path, key)
    assert on_disk["signature"]["key_id"] == key.key_id
    verified = rel.verify_release(str(tmp_path), shuffler_keys=sk.ShufflerKeys([key.public]))
    assert verified.signed_by == key.key_id and verified.records == 8
    assert rel.verify_release(str(tmp_path)).signed_by is None  # not asked: not checked


def test_an_edited_signed_release_is_refused_naming_the_file(tmp_path: Path, key) -> None:
    """n ten times: a consistent lie (crowd table and totals re-committed) passes every check
    but the signature; editing only the table fails its SHA-256, only the totals the tables."""
    _signed(tmp_path, key)
    table = tmp_path / TABLE
    rows = rc.read_crowd_table(str(table))
    rows[0]["respondents_released"] = 40
    fx.write_avro(table, "released_crowd", fx.table_rows(rows))
    with pytest.raises(rel.ReleaseError, match="SHA-256"):  # even unauthenticated
        rel.verify_release(str(tmp_path))
    on_disk = json.loads((tmp_path / rel.COMMIT_FILE).read_text())
    fx.recommit(tmp_path, lambda record: record.update(respondents_released=40))
    signature = on_disk["signature"]
    fx.recommit(tmp_path, lambda record: record.update(signature=signature))
    rel.verify_release(str(tmp_path))  # unauthenticated, the lie passes every other check
    with pytest.raises(rel.ReleaseError, match="_COMMIT.json: .*altered after signing"):
        rel.verify_release(str(tmp_path), shuffler_keys=sk.ShufflerKeys([key.public]))


def test_edited_totals_of_a_signed_record_are_refused(tmp_path: Path, key) -> None:
    on_disk = _signed(tmp_path, key)
    on_disk["respondents_released"] = 40
    (tmp_path / rel.COMMIT_FILE).write_text(json.dumps(on_disk, indent=1))
    with pytest.raises(rel.ReleaseError, match="altered after signing"):
        rel.verify_release(str(tmp_path), shuffler_keys=sk.ShufflerKeys([key.public]))
    with pytest.raises(rel.ReleaseError, match="respondents_released 40, its crowd tables sum"):
        rel.verify_release(str(tmp_path))


def test_unsigned_release_is_refused_when_keys_are_required(tmp_path: Path, key) -> None:
    _release(tmp_path)
    with pytest.raises(rel.ReleaseError, match="not signed"):
        rel.verify_release(str(tmp_path), shuffler_keys=sk.ShufflerKeys([key.public]))


def test_a_key_of_another_instance_does_not_sign(tmp_path: Path) -> None:
    record = _release(tmp_path)
    record.pop("signature", None)
    before = (tmp_path / rel.COMMIT_FILE).read_text()
    with pytest.raises(ValueError, match="instance 1's"):
        rel.write_commit(str(tmp_path), record, signing_key=sk.generate_signing_key(1))
    assert (tmp_path / rel.COMMIT_FILE).read_text() == before  # nothing written

"""Signed commit records (schemas/crypto/commit_signing.py, schemas/crypto/signing_keys.py): the ways a party
who can write release storage but holds no shuffler key might make a record lie."""

from __future__ import annotations

import copy
import json
import os
import pickle
from pathlib import Path

import pytest

from schemas.crypto import commit_signing as cs
from schemas.crypto import signing_keys as sk
from schemas.crypto.analyzer_keys import KeyError_, generate_key, write_key_pair

NOW_MS = 1_800_000_000_000  # 2027-01-15: every key below is valid then
DAY_MS = 86_400_000


def _record(instance: int = 0, respondents: int = 1234) -> dict:
    return {
        "format": "esa-release/2",
        "instance": instance,
        "recipes": ["Zürich@1"],  # non-ASCII: signed as UTF-8
        "parameters": {
            "crowd_threshold": 100,
            "deletion_epsilon": 0.5,
            "deletion_delta": 1e-6,
            "crowd_buckets": 16,
        },
        "files": [
            {"path": "crowds/0-u0-b00003.avro", "bytes": 10, "records": 1, "sha256": "1" * 64},
            {
                "path": "messages/0-u0-b00003-g00000.avro",
                "bytes": 10,
                "records": 7,
                "sha256": "0" * 64,
            },
        ],
        "records_released": 7,
        "crowds_released": 1,
        "crowds_withheld": 0,
        "respondents_released": respondents,
    }


@pytest.fixture(scope="module")
def keys() -> dict[int, sk.SigningKey]:
    return {u: sk.generate_signing_key(u) for u in (0, 1)}


@pytest.fixture(scope="module")
def trusted(keys) -> sk.ShufflerKeys:
    return sk.ShufflerKeys([key.public for key in keys.values()])


def _signed(keys, instance: int = 0, **kwargs) -> dict:
    return cs.sign_commit(_record(instance, **kwargs), keys[instance], now_ms=NOW_MS)


def _refused(record: dict, trusted: sk.ShufflerKeys, *words: str) -> str:
    with pytest.raises(cs.SignatureError) as caught:
        cs.verify_commit(record, trusted, now_ms=NOW_MS)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 300, message
    for word in words:
        assert word in message, message
    return message


def test_a_signed_record_verifies_after_a_round_trip_through_its_file(keys, trusted) -> None:
    record = _signed(keys)
    assert set(record["signature"]) == {"algorithm", "key_id", "signed_at_ms", "value"}
    assert record["signature"]["algorithm"] == "Ed25519"
    # The file is pretty-printed with \u escapes; the canonical bytes come from the parsed value.
    on_disk = json.loads(json.dumps(record, indent=1))
    assert cs.verify_commit(on_disk, trusted, now_ms=NOW_MS) == keys[0].public
    reordered = dict(reversed(list(on_disk.items())))
    assert cs.verify_commit(reordered, trusted, now_ms=NOW_MS) == keys[0].public


def test_canonical_form_is_sorted_compact_utf8() -> None:
    assert cs.canonical_bytes({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode()
    with pytest.raises(ValueError):
        cs.canonical_bytes({"n": float("nan")})


def test_inflating_respondents_released_is_refused(keys, trusted) -> None:
    record = _signed(keys)
    record["respondents_released"] *= 10  # messages untouched (the crowd table's SHA-256 and
    # the per-crowd check against the tables refuse the rest of such a lie: test_release_crowds)
    _refused(record, trusted, "does not verify", "altered")


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r["parameters"].__setitem__("deletion_epsilon", 5.0),
        lambda r: r["files"][0].__setitem__("sha256", "2" * 64),
        lambda r: r.__setitem__("extra", True),
        lambda r: r["signature"].__setitem__("signed_at_ms", NOW_MS - 1),
    ],
    ids=["parameters", "file digest", "added field", "signing time"],
)
def test_any_other_edit_is_refused(keys, trusted, edit) -> None:
    record = _signed(keys)
    edit(record)
    _refused(record, trusted, "altered")


def test_another_instances_record_cannot_pass_as_this_instances(keys, trusted) -> None:
    other = _signed(keys, instance=1)
    assert cs.verify_commit(other, trusted, now_ms=NOW_MS) == keys[1].public  # genuine as 1
    moved = copy.deepcopy(other)
    moved["instance"] = 0  # replayed as instance 0's
    _refused(moved, trusted, "instance 1", "states instance 0")


def test_a_key_signs_only_its_own_instance(keys, trusted) -> None:
    with pytest.raises(cs.SignatureError, match="instance 0's"):
        cs.sign_commit(_record(instance=1), keys[0], now_ms=NOW_MS)
    # Even a record made by hand with instance 0's key for instance 1 is refused.
    forged = _record(instance=1)
    forged["signature"] = {"algorithm": "Ed25519", "key_id": keys[0].key_id, "signed_at_ms": NOW_MS}
    forged["signature"]["value"] = keys[0].sign(cs.signed_message(forged)).hex()
    _refused(forged, trusted, "of shuffler instance 0", "states instance 1")


def test_re_signing_with_an_attackers_key_is_refused(keys, trusted) -> None:
    attacker = sk.generate_signing_key(0)
    record = _record(respondents=10**6)
    _refused(cs.sign_commit(record, attacker, now_ms=NOW_MS), trusted, "not among")
    # The attacker's key under the genuine key's id: the signature does not verify.
    posing = sk.SigningKey(
        sk.SigningPublicKey(keys[0].key_id, attacker.public.public_bytes, 0),
        attacker.private_key,
    )
    _refused(cs.sign_commit(record, posing, now_ms=NOW_MS), trusted, "does not verify")


def test_an_unsigned_record_is_refused(trusted) -> None:
    _refused(_record(), trusted, "not signed")


def test_expired_and_future_signatures_are_refused(keys) -> None:
    short = sk.generate_signing_key(0, NOW_MS - 10 * DAY_MS, NOW_MS - DAY_MS)
    ring = sk.ShufflerKeys([short.public])
    with pytest.raises(cs.SignatureError, match="not valid at"):
        cs.sign_commit(_record(), short, now_ms=NOW_MS)  # the signer refuses an expired key
    earlier = cs.sign_commit(_record(), short, now_ms=NOW_MS - 2 * DAY_MS)
    assert cs.verify_commit(earlier, ring, now_ms=NOW_MS) == short.public  # signed while valid
    # The same key bytes with a wider validity sign after the end: refused by the narrow key.
    wide = sk.SigningKey(
        sk.SigningPublicKey(short.key_id, short.public.public_bytes, 0), short.private_key
    )
    _refused(cs.sign_commit(_record(), wide, now_ms=NOW_MS), ring, "outside its validity")
    ahead = cs.sign_commit(_record(), keys[0], now_ms=NOW_MS + DAY_MS)
    _refused(ahead, sk.ShufflerKeys([keys[0].public]), "in the future")


HUGE = "ab" * 5_000_000


@pytest.mark.parametrize(
    ("block", "words"),
    [
        (None, "not an object"),
        ([1, 2], "not an object"),
        ("deadbeef", "not an object"),
        ("only algorithm", "exactly"),
        ("no value", "exactly"),
        ("extra field", "exactly"),
        ({"algorithm": "RSA"}, "algorithm"),
        ({"algorithm": HUGE}, "algorithm"),
        ({"key_id": "XYZ"}, "key_id"),
        ({"key_id": HUGE}, "key_id"),
        ({"signed_at_ms": "now"}, "signed_at_ms"),
        ({"signed_at_ms": True}, "signed_at_ms"),
        ({"signed_at_ms": 10**30}, "signed_at_ms"),
        ({"value": "zz" * 64}, "value"),
        ({"value": "00" * 63}, "value"),
        ({"value": HUGE}, "value"),
        ({"value": 12}, "value"),
        ({"value": "00" * 64}, "does not verify"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_a_garbled_signature_is_refused_in_one_short_line(keys, trusted, block, words) -> None:
    record = _signed(keys)
    if isinstance(block, dict):
        record["signature"].update(block)
    elif block == "only algorithm":
        record["signature"] = {"algorithm": "Ed25519"}
    elif block == "no value":
        del record["signature"]["value"]
    elif block == "extra field":
        record["signature"]["comment"] = "hi"
    else:
        record["signature"] = block
    _refused(record, trusted, words)


def test_a_record_without_canonical_form_is_refused_not_a_traceback(keys, trusted) -> None:
    record = _signed(keys)
    record["respondents_released"] = float("nan")
    _refused(record, trusted, "canonical")
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    record["recipes"] = deep
    _refused(record, trusted, "canonical")


def test_key_files_keep_the_analyzer_keys_conventions(tmp_path: Path) -> None:
    key = sk.generate_signing_key(3, key_id="00112233aabbccdd")
    private, public = write_key_pair(key, tmp_path / "k")
    assert private.name == "00112233aabbccdd.private.json"
    assert os.stat(private).st_mode & 0o777 == 0o600
    assert "private_key" not in public.read_text()
    loaded = sk.load_signing_key(private)
    assert loaded.public == key.public and loaded.public.instance == 3
    assert list(sk.load_shuffler_keys(tmp_path / "k")) == [key.public]  # public files only
    assert sk.load_shuffler_keys(private).get(key.key_id) == key.public
    with pytest.raises(TypeError):
        pickle.dumps(loaded)
    assert "private" not in repr(loaded)


def test_sealing_and_signing_keys_are_not_interchangeable(tmp_path: Path) -> None:
    sealing_private, sealing_public = write_key_pair(generate_key(), tmp_path / "sealing")
    with pytest.raises(KeyError_, match="not a shuffler signing key"):
        sk.load_shuffler_keys(sealing_public)
    with pytest.raises(KeyError_, match="not a shuffler signing key"):
        sk.load_signing_key(sealing_private)
    with pytest.raises(KeyError_, match="no such file"):
        sk.load_shuffler_keys(tmp_path / "missing")
    (tmp_path / "bad.public.json").write_text('{"format": "esa-key/1", "suite": "Ed25519"}')
    with pytest.raises(KeyError_, match="key id"):
        sk.load_shuffler_keys(tmp_path / "bad.public.json")

"""Sealed payloads (schemas/crypto/sealing.py) and analyzer keys (schemas/crypto/analyzer_keys.py): pure, no Beam."""

from __future__ import annotations

import os
import pickle
import stat

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

from schemas.crypto import sealing
from schemas.crypto.analyzer_keys import (
    KeyError_,
    KeyRing,
    PrivateKeyInfo,
    generate_key,
    load_public_key,
    write_key_pair,
)
from schemas.payloads import encode_payloads, payload_limits
from schemas.recipes import load_recipe

DAY = 86_400_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00Z
CONTEXT = ("grid@1", "location", T0, T0 + DAY, None)

# RFC 9180 Appendix A.1.1: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM, base mode, the
# first encryption (sequence number 0). Values as published (and in cryptography-vectors).
RFC_INFO = "4f6465206f6e2061204772656369616e2055726e"
RFC_SKRM = "4612c550263fc8ad58375df3f557aac531d26850903e55a9f23f21d8534e8ac8"
RFC_PKRM = "3948cfe0ad1ddb695d780e59077195da6c56506b027329794ab02bca80815c4d"
RFC_ENC = "37fda3567bdbd628e88668c3c8d7e97d1d1253b6d4ea6d44c150f741f1bf4431"
RFC_AAD = "436f756e742d30"
RFC_CT = (
    "f938558b5d72f1a23810b4be2ab4f84331acc02fc97babc53a52ae8218a355a96d8770ac83d07bea87e13c512a"
)
RFC_PT = "4265617574792069732074727574682c20747275746820626561757479"


@pytest.fixture(scope="module")
def key() -> PrivateKeyInfo:
    return generate_key(T0 - 10 * DAY, T0 + 10 * DAY)


def _seal(key, payloads, context=CONTEXT, pad_to=4):
    sealer = sealing.Sealer(key.public)
    info = sealer.info(*context)
    return sealer.seal_many(payloads, [info] * len(payloads), pad_to)


def _open(ring, messages, context=CONTEXT, pad_to=4):
    return sealing.open_sealed(ring, messages, pad_to, *context)


def test_our_suite_matches_rfc9180_test_vector():
    private = x25519.X25519PrivateKey.from_private_bytes(bytes.fromhex(RFC_SKRM))
    assert private.public_key().public_bytes_raw().hex() == RFC_PKRM
    assert sealing.SUITE is not None and sealing.ENC_BYTES == len(bytes.fromhex(RFC_ENC))
    suite = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_128_GCM)  # the suite sealing.SUITE uses
    from cryptography.hazmat.bindings._rust import openssl as rust_openssl

    # The vector's ciphertext carries AAD "Count-0", which only the library's test hook accepts.
    decrypt_with_aad = getattr(rust_openssl.hpke, "_decrypt_with_aad", None)
    if decrypt_with_aad is None:  # pragma: no cover - depends on the installed version
        pytest.skip("this cryptography version has no HPKE decryption with AAD")
    opened = decrypt_with_aad(
        suite,
        bytes.fromhex(RFC_ENC + RFC_CT),
        private,
        info=bytes.fromhex(RFC_INFO),
        aad=bytes.fromhex(RFC_AAD),
    )
    assert opened.hex() == RFC_PT
    # The same single-shot decryption our envelope uses (empty AAD) refuses the vector's
    # ciphertext, whose AAD is "Count-0": the AAD is authenticated.
    with pytest.raises(Exception):  # noqa: B017,PT011 - InvalidTag
        sealing.SUITE.decrypt(bytes.fromhex(RFC_ENC + RFC_CT), private, bytes.fromhex(RFC_INFO))


def test_round_trip_and_one_length_for_every_payload(key):
    payloads = [b"\x02\x00", b"\x02\xfe\x3f", b"\x00", b"\x02\x7f"]
    sealed = _seal(key, payloads)
    assert {len(m) for m in sealed} == {sealing.sealed_length(4)} == {61}
    opened = _open(KeyRing([key]), sealed)
    assert opened.payloads == payloads and not opened.status.any()


def test_padded_length_comes_from_the_largest_payload():
    recipe = load_recipe("image_grid_onehot")
    limits = payload_limits(recipe.build_randomizer())
    pad_to = sealing.padded_length(recipe.payload_kind, limits)
    largest = encode_payloads("bucket", {"bucket": np.array([4095])}).lengths[0]
    assert pad_to == 1 + largest == 4
    with pytest.raises(ValueError, match="does not fit"):
        sealing.pad(b"12345", pad_to)


def test_every_tamper_is_rejected_with_its_reason(key):
    ring = KeyRing([key])
    message = _seal(key, [b"\x02\x10"])[0]
    cases = {"ok": message}
    for position in (0, 1, 9, 40, 41, len(message) - 1):  # version, key id, enc, ct, tag
        flipped = bytearray(message)
        flipped[position] ^= 0x01
        cases[f"flip{position}"] = bytes(flipped)
    cases["truncated"] = message[:-1]
    cases["extended"] = message + b"\x00"
    cases["empty_ct"] = message[: sealing.HEADER_BYTES]
    opened = _open(ring, list(cases.values()))
    reasons = dict(zip(cases, opened.reason_names(), strict=True))
    assert reasons == {
        "ok": "ok",
        "flip0": "sealed_bad_version",
        "flip1": "sealed_unknown_key",
        "flip9": "sealed_open_failed",
        "flip40": "sealed_open_failed",
        "flip41": "sealed_open_failed",
        f"flip{len(message) - 1}": "sealed_open_failed",
        "truncated": "sealed_bad_length",
        "extended": "sealed_bad_length",
        "empty_ct": "sealed_bad_length",
    }


@pytest.mark.parametrize(
    "moved",
    [
        ("grid@2", "location", T0, T0 + DAY, None),  # another recipe
        ("grid@1", "other", T0, T0 + DAY, None),  # another channel
        ("grid@1", "location", T0 + DAY, T0 + 2 * DAY, None),  # another window
        ("grid@1", "location", T0, T0 + DAY, "crowd-b"),  # another crowd
    ],
)
def test_a_message_moved_to_another_crowd_fails_to_open(key, moved):
    message = _seal(key, [b"\x02\x10"])[0]
    assert _open(KeyRing([key]), [message], moved).reason_names().tolist() == ["sealed_open_failed"]


def test_wrong_key_and_retired_key(key):
    other = generate_key(T0 - 10 * DAY, T0 + 10 * DAY, key_id=key.key_id)  # same id, other key
    message = _seal(key, [b"\x02\x10"])[0]
    assert _open(KeyRing([other]), [message]).reason_names().tolist() == ["sealed_open_failed"]
    retired = generate_key(T0 - 20 * DAY, T0)  # validity ended when the window began
    late = _seal(retired, [b"\x02\x10"])[0]
    assert _open(KeyRing([retired]), [late]).reason_names().tolist() == ["sealed_retired_key"]


def test_rotation_opens_messages_under_the_previous_key(key):
    new = generate_key(T0, T0 + 30 * DAY)
    old_messages = _seal(key, [b"\x02\x01", b"\x02\x02"])
    new_messages = _seal(new, [b"\x02\x03"])
    opened = _open(KeyRing([new, key]), old_messages + new_messages)
    assert opened.payloads == [b"\x02\x01", b"\x02\x02", b"\x02\x03"]
    only_new = _open(KeyRing([new]), old_messages)
    assert only_new.reason_names().tolist() == ["sealed_unknown_key"] * 2


def test_chaff_is_counted_not_an_error_and_looks_like_data(key):
    sealer = sealing.Sealer(key.public)
    info = sealer.info(*CONTEXT)
    chaff = sealer.chaff([info] * 3, 4)
    data = sealer.seal_many([b"\x02\x10"], [info], 4)
    assert {len(m) for m in chaff + data} == {sealing.sealed_length(4)}
    assert {m[: sealing.HEADER_BYTES] for m in chaff + data} == {sealer.header}
    opened = _open(KeyRing([key]), chaff + data)
    assert opened.reason_names().tolist() == ["chaff"] * 3 + ["ok"]


def test_unlinkable_fresh_encapsulation_and_no_shared_bytes(key):
    payload = b"\x02\x10"
    sealed = _seal(key, [payload] * 200)  # one respondent, the same payload 200 times
    encs = {m[sealing.HEADER_BYTES : sealing.HEADER_BYTES + sealing.ENC_BYTES] for m in sealed}
    assert len(encs) == 200
    # Beyond the fixed header, two messages agree at a position only by chance (p = 1/256 per
    # byte): over 52 bytes, more than 8 agreeing positions has probability < 1e-7 per pair.
    first = np.frombuffer(sealed[0], np.uint8)[sealing.HEADER_BYTES :]
    for other in sealed[1:]:
        second = np.frombuffer(other, np.uint8)[sealing.HEADER_BYTES :]
        assert np.count_nonzero(first == second) <= 8
        assert sealed[0][: sealing.HEADER_BYTES] == other[: sealing.HEADER_BYTES]


def test_bad_padding_is_rejected(key):
    sealer = sealing.Sealer(key.public)
    info = sealer.info(*CONTEXT)
    bad = [
        sealer.seal(b"\x01\x02\x00\x07", info),  # non-zero pad byte
        sealer.seal(b"\x04\x02\x00\x00", info),  # length beyond the pad
        sealer.seal(b"\xff\x00\x00\x01", info),  # chaff with a non-zero pad
    ]
    assert set(_open(KeyRing([key]), bad).reason_names()) == {"sealed_bad_padding"}


def test_key_files_modes_and_no_pickling(tmp_path, key):
    private_path, public_path = write_key_pair(key, tmp_path)
    assert stat.S_IMODE(os.stat(private_path).st_mode) == 0o600
    assert "private_key" not in public_path.read_text()
    ring = KeyRing.load(tmp_path)
    assert [k.key_id for k in ring] == [key.key_id]
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(ring)
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(key)
    with pytest.raises(KeyError_, match="exists"):
        write_key_pair(key, tmp_path)
    with pytest.raises(KeyError_, match="no such file"):
        KeyRing.load(tmp_path / "missing")
    with pytest.raises(KeyError_, match="not a private key file"):
        KeyRing.load(public_path)
    public_path.write_text(public_path.read_text().replace(key.key_id, "zz"))
    with pytest.raises(KeyError_, match="16 lower-case hex"):
        load_public_key(public_path)

"""The shuffler's key flag (``--signing-key``): its own Ed25519 signing key, checked before work.

A shuffler never loads an analyzer key: this module imports only the signing-key files
(``schemas/crypto/signing_keys.py``); tests/test_layers.py checks it.
"""

from __future__ import annotations

from pipelines.commandline.flags import Flag
from pipelines.commandline.main import UsageError
from schemas.crypto import signing_keys
from schemas.crypto.key_files import KeyError_

SHUFFLE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "signing_key",
        "This instance's private signing key file (esa keys generate --shuffler-instance I; "
        "needs --instance I): sign the commit record with it (Ed25519). Read on the driver when "
        "the commit is written. Default: an unsigned commit record.",
    ),
)


def check_signing_key(path: str | None, instance: int | None) -> None:
    """Fail early (one line) when ``esa shuffle --signing-key`` cannot sign this run's commit:
    unreadable, another instance's, or not valid now (the commit is signed at the end)."""
    if path is None:
        return
    from schemas.crypto.commit_signing import SignatureError, sign_commit

    key = load_signing_key(path)
    if instance is None:
        raise UsageError(
            f"--signing-key {path} signs shuffler instance {key.public.instance}'s commits: "
            f"give --instance {key.public.instance}"
        )
    try:
        sign_commit({"instance": instance}, key)  # the same checks as at commit time
    except SignatureError as error:
        raise UsageError(f"--signing-key {path}: {error}") from None


def load_signing_key(path: str) -> signing_keys.SigningKey:
    """A shuffler's private signing key (UsageError, one line)."""
    try:
        return signing_keys.load_signing_key(path)
    except KeyError_ as error:
        raise UsageError(str(error)) from error

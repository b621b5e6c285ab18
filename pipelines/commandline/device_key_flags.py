"""The devices' key flag (``--public-key``): the analyzer's public key every payload is sealed to."""

from __future__ import annotations

from pipelines.commandline.flags import Flag
from pipelines.commandline.main import UsageError
from schemas.crypto.analyzer_keys import (
    KeyError_,
    load_public_key,
)

# Appended to the stages' FLAGS in pipelines/commandline/options.py.
SIMULATE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "public_key",
        "The analyzer's public key file (esa keys generate): seal every payload for it (RFC 9180 "
        "HPKE, padded to one length per recipe, plus the recipe's chaff). Default: payloads in "
        "the clear.",
    ),
)


def public_key_json(path: str | None) -> str | None:
    """The public key file's JSON for a simulation plan (None without a path)."""
    if path is None:
        return None
    try:
        return load_public_key(path).to_json()
    except KeyError_ as error:
        raise UsageError(str(error)) from error

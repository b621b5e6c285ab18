"""The devices' key flags: ``--public-key``, the analyzer's public key every payload is sealed to,
and ``--aggregator-keys`` (twice), the two aggregators' public keys of a prio3 recipe."""

from __future__ import annotations

from typing import Any

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
    Flag(
        "aggregator_keys",
        "A prio3 recipe's two aggregators' public key files (esa keys generate), aggregator 0 "
        "first: give it twice. Each device seals one Prio3 input share to each.",
        repeat=True,
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


def aggregator_keys_json(paths: list[str] | None, recipe: Any) -> tuple[str, ...] | None:
    """``esa simulate --aggregator-keys`` (twice) for a prio3 recipe, as JSON for the plan;
    refused, one line, for a recipe in the shuffled model or with a number of files other
    than two."""
    if not recipe.is_prio3:
        if paths:
            raise UsageError(f"--aggregator-keys: recipe {recipe.id} is not a prio3 recipe")
        return None
    if not paths or len(paths) != 2:
        raise UsageError(
            f"recipe {recipe.id} is a prio3 recipe: give --aggregator-keys twice (aggregator 0, "
            f"then aggregator 1), got {len(paths or [])}"
        )
    return tuple(public_key_json(path) for path in paths)

"""``esa keys generate``: the analyzer's key pair for sealed reports, and the sealing flags.

::

    esa keys generate --output DIR [--valid-from ISO] [--valid-until ISO] [--key-id HEX16]

writes ``DIR/<key id>.private.json`` (mode 0600: the analyzer's key ring) and
``DIR/<key id>.public.json`` (what devices are given: ``esa simulate --public-key``). Formats and
the key ring: ``schemas/keys.py``; the envelope: ``schemas/sealing.py``.

The flag definitions below are shared by the stage options (``pipelines/options.py``): they carry
PATHS only. Key bytes never enter pipeline options or the pickled job graph; the analyzer's
workers read the private keys from the path in ``DoFn.setup`` (``transforms/sealed.py``).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pipelines.cli import UsageError
from pipelines.flags import Flag
from schemas.keys import (
    PUBLIC_SUFFIX,
    KeyError_,
    KeyRing,
    PublicKeyInfo,
    generate_key,
    load_public_key,
    parse_time_ms,
    write_key_pair,
)

DEFAULT_VALIDITY_DAYS = 365

# Appended to the stages' FLAGS in pipelines/options.py.
SIMULATE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "public_key",
        "The analyzer's public key file (esa keys generate): seal every payload for it (RFC 9180 "
        "HPKE, padded to one length per recipe, plus the recipe's chaff). Default: payloads in "
        "the clear.",
    ),
)
ANALYZE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "key_ring",
        "Private key file or directory of *.private.json keys (current and previous) to open "
        "sealed payloads with; read on the workers. Default: payloads in the clear.",
    ),
)
RUN_FLAGS: tuple[Flag, ...] = (
    Flag(
        "keys",
        "Directory with the analyzer's key pair(s) (esa keys generate): devices seal to its "
        "newest public key, the analyzer opens with all its private keys. Default: a throwaway "
        "key pair generated into OUTPUT/keys.",
    ),
    Flag(
        "unsealed",
        "Send payloads in the clear (no sealing, no chaff).",
        default=False,
        switch=True,
    ),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("keys", help="Analyzer key pairs for sealed reports.")
    actions = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    generate = actions.add_parser("generate", help="Write a new key pair with id and validity.")
    generate.add_argument("--output", required=True, help="Directory for the two key files.")
    generate.add_argument(
        "--valid-from",
        default=None,
        help="Start of validity (ISO date/time, UTC unless stated). Default: today 00:00 UTC.",
    )
    generate.add_argument(
        "--valid-until",
        default=None,
        help=f"End of validity (exclusive). Default: {DEFAULT_VALIDITY_DAYS} days after the start.",
    )
    generate.add_argument(
        "--key-id", default=None, help="16 hex digits. Default: from SHA-256 of the public key."
    )
    generate.set_defaults(handler=_handle_generate)


def _handle_generate(args: argparse.Namespace) -> int:
    paths = generate_keys(args.output, args.valid_from, args.valid_until, args.key_id)
    for path in paths:
        print(path)
    return 0


def generate_keys(
    output: str,
    valid_from: str | None = None,
    valid_until: str | None = None,
    key_id: str | None = None,
) -> tuple[Path, Path]:
    """Generate and write one key pair; ``UsageError`` (one line) on bad input."""
    try:
        if valid_from is None:
            start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            valid_from = start.isoformat()
        start_ms = parse_time_ms(valid_from)
        if valid_until is None:
            end = datetime.fromtimestamp(start_ms / 1000, UTC) + timedelta(DEFAULT_VALIDITY_DAYS)
            valid_until = end.isoformat()
        key = generate_key(start_ms, parse_time_ms(valid_until), key_id.lower() if key_id else None)
        return write_key_pair(key, output)
    except (KeyError_, OSError) as error:
        raise UsageError(str(error)) from error


def public_key_json(path: str | None) -> str | None:
    """The public key file's JSON for a simulation plan (None without a path)."""
    if path is None:
        return None
    try:
        return load_public_key(path).to_json()
    except KeyError_ as error:
        raise UsageError(str(error)) from error


def check_key_ring(path: str | None) -> None:
    """Fail early (one line) when the analyzer's key ring cannot be loaded."""
    if path is None:
        return
    try:
        KeyRing.load(path)
    except KeyError_ as error:
        raise UsageError(str(error)) from error


def newest_public_key(directory: str | Path) -> Path:
    """The public key file with the latest validity start in ``directory``."""
    files = sorted(Path(directory).glob(f"*{PUBLIC_SUFFIX}"))
    if not files:
        raise UsageError(f"keys {directory}: no *{PUBLIC_SUFFIX} file")
    try:
        keyed = [(PublicKeyInfo.from_json(f.read_text(), str(f)).valid_from_ms, f) for f in files]
    except KeyError_ as error:
        raise UsageError(str(error)) from error
    return max(keyed)[1]


def run_keys(output: Path, keys: str | None) -> Path:
    """``esa run``'s key directory: the given one, or a throwaway pair in OUTPUT/keys valid for
    every event time (the simulation's windows lie in the past)."""
    if keys is not None:
        return Path(keys)
    directory = output / "keys"
    try:
        write_key_pair(generate_key(), directory)
    except KeyError_ as error:
        raise UsageError(str(error)) from error
    return directory

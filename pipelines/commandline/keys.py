"""``esa keys generate``: key pairs (the analyzer's for sealed reports, the shufflers' for signed
commit records) and the flags that take them.

::

    esa keys generate --output DIR [--valid-from ISO] [--valid-until ISO] [--key-id HEX16]
        [--shuffler-instance U]

writes ``DIR/<key id>.private.json`` (mode 0600: the analyzer's key ring) and
``DIR/<key id>.public.json`` (what devices are given: ``esa simulate --public-key``). Formats and
the key ring: ``schemas/crypto/analyzer_keys.py``; the envelope: ``schemas/crypto/sealing.py``.

With ``--shuffler-instance U`` it writes shuffler instance U's Ed25519 signing key pair instead
(``schemas/crypto/signing_keys.py``): the private file for ``esa shuffle --instance U --signing-key``,
the public file for ``esa analyze --shuffler-keys`` (a file or a directory of them), which then
refuses any release whose commit record is unsigned or not signed by its instance's key
(``schemas/crypto/commit_signing.py``).

The flag definitions below are shared by the stage options (``pipelines/commandline/options.py``): they carry
PATHS only. Key bytes never enter pipeline options or the pickled job graph; the analyzer's
workers read the private keys from the path in ``DoFn.setup`` (``transforms/analyzer/opening.py``).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pipelines.commandline.flags import Flag
from pipelines.commandline.main import UsageError
from schemas.crypto import signing_keys
from schemas.crypto.analyzer_keys import (
    PUBLIC_SUFFIX,
    KeyError_,
    PublicKeyInfo,
    generate_key,
    parse_time_ms,
    write_key_pair,
)
from schemas.regular_files import read_text

DEFAULT_VALIDITY_DAYS = 365
SIGNING_KEYS_DIR = "shuffler_keys"  # esa run's throwaway signing keys, one pair per instance

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
    Flag(
        "unsigned",
        "Leave the shufflers' commit records unsigned (the analyzer then reads them "
        "unauthenticated). Default: a throwaway signing key per instance in "
        f"OUTPUT/{SIGNING_KEYS_DIR}, the analyzer requiring their signatures.",
        default=False,
        switch=True,
    ),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "keys", help="Analyzer key pairs for sealed reports; shuffler commit-signing keys."
    )
    actions = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    generate = actions.add_parser(
        "generate",
        help="Write a new key pair with id and validity (--shuffler-instance: a signing key).",
    )
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
    generate.add_argument(
        "--shuffler-instance",
        type=int,
        default=None,
        metavar="U",
        help="Write shuffler instance U's Ed25519 commit-signing key pair instead of an "
        "analyzer sealing key pair (U in 0..2,147,483,647), and pin its key id for U in "
        "OUTPUT/trusted_shufflers.json.",
    )
    generate.add_argument(
        "--json", action="store_true", help="Print the written paths as a JSON list."
    )
    generate.set_defaults(handler=_handle_generate)
    enrol = actions.add_parser(
        "enrol",
        help="Enrol N devices: a registry for the collectors, an Ed25519 key per device.",
    )
    enrol.add_argument("--devices", type=int, required=True, metavar="N")
    enrol.add_argument(
        "--output",
        required=True,
        help="Directory for devices.registry.json and devices.private.jsonl (0600).",
    )
    enrol.set_defaults(handler=_handle_enrol)
    tls = actions.add_parser(
        "tls", help="A small CA and a collector server certificate it issues (esa collect --tls)."
    )
    tls.add_argument("--output", required=True, help="Directory for ca.crt, collector.crt/.key.")
    tls.add_argument(
        "--hosts",
        default="127.0.0.1,localhost",
        help="Comma-separated names and IP addresses the certificate is for.",
    )
    tls.add_argument("--days", type=int, default=DEFAULT_VALIDITY_DAYS)
    tls.set_defaults(handler=_handle_tls)


def _handle_generate(args: argparse.Namespace) -> int:
    paths = generate_keys(
        args.output, args.valid_from, args.valid_until, args.key_id, args.shuffler_instance
    )
    if args.json:
        print(json.dumps([str(path) for path in paths]))
    else:
        from pipelines.commandline.summaries import keys_summary

        print(keys_summary([str(path) for path in paths], args.shuffler_instance))
    return 0


def _handle_enrol(args: argparse.Namespace) -> int:
    for path in enrol_devices(args.devices, args.output):
        print(path)
    return 0


def _handle_tls(args: argparse.Namespace) -> int:
    for path in collector_tls(args.output, args.hosts, args.days).values():
        print(path)
    return 0


def enrol_devices(count: int, output: str | Path) -> tuple[Path, Path]:
    """``esa keys enrol``: the registry and the devices' private keys (UsageError, one line)."""
    from schemas.crypto import device_keys

    try:
        return device_keys.enrol_devices(count, output)
    except (KeyError_, OSError) as error:
        raise UsageError(str(error)) from error


def collector_tls(output: str | Path, hosts: str, days: int = DEFAULT_VALIDITY_DAYS) -> dict:
    """``esa keys tls``: a CA and the collector's certificate (UsageError, one line)."""
    from schemas.crypto.tls_certificates import make_collector_tls

    names = [host.strip() for host in hosts.split(",") if host.strip()]
    try:
        return make_collector_tls(output, names, days)
    except (KeyError_, OSError) as error:
        raise UsageError(str(error)) from error


def generate_keys(
    output: str,
    valid_from: str | None = None,
    valid_until: str | None = None,
    key_id: str | None = None,
    shuffler_instance: int | None = None,
) -> tuple[Path, Path]:
    """Generate and write one key pair (an analyzer sealing pair, or with ``shuffler_instance``
    that instance's signing pair); ``UsageError`` (one line) on bad input."""
    if not output or not output.strip():
        raise UsageError(f"--output must name a directory for the key files, got {output!r}")
    try:
        if valid_from is None:
            start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            valid_from = start.isoformat()
        start_ms = parse_time_ms(valid_from)
        if valid_until is None:
            end = datetime.fromtimestamp(start_ms / 1000, UTC) + timedelta(DEFAULT_VALIDITY_DAYS)
            valid_until = end.isoformat()
        until_ms, key_id = parse_time_ms(valid_until), key_id.lower() if key_id else None
        if shuffler_instance is not None:
            signing = signing_keys.generate_signing_key(
                shuffler_instance, start_ms, until_ms, key_id
            )
            paths = write_key_pair(signing, output)
            signing_keys.trust_shuffler_key(output, signing.public)  # pinned for its instance
            return paths
        return write_key_pair(generate_key(start_ms, until_ms, key_id), output)
    except (KeyError_, OSError) as error:
        raise UsageError(str(error)) from error


def newest_public_key(directory: str | Path) -> Path:
    """The public key file with the latest validity start in ``directory``."""
    files = sorted(Path(directory).glob(f"*{PUBLIC_SUFFIX}"))
    if not files:
        raise UsageError(f"keys {directory}: no *{PUBLIC_SUFFIX} file")
    try:
        keyed = [(PublicKeyInfo.from_json(read_text(f), str(f)).valid_from_ms, f) for f in files]
    except (KeyError_, OSError) as error:
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


def run_signing_keys(output: Path, instances: int) -> dict[int, Path]:
    """``esa run``'s throwaway signing keys: one pair per shuffler instance in
    ``OUTPUT/shuffler_keys`` (replacing an earlier run's), valid from now on; returns each
    instance's private key file. The analyzer is given the directory (it reads the public
    halves only)."""
    directory = output / SIGNING_KEYS_DIR
    if directory.is_dir():
        for stale in directory.glob("*.json"):  # the keys and trust file of an earlier run
            stale.unlink()
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    private_files = {}
    try:
        for instance in range(instances):
            key = signing_keys.generate_signing_key(instance, valid_from_ms=now_ms - 60_000)
            private_files[instance] = write_key_pair(key, directory)[0]
            signing_keys.trust_shuffler_key(directory, key.public)
    except KeyError_ as error:
        raise UsageError(str(error)) from error
    return private_files

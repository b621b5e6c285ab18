"""The analyzer's key flags (``--key-ring``, ``--shuffler-keys``): its HPKE private keys and the
shufflers' public signing keys, checked before work.

Paths only: key bytes never enter pipeline options or the job graph; the workers read the
private keys in ``DoFn.setup`` (``transforms/analyzer/opening.py``).
"""

from __future__ import annotations

from pipelines.commandline.flags import Flag
from pipelines.commandline.main import UsageError
from schemas.crypto import signing_keys
from schemas.crypto.analyzer_keys import (
    KeyError_,
    KeyRing,
)

ANALYZE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "key_ring",
        "Private key file or directory of *.private.json keys (current and previous) to open "
        "sealed payloads with; read on the workers. Default: payloads in the clear.",
    ),
    Flag(
        "shuffler_keys",
        "The shufflers' public signing keys (esa keys generate --shuffler-instance U): a file or "
        "a directory of *.public.json. Every release's commit record must carry a valid "
        "signature of its instance's key, or the release is refused. Default: commit records "
        "are read unauthenticated (and the summary says so).",
    ),
)


def check_key_ring(path: str | None) -> None:
    """Fail early (one line) when the analyzer's key ring cannot be loaded."""
    if path is None:
        return
    try:
        KeyRing.load(path)
    except KeyError_ as error:
        raise UsageError(str(error)) from error


def load_shuffler_keys(path: str | None) -> signing_keys.ShufflerKeys | None:
    """``esa analyze --shuffler-keys`` (None without a path; UsageError, one line)."""
    if path is None:
        return None
    try:
        return signing_keys.load_shuffler_keys(path)
    except KeyError_ as error:
        raise UsageError(str(error)) from error

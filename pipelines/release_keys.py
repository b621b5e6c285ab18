"""Before any work: can the analyzer's key ring open what a release was sealed to?

A sealed payload names its key in the clear (``schemas.crypto.sealing``: version, 8-byte key id, ...).
The driver reads the first :data:`SAMPLE_RECORDS` messages of each verified release (in commit
order, one column batch at a time) and refuses, with one line, a release whose messages are
sealed when no ``--key-ring`` is given, or sealed only to keys the ring does not hold: every
message would be dead-lettered and no crowd could be estimated. A release sealed partly to a
key the ring lacks (a rotation) runs: those messages are dead-lettered with their reason and a
crowd none of whose messages opened is withheld (``transforms.analyzer.arithmetic.rejections``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from pipelines.commandline.main import UsageError
from schemas.crypto.analyzer_keys import KeyError_, KeyRing
from schemas.payloads import EncodedPayloads
from schemas.replays import sealed_rows
from transforms.common import avro_io

__all__ = ["SAMPLE_RECORDS", "check_release_keys", "sealed_key_ids"]

# Messages read per release to learn its key ids (a few column batches at most).
SAMPLE_RECORDS = 4096
_KEY_ID = slice(1, 9)  # the key id's bytes in the envelope


def sealed_key_ids(files: Iterable[str], limit: int = SAMPLE_RECORDS) -> tuple[set[str], int, int]:
    """The key ids of the sealed payloads among the first ``limit`` messages of ``files``, how
    many of those messages were sealed, and how many were read."""
    ids: set[str] = set()
    sealed_count = read = 0
    for path in files:
        for item in avro_io.read_avro_batches(path, min(limit, avro_io.DEFAULT_BATCH_RECORDS)):
            if (
                isinstance(item, avro_io.UnreadableChunk)
                or "payload" not in item.columns.schema.names
            ):
                continue  # the workers dead-letter it with its reason
            payloads = EncodedPayloads.from_arrow(item.columns.column("payload"))
            rows = np.flatnonzero(sealed_rows(payloads))
            starts = payloads.offsets[:-1][rows]
            headers = payloads.data[starts[:, None] + np.arange(_KEY_ID.stop)[_KEY_ID]]
            ids.update(bytes(row).hex() for row in np.unique(headers, axis=0))
            sealed_count += rows.size
            read += item.columns.num_rows
            if read >= limit:
                return ids, sealed_count, read
    return ids, sealed_count, read


def check_release_keys(releases: Sequence, key_ring: str | None) -> int:
    """UsageError (one line) naming the release when ``key_ring`` can open none of its sealed
    messages (see the module docstring). ``releases``: ``pipelines.analyze.Release`` objects.
    Returns the sealed messages the releases hold, estimated from the samples (each release's
    ``records_released`` times its sample's sealed share): the work of opening them."""
    held: set[str] | None = None
    sealed_messages = 0.0
    for release in releases:
        ids, sealed, read = sealed_key_ids(release.files)
        if not sealed:
            continue
        sealed_messages += int(release.commit.get("records_released") or 0) * sealed / read
        named = ", ".join(sorted(ids)[:4]) + (" ..." if len(ids) > 4 else "")
        if key_ring is None:
            raise UsageError(
                f"refusing release {release.path}: its messages are sealed (key id {named}) and "
                "no --key-ring was given: none could be opened"
            )
        if held is None:
            try:
                held = {key.key_id for key in KeyRing.load(key_ring)}
            except KeyError_ as error:
                raise UsageError(str(error)) from error
        if not ids & held:
            raise UsageError(
                f"refusing release {release.path}: its messages are sealed to key id {named}, "
                f"which --key-ring {key_ring} does not hold (it holds "
                f"{', '.join(sorted(held)[:4])}): none could be opened"
            )
    return round(sealed_messages)

"""Reading a shuffler's ``esa-release/2`` in the shuffler's tests: the verified release and its
crowd tables' records (``schemas/release_crowds.iter_crowds``, one dict per crowd)."""

from __future__ import annotations

from typing import Any

from schemas.release import commit as rel
from schemas.release.crowd_tables import iter_crowds


def verify(output: Any) -> rel.VerifiedRelease:
    """The release in ``output``, every file and crowd table checked against its commit record."""
    return rel.verify_release(str(output), formats=(rel.RELEASE_FORMAT,))


def crowds(release: rel.VerifiedRelease) -> list[dict[str, Any]]:
    """Every committed crowd table's records, tables in path order."""
    return list(iter_crowds(release))

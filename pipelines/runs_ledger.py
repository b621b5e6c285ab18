"""The analyzer's record of the shuffler runs it has accepted: a replayed or older release of an
instance is refused.

A genuine release stays genuine forever: its signature verifies next year too. Without memory an
analyzer handed last week's release of instance u in place of this week's would analyze it. Each
release names its run in the (signed) commit record: ``run = {id, committed_at_ms, windows}``
(``pipelines/shuffle.py``, a random 128-bit id). ``esa analyze --runs-ledger FILE`` keeps, per
instance, the last run it accepted, and every run id it ever accepted; before any work it
refuses (one line, exit 2) a release

* whose run it already accepted (a replay: the same release again),
* committed no later than the last run it accepted of that instance (an older release),
* that states no run (written before run ids: nothing to tell it from a replay).

The ledger is updated (atomically, a temporary file renamed) only after the analysis succeeded,
so a failed analysis can be run again; ``esa``'s output lock (``pipelines/commandline/output_lock.py``) on
the ledger keeps two analyses from updating it at once. Without ``--runs-ledger`` nothing is
checked and the summary says so. The ledger is only as trustworthy as the commit records:
give ``--shuffler-keys`` too, or an unsigned record's run may be anything.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.commandline.main import UsageError
from schemas.regular_files import read_text

__all__ = ["LEDGER_FORMAT", "check_runs", "ledger_line", "record_runs"]

LEDGER_FORMAT = "esa-accepted-runs/1"


def _load(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {"format": LEDGER_FORMAT, "instances": {}, "accepted": []}
    try:
        ledger = json.loads(read_text(path))
    except (OSError, ValueError) as error:
        raise UsageError(f"--runs-ledger {path}: cannot be read: {error}") from None
    if (
        not isinstance(ledger, dict)
        or ledger.get("format") != LEDGER_FORMAT
        or not isinstance(ledger.get("instances"), dict)
        or not isinstance(ledger.get("accepted"), list)
    ):
        raise UsageError(f"--runs-ledger {path}: not an {LEDGER_FORMAT} file")
    return ledger


def _run_of(release: Any) -> Mapping[str, Any]:
    run = release.commit.get("run")
    if not isinstance(run, Mapping):
        raise UsageError(
            f"refusing release {release.path}: its commit record states no run id (written "
            "before run ids), so --runs-ledger cannot tell it from a replay; shuffle again"
        )
    return run


def check_runs(releases: Sequence[Any], path: str | None) -> None:
    """Refuse (UsageError, one line) a release the ledger at ``path`` shows to be a replay or
    older than the last accepted run of its instance (see the module docstring)."""
    if path is None:
        return
    ledger = _load(path)
    accepted = set(ledger["accepted"])
    for release in releases:
        run = _run_of(release)
        if run["id"] in accepted:
            raise UsageError(
                f"refusing release {release.path}: run {run['id']} of instance "
                f"{release.instance} was already accepted (--runs-ledger {path}): a replay"
            )
        last = ledger["instances"].get(str(release.instance))
        if last is not None and run["committed_at_ms"] <= last["committed_at_ms"]:
            raise UsageError(
                f"refusing release {release.path}: run {run['id']} of instance "
                f"{release.instance} was committed before run {last['run_id']}, accepted "
                f"already (--runs-ledger {path}): an older release"
            )


def record_runs(releases: Sequence[Any], path: str | None) -> None:
    """Add the releases' runs to the ledger at ``path`` (after a successful analysis)."""
    if path is None:
        return
    ledger = _load(path)
    for release in releases:
        run = _run_of(release)
        ledger["accepted"].append(run["id"])
        ledger["instances"][str(release.instance)] = {
            "run_id": run["id"],
            "committed_at_ms": run["committed_at_ms"],
            "windows": run["windows"],
            "commit_sha256": release.commit_sha256,
            "accepted_at_ms": int(time.time() * 1000),
        }
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(ledger, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def ledger_line(path: str | None) -> str:
    """The summary's line about replay checks."""
    if path is None:
        return "NOT checked: older or repeated releases would be accepted (no --runs-ledger)"
    return f"checked against {path}: no release is a replay or older than one accepted before"

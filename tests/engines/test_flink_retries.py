"""Retries on a real engine: the standalone Flink cluster restarts the job region whose task
failed (fixed-delay restart strategy, pipelines/engines/flink_cluster.py), and the release and the
analysis still come out exactly as an uninjected FnApiRunner run's.

The faults are those of tests/pipelines/test_retries.py: the first attempt at some of the files
the pipelines publish (release message files, index entries, table parts) fails after half its
bytes reached the final name. The LOOPBACK SDK worker runs in this process, so the wrapped
``atomic_files.publish`` is the one Flink's tasks call.
"""

from __future__ import annotations

import pytest

from pipelines.engines import runners
from tests.pipelines.test_retries import (
    FNAPI,
    _analyze,
    _release,
    _shuffle,
    _tables,
    faults,  # noqa: F401 - the fixture
    reports,  # noqa: F401 - the fixture
)

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
]


def _cluster_flags(flink_cluster) -> list[str]:
    return runners.runner_flags("flink_cluster", master=flink_cluster.master)


def test_flink_restarts_leave_exactly_the_uninjected_release_and_analysis(
    reports,  # noqa: F811
    faults,  # noqa: F811
    flink_cluster,
):
    root, recipe = reports
    _shuffle(root, recipe, root / "plain", FNAPI)
    failed_before = flink_cluster.overview()["jobs-failed"]
    faults.active = True
    _shuffle(root, recipe, root / "flink", _cluster_flags(flink_cluster))
    assert any(name.startswith("messages/") for name in faults.failed), faults.failed
    assert _release(root / "flink") == _release(root / "plain")

    faults.active = False  # FnApiRunner fails the job on a fault instead of retrying
    _analyze(root, recipe, root / "analysis-plain", FNAPI)
    faults.failed.clear()  # and the shuffle's failures no longer count against the budget
    faults.roots.clear()
    faults.active = faults.every = True
    _analyze(root, recipe, root / "analysis-flink", _cluster_flags(flink_cluster))
    assert any(name.startswith("part-") for name in faults.failed), faults.failed
    assert _tables(root / "analysis-flink") == _tables(root / "analysis-plain")
    assert flink_cluster.overview()["jobs-failed"] == failed_before  # restarted, not failed

"""A standalone Flink cluster shared by the engine tests of one test process."""

from __future__ import annotations

import pytest

from pipelines.engines import runners
from pipelines.engines.flink_cluster import FlinkCluster


@pytest.fixture(scope="session")
def flink_cluster():
    """A JobManager + TaskManager with 2 slots; failed regions restart up to 5 times."""
    lib = runners.flink_cluster_lib()
    if lib is None:
        pytest.skip("no assembled Flink jars for a standalone cluster: run `make engines`")
    with FlinkCluster(lib, slots=2, restart_attempts=5) as cluster:
        yield cluster

"""simulate -> shuffle -> analyze on real engines gives what FnApiRunner gives for the same seed.

Engines come from ``make engines`` (scripts/engines.sh; pipelines/engines/runners.py): Prism, Beam's Go
portable runner, and Flink through Beam's FlinkRunner with the Flink job server assembled from
Maven Central, on the job server's embedded Flink cluster and on a standalone Flink cluster (a
JobManager and a TaskManager started here, pipelines/engines/flink_cluster.py). An engine that is not
installed skips with the reason.

What is compared, and why it can be compared exactly: the simulation is a function of its seed, so
its reports must be identical record for record. The shuffler's randomness (origin-hash secret,
release order) comes from the OS CSPRNG and has no seed flag, so the release is compared as a
multiset of messages (without randomized deletion, which of the crowd's messages are released
does not depend on randomness: all of them or none). The analyzer's output is a function of that
multiset, so histograms.parquet and summary.json must be identical (paths aside). The standing
job server test runs the analyzer alone over the reference's own release.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import time
from contextlib import redirect_stdout
from pathlib import Path

import fastavro
import pyarrow.parquet as pq
import pytest

from pipelines.commandline import main as cli
from pipelines.engines import runners
from pipelines.engines.flink_cluster import PRESTAGED_MAIN, launcher_main
from pipelines.engines.ports import free_port
from transforms.analyzer.report_files import read_reports

# Flink with LOOPBACK workers: when a job ends, the job server hangs up on the SDK worker's data
# channel and its reader threads end with CANCELLED ("Multiplexer hanging up") after the results
# are in; the traceback is noise, not a failure.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
]

RESPONDENTS = 3_000
SEED = 7
RECIPE = {
    "name": "engine_grid",
    "version": 1,
    "channel": "engine_grid",
    "randomizer": "one_hot_rappor",
    "randomizer_params": {"domain_size": 256, "epsilon": 4.0},
    "fragmentation": "attribute",
    "epsilon_local": 4.0,
    "epsilon_central_target": 4.0,
    "delta": 1e-6,
    "min_crowd_size": 500,
    "query_class": "test",
    "data_fields": ["value"],
    "shuffler_instances": 2,
    "window": "1d",
}
HISTOGRAM_KEY = ["channel", "recipe_id", "crowd", "window_start", "bucket"]


def _cli(argv: list[str]) -> None:
    with redirect_stdout(io.StringIO()):
        assert cli.main(argv) == 0, argv


def _esa_run(root: Path, name: str, flags: list[str]) -> Path:
    # Unsealed: every sealed message has a fresh encapsulation (by design), so engines could only
    # be compared after opening; tests/pipelines/test_sealed_run.py covers sealing itself.
    recipe = root / "recipe-engine_grid.json"
    if not recipe.exists():
        recipe.write_text(json.dumps(RECIPE))
    output = root / name
    _cli(["run", "--output", str(output), "--recipe", str(recipe), "--population", "uniform",
          "--respondents", str(RESPONDENTS), "--seed", str(SEED), "--parallel-shuffles", "1",
          "--unsealed", *flags])  # fmt: skip
    return output


def _flags(engine: str, request) -> list[str]:
    try:
        runners.runner_flags(engine if engine != "flink_cluster" else "flink")
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    if engine == "flink_cluster":
        cluster = request.getfixturevalue("flink_cluster")
        return runners.runner_flags(engine, master=cluster.master)
    return runners.runner_flags(engine)


def _records(root: Path, pattern: str) -> list[tuple]:
    """Every Avro record under ``root`` matching ``pattern``, as sorted tuples (a multiset)."""
    records = []
    for path in sorted(root.glob(pattern)):
        with path.open("rb") as file:
            records.extend(tuple(record.items()) for record in fastavro.reader(file))
    assert records, f"no records in {root}/{pattern}"
    return sorted(records, key=repr)


def _histograms(analysis: Path):
    return pq.read_table(analysis / "histograms.parquet").sort_by(
        [(column, "ascending") for column in HISTOGRAM_KEY]
    )


def _summary(output: Path) -> dict:
    """summary.json with the per-crowd reports and notes (reports.jsonl/, withheld.jsonl/)."""
    summary = json.loads((output / "analysis" / "summary.json").read_text())
    summary.update(read_reports(str(output / "analysis")))
    # Each run signs with throwaway shuffler keys of its own: their ids differ, nothing else.
    inputs = summary["inputs"]
    inputs["commit_records"] = re.sub(r"key [0-9a-f]{16}", "key <id>", inputs["commit_records"])
    return json.loads(json.dumps(summary).replace(str(output), "<OUTPUT>"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return _esa_run(tmp_path_factory.mktemp("engines"), "fnapi", runners.runner_flags("fnapi"))


@pytest.mark.parametrize("engine", ["prism", "flink", "flink_cluster"])
def test_pipeline_on_engine_matches_fnapi(engine, request):
    flags = _flags(engine, request)  # skips before the reference run when the engine is missing
    reference = request.getfixturevalue("reference")
    output = _esa_run(reference.parent, engine, flags)

    simulated = "simulation/instance=*/*.avro"
    assert _records(output, simulated) == _records(reference, simulated)
    released = "releases/instance=*/messages/**/*.avro"
    assert _records(output, released) == _records(reference, released)
    expected = _histograms(reference / "analysis")
    assert expected.num_rows == RECIPE["randomizer_params"]["domain_size"]
    assert _histograms(output / "analysis").equals(expected)
    job_server = runners.flink_job_server_jar()
    if engine == "flink_cluster" and job_server.parent.name.startswith("assembled-"):
        # make engines compiled the assembled job server's own main class, and it staged none of
        # its jars, so the TaskManager, which runs on the same jars, fetched no blob (Beam's own
        # job server stages all 161 with each job, and the TaskManager logs each download).
        assert launcher_main(job_server) == PRESTAGED_MAIN, "make engines: see javac.log"
        taskmanager_log = request.getfixturevalue("flink_cluster").work / "taskmanager.log"
        assert "BlobClient - Downloading" not in taskmanager_log.read_text()
    assert _summary(output) == _summary(reference)
    run = json.loads((output / "run.json").read_text())
    assert run["adds_up"] and run["respondents"] == RESPONDENTS
    if engine == "flink_cluster":  # the 4 jobs (simulate, 2 x shuffle, analyze) ran on the cluster
        overview = request.getfixturevalue("flink_cluster").overview()
        assert overview["jobs-finished"] >= 4 and overview["jobs-failed"] == 0, overview


def test_analyze_on_a_standing_prism_job_server_matches_fnapi(request, tmp_path):
    """``prism`` started on its own (as on a server), jobs submitted with PortableRunner."""
    binary = runners.prism_binary()
    if binary is None:
        pytest.skip(f"no Prism binary for Beam {runners.BEAM_VERSION}: run `make engines`")
    reference = request.getfixturevalue("reference")
    port = free_port()
    server = subprocess.Popen(
        [str(binary), "--job_port", str(port), "--serve_http=false", "--log_level", "warn"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # wait until the job service listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "prism did not start"
                time.sleep(0.1)
        output = tmp_path / "analysis"
        _cli(["analyze", "--input", str(reference / "releases"), "--output", str(output),
              "--recipe", str(reference / "recipe.json"), "--truth", str(reference / "simulation"),
              "--postprocessing", "norm_sub", "--runner=PortableRunner",
              f"--job_endpoint=localhost:{port}", "--environment_type=LOOPBACK"])  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert _histograms(output).equals(_histograms(reference / "analysis"))

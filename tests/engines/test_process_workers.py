"""pipelines/engines/process_workers.py: Prism's and Flink's SDK workers forked as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2, endpoints_pb2
from apache_beam.runners.portability import portable_runner

from pipelines.commandline.flags import with_default_runner
from pipelines.engines import process_workers, runners


@pytest.mark.parametrize(
    ("flags", "wanted"),
    [
        ([], False),
        (["--sdk_worker_parallelism=1"], False),
        (["--sdk_worker_parallelism=2"], True),
        (["--sdk_worker_parallelism", "16"], True),
        (["--sdk_worker_parallelism=0"], False),  # the runner's choice: Beam's own workers
    ],
)
def test_worker_processes_only_when_more_than_one_sdk_worker_is_asked_for(flags, wanted):
    assert process_workers.wants_worker_processes(PipelineOptions(flags)) is wanted


def test_text_parallelism_is_read_as_a_number_and_nonsense_as_no():
    options = PipelineOptions([])
    options.view_as(portable_runner.PortableOptions).sdk_worker_parallelism = "3"
    assert process_workers.wants_worker_processes(options)
    options.view_as(portable_runner.PortableOptions).sdk_worker_parallelism = "many"
    assert not process_workers.wants_worker_processes(options)


def test_a_worker_gets_the_endpoints_id_and_options_sdk_worker_main_reads():
    """As Beam's SubprocessSdkWorker sets them: text-format descriptors; no logging descriptor
    when the runner gave no logging endpoint."""
    from apache_beam.runners.worker import sdk_worker_main
    from google.protobuf import text_format

    request = beam_fn_api_pb2.StartWorkerRequest(
        worker_id="worker_7",
        control_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:4711"),
        logging_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:4712"),
    )
    options = PipelineOptions(["--job_name=scaling", "--sdk_worker_parallelism=2"])
    env = process_workers.worker_environment(
        request, process_workers._pipeline_options_json(options)
    )
    control = text_format.Parse(
        env["CONTROL_API_SERVICE_DESCRIPTOR"], endpoints_pb2.ApiServiceDescriptor()
    )
    assert control.url == "localhost:4711"
    assert "localhost:4712" in env["LOGGING_API_SERVICE_DESCRIPTOR"]
    assert env["WORKER_ID"] == "worker_7"
    read = sdk_worker_main._parse_pipeline_options(env["PIPELINE_OPTIONS"]).get_all_options()
    assert read["job_name"] == "scaling" and str(read["sdk_worker_parallelism"]) == "2"
    assert env["PATH"] == os.environ["PATH"]  # the rest of this process's environment

    request.ClearField("logging_endpoint")
    assert "LOGGING_API_SERVICE_DESCRIPTOR" not in process_workers.worker_environment(request, "{}")


def test_options_json_cannot_carry_are_left_out():
    options = PipelineOptions(["--job_name=kept"])
    options.view_as(portable_runner.PortableOptions).environment_options = [object()]
    carried = json.loads(process_workers._pipeline_options_json(options))["options"]
    assert carried["job_name"] == "kept"
    assert "environment_options" not in carried


def test_the_pool_ends_and_reaps_the_worker_commands_left_at_the_end(tmp_path):
    """A worker command the runner never stopped (one still waiting, one done) is ended and
    reaped by the pool's clean-up: no process of the pool outlives the pipeline."""

    class Server:  # what the pool reads of a fork server: the command that asks for a worker
        worker_command = "sleep 60"

    pool = process_workers.forking_worker_pool()(Server(), "{}")
    request = beam_fn_api_pb2.StartWorkerRequest(
        worker_id="waiting",
        control_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:1"),
    )
    assert not pool.StartWorker(request, None).error
    Server.worker_command = "true"
    request.worker_id = "done"
    assert not pool.StartWorker(request, None).error
    processes = list(pool._worker_processes.values())
    processes[1].wait(10)
    assert processes[0].poll() is None
    pool.close()
    assert all(process.returncode is not None for process in processes)
    assert processes[0].returncode == -15  # SIGTERM: it was still waiting
    assert not pool._worker_processes


def test_installed_as_the_portable_runners_loopback_replacement():
    with_default_runner(PipelineOptions([]))
    replaced = portable_runner.PortableRunner.start_and_replace_loopback_environments
    assert replaced is process_workers.start_and_replace_loopback_environments
    assert process_workers.fork_sdk_workers() is True  # idempotent: Beam's kept once
    assert len(process_workers.beams_replace_loopback) == 1


# A Prism or Flink pipeline run by a fresh interpreter (this one has pytest's threads, so it never forks
# itself): the pid, parent and grandparent of the process that ran each element, as JSON lines.
_DRIVER = r"""
import json, os, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines.commandline.flags import with_default_runner
from pipelines.engines import runners

out, parallelism, master = sys.argv[1], sys.argv[2], sys.argv[3]

def seen(element):
    with open(f"/proc/{os.getppid()}/stat") as stat:
        grandparent = int(stat.read().rsplit(")", 1)[1].split()[1])
    with open(os.path.join(out, f"element-{element}.json"), "w") as handle:
        json.dump({"pid": os.getpid(), "parent": os.getppid(), "grandparent": grandparent},
                  handle)

if master:  # a standalone Flink cluster's: one SDK worker per task slot unless told
    flags = runners.runner_flags("flink_cluster", int(parallelism), master)
else:
    flags = runners.runner_flags("prism") + [f"--sdk_worker_parallelism={parallelism}"]
with beam.Pipeline(options=with_default_runner(PipelineOptions(flags))) as pipeline:
    pipeline | beam.Create(range(12)) | beam.Reshuffle() | beam.Map(seen)
print(json.dumps({"driver": os.getpid()}))
"""


def _run_driver(tmp_path, parallelism: int, master: str = "") -> tuple[int, list[dict]]:
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(tmp_path), str(parallelism), master],
        capture_output=True, text=True, timeout=240, cwd=os.getcwd(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "worker_id" not in done.stderr  # Prism took the forked worker's log stream
    driver = json.loads(done.stdout.strip().splitlines()[-1])["driver"]
    seen = [json.loads(path.read_text()) for path in tmp_path.glob("element-*.json")]
    assert len(seen) == 12
    return driver, seen


@pytest.mark.slow
@pytest.mark.engine
def test_sdk_workers_on_prism_are_forked_processes_when_several_are_asked_for(tmp_path):
    """With --sdk_worker_parallelism=2 every element runs in a process forked from a copy of
    the driver (its grandparent is the driver); with 1, in the driver itself (Beam's thread)."""
    if runners.prism_binary() is None:
        pytest.skip("no Prism binary: run `make engines`")
    (tmp_path / "two").mkdir()
    driver, seen = _run_driver(tmp_path / "two", 2)
    assert {element["grandparent"] for element in seen} == {driver}
    assert driver not in {element["pid"] for element in seen}
    (tmp_path / "one").mkdir()
    driver, seen = _run_driver(tmp_path / "one", 1)
    assert {element["pid"] for element in seen} == {driver}


@pytest.mark.slow
@pytest.mark.engine
def test_flink_with_two_task_slots_runs_its_python_in_forked_processes(tmp_path, flink_cluster):
    """On a standalone Flink cluster with --parallelism=2 (and no --sdk_worker_parallelism)
    every element runs in a worker process forked from a copy of the driver, none in the
    driver. (Which of the 2 workers a task gets is Flink's round robin: in this small pipeline
    both tasks of the stage shared one in 2 of 3 runs, so that is not asserted.)"""
    driver, seen = _run_driver(tmp_path, 2, flink_cluster.master)
    assert {element["grandparent"] for element in seen} == {driver}
    assert driver not in {element["pid"] for element in seen}

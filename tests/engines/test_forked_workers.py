"""pipelines/engines/forked_workers.py: multi-process workers forked from a preloaded server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import apache_beam as beam
import grpc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.testing.util import assert_that, equal_to

from pipelines.commandline.flags import with_default_runner
from pipelines.engines import forked_workers
from pipelines.engines.garbage_collection import YOUNG_THRESHOLD
from pipelines.engines.state_sampling import SAMPLING_PERIOD_MS


def _parent_pid(_: int) -> int:
    return os.getppid()


def _worker_tuning(_: int) -> tuple[int, int]:
    """A worker's garbage-collection threshold and Beam state samplers' default period."""
    import gc
    import inspect

    from apache_beam.runners.worker import statesampler

    init = inspect.signature(statesampler.StateSampler.__init__)
    return gc.get_threshold()[0], init.parameters["sampling_period_ms"].default


def test_a_multi_process_pipeline_runs_on_workers_forked_by_the_server(monkeypatch):
    """Given no runner, a spread pipeline inside ``serving`` runs on ForkedWorkerRunner, whose
    workers are children of the fork server (not spawned interpreters), with the same results;
    the server is gone after the block."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with forked_workers.serving(["apache_beam.runners.worker.sdk_worker_main"]) as server:
        assert forked_workers.running() is server
        options = with_default_runner(PipelineOptions([]), worker_processes=2)
        with beam.Pipeline(options=options) as pipeline:
            numbers = pipeline | beam.Create(range(100)) | beam.Reshuffle()
            total = numbers | beam.CombineGlobally(sum)
            parents = numbers | beam.Map(_parent_pid) | beam.Distinct()
            tuning = numbers | beam.Map(_worker_tuning) | "OneTuning" >> beam.Distinct()
            assert_that(total, equal_to([4950]), label="sum")
            assert_that(parents, equal_to([server._process.pid]), label="forked")
            # the server's workers are tuned as the driver is (with_default_runner)
            assert_that(tuning, equal_to([(YOUNG_THRESHOLD, SAMPLING_PERIOD_MS)]), label="tuned")
        assert options.get_all_options()["runner"] == forked_workers.RUNNER
    assert forked_workers.running() is None
    assert server._process.poll() is not None
    assert not os.path.exists(server.socket_path)


def test_a_failing_worker_reports_its_exit_status_like_a_spawned_one():
    """The worker command exits with the forked worker's status: one that cannot reach a runner
    (no Fn API endpoints in its environment) fails as sdk_worker_main would, it does not hang."""
    with forked_workers.serving([]) as server:
        environment = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.getcwd()}
        done = subprocess.run(
            server.worker_command, shell=True, env=environment, capture_output=True, timeout=120
        )
    assert done.returncode == 1
    assert b"KeyError: 'CONTROL_API_SERVICE_DESCRIPTOR'" in done.stderr  # on its own stderr


# A fork server whose poll for ended workers and a vanished parent is a minute long, started as
# ForkServer starts one (argument 1: its socket path).
_SLOW_POLL_SERVER = (
    "import sys; from pipelines.engines import forked_workers as f; f._POLL_S = 60.0; "
    "f._serve(sys.argv[1], [], [])"
)


def test_a_worker_s_end_and_the_server_s_stop_are_heard_at_once(tmp_path):
    """The server answers a worker's client as soon as the worker has exited, and stops as
    soon as it is told to (SIGTERM), not when its poll comes round: with a minute's poll both
    take seconds (they took up to the poll, 0.2 s, of every pipeline's end: its driver waits
    for its workers' clients)."""
    socket_path = str(tmp_path / "server")
    environment = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.getcwd()}
    server = subprocess.Popen(
        [sys.executable, "-c", _SLOW_POLL_SERVER, socket_path], env=environment,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        command = f"{sys.executable} -m pipelines.engines.forked_workers worker {socket_path}"
        # no Fn API endpoints: the forked worker fails at once (as in the test above)
        done = subprocess.run(command, shell=True, env=environment, capture_output=True, timeout=30)
        assert done.returncode == 1, done.stderr[-2000:]
        server.terminate()
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()


def test_workers_are_spawned_as_beam_does_when_the_server_has_died(monkeypatch):
    """A server that could not import its modules has exited: the pipeline still runs, on
    workers it did not fork (Beam's spawned ones here, where pytest's threads keep this process
    from forking a server of its own)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with forked_workers.serving(["no_such_module_anywhere"]) as server:
        server._process.wait(60)
        assert not server.alive()
        options = with_default_runner(PipelineOptions([]), worker_processes=2)
        with beam.Pipeline(options=options) as pipeline:
            numbers = pipeline | beam.Create(range(10)) | beam.Reshuffle()
            server_pid = server._process.pid
            forked = numbers | beam.Map(lambda _: os.getppid() == server_pid) | beam.Distinct()
            assert_that(forked, equal_to([False]))


class _HeldControl(beam_fn_api_pb2_grpc.BeamFnControlServicer):
    """A runner that keeps its workers' control streams open and sends nothing: Flink's
    TaskManager after a failed job, which outlives the driver that served the workers."""

    def __init__(self) -> None:
        self.connected = threading.Event()
        self.released = threading.Event()

    def Control(self, responses, context):  # noqa: N802 - the gRPC method's name
        self.connected.set()
        self.released.wait(120)
        yield from ()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ends_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` stops running within ``seconds``. A process the kernel kills is not gone
    at once: it closes its files (its client may already have exited) before it is a zombie."""
    deadline = time.monotonic() + seconds
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("server_ends", ["closed", "killed"])
def test_a_worker_a_runner_still_holds_ends_with_its_server(server_ends):
    """A forked worker whose runner never closes its control channel ends when its server
    does: closed (SIGTERM; it ends the worker) or killed (SIGKILL; the kernel ends the worker).
    Its worker command then exits and nothing holds the command's output streams, so a caller
    reading them to the end is not left waiting."""
    control = _HeldControl()
    runner = grpc.server(futures.ThreadPoolExecutor(4))
    beam_fn_api_pb2_grpc.add_BeamFnControlServicer_to_server(control, runner)
    port = runner.add_insecure_port("localhost:0")
    runner.start()
    try:
        with forked_workers.serving([]) as server:
            environment = {
                "PATH": os.environ.get("PATH", ""),
                "PYTHONPATH": os.getcwd(),
                "CONTROL_API_SERVICE_DESCRIPTOR": f'url: "localhost:{port}"',
                "PIPELINE_OPTIONS": "{}",
                "WORKER_ID": "held",
            }
            command = subprocess.Popen(
                server.worker_command, shell=True, env=environment,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            assert control.connected.wait(120)
            (worker,) = _children(server._process.pid)
            if server_ends == "killed":
                os.kill(server._process.pid, signal.SIGKILL)
        _, errors = command.communicate(timeout=60)
        assert command.returncode == 1, errors[-2000:]
        assert _ends_within(worker, 30)
    finally:
        control.released.set()
        runner.stop(None)


# A multi-process pipeline run by a fresh interpreter (this one has pytest's threads, so it
# never forks itself): what its workers see of their parents, their descriptors and their random
# draws, as JSON on the last line.
_DRIVER = r"""
import fcntl, json, os, signal, sys, threading
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines.commandline.flags import with_default_runner

marker, handled, mode = sys.argv[1], sys.argv[2], sys.argv[3]
locked = open(marker, "w")
fcntl.flock(locked, fcntl.LOCK_EX)
signal.signal(signal.SIGTERM, lambda *_: open(handled, "w").close())
if mode == "thread":  # another Python thread: no fork of this process
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()

def seen(element):
    from privacy.rng import secure_generator
    descriptors = []
    for name in os.listdir("/proc/self/fd"):
        try:
            descriptors.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            pass
    with open(f"/proc/{os.getppid()}/stat") as stat:
        grandparent = int(stat.read().rsplit(")", 1)[1].split()[1])
    with open("/proc/self/cmdline", "rb") as command:  # a spawned worker runs Beam's module
        spawned = b"-m\x00apache_beam.runners.worker.sdk_worker_main" in command.read()
    with open(os.path.join(os.path.dirname(marker), f"worker-{element}.json"), "w") as out:
        json.dump({"pid": os.getpid(), "parent": os.getppid(), "grandparent": grandparent,
                   "spawned": spawned,
                   "descriptors": descriptors, "draw": int(secure_generator().integers(2**62))},
                  out)

from pipelines.engines.forked_workers import workers_would_fork
would_fork = workers_would_fork()  # what esa analyze asks before it spreads crowds
flags = ["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
         "--direct_num_workers=2"]
options = with_default_runner(PipelineOptions(flags))
with beam.Pipeline(options=options) as pipeline:
    pipeline | beam.Create(range(40)) | beam.Reshuffle() | beam.Map(seen)
print(json.dumps({"driver": os.getpid(), "runner": options.get_all_options()["runner"],
                  "would_fork": would_fork}))
"""


def _run_driver(tmp_path, mode: str) -> dict:
    import json
    import sys

    marker, handled = tmp_path / "output.lock", tmp_path / "sigterm-handled"
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(marker), str(handled), mode],
        capture_output=True, text=True, timeout=240, cwd=os.getcwd(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    workers = [json.loads(path.read_text()) for path in tmp_path.glob("worker-*.json")]
    result.update(marker=str(marker), handled=handled.exists(), workers=workers)
    return result


def test_a_driver_forks_its_own_workers_when_no_server_runs(tmp_path):
    """Outside esa run, a multi-process FnApiRunner pipeline (named with Beam's flags) runs on
    workers forked from a copy of the driver: each worker's parent is that copy, whose parent is
    the driver. The copy holds none of the driver's descriptors (the lock on the output stays
    the driver's alone), does not run the driver's SIGTERM handler when it is closed, and the
    workers' CSPRNG-seeded generators differ (40 elements: every worker draws once each)."""
    result = _run_driver(tmp_path, "plain")
    assert result["runner"] == forked_workers.RUNNER
    workers = result["workers"]
    assert len(workers) == 40
    servers = {worker["parent"] for worker in workers}
    assert len(servers) == 1 and result["driver"] not in servers
    assert {worker["grandparent"] for worker in workers} == {result["driver"]}
    assert not any(worker["spawned"] for worker in workers) and result["would_fork"]
    for worker in workers:
        assert result["marker"] not in worker["descriptors"]
    assert len({worker["draw"] for worker in workers}) == 40
    assert not result["handled"]  # the server was terminated; the driver's handler stayed put


def test_a_driver_with_another_thread_spawns_its_workers_as_beam_does(tmp_path):
    """A driver with a second Python thread (a progress line's) is not forked: Beam spawns its
    workers (each a fresh ``sdk_worker_main``, started by a shell of the driver's)."""
    result = _run_driver(tmp_path, "thread")
    assert len(result["workers"]) == 40
    assert all(worker["spawned"] for worker in result["workers"]) and not result["would_fork"]
    assert {worker["grandparent"] for worker in result["workers"]} == {result["driver"]}

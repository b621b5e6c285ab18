"""pipelines/engines/forked_workers.py: multi-process workers forked from a preloaded server."""

from __future__ import annotations

import os
import subprocess

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from pipelines.commandline.flags import with_default_runner
from pipelines.engines import forked_workers


def _parent_pid(_: int) -> int:
    return os.getppid()


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
            assert_that(total, equal_to([4950]), label="sum")
            assert_that(parents, equal_to([server._process.pid]), label="forked")
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


def test_workers_are_spawned_as_beam_does_when_the_server_has_died(monkeypatch):
    """A server that could not import its modules has exited: the pipeline still runs, on
    workers Beam spawns itself."""
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

"""Prism's and Flink's SDK workers as processes forked from the driver, not threads of it.

With ``--environment_type=LOOPBACK`` (``runners.runner_flags``) Beam's PortableRunner serves the
runner's requests for SDK workers from the submitting process
(``worker_pool_main.BeamFnExternalWorkerPoolServicer``): each worker is an ``SdkHarness`` thread
of that process. However many workers Flink asks for (``--sdk_worker_parallelism``, one
environment each, bundles of its task slots spread over them), the Python work of every bundle
then shares one interpreter: on 2 cores a sealed analysis on a Flink cluster with 2 task slots
and 2 SDK workers ran no faster than with 1. Beam's ``use_loopback_process_worker`` experiment
spawns ``python -c ...`` instead: whatever ``python`` is first on ``PATH`` (not this
interpreter, nor its packages), which then imports Beam and the pipeline's modules per worker.

When a pipeline on a portable runner asks for more than one SDK worker
(``--sdk_worker_parallelism`` > 1) and a fork server is running (``esa run``'s) or can be
forked from this driver now (:meth:`forked_workers.ForkServer.of_this_process`: before the
runner opens any gRPC channel), :func:`start_and_replace_loopback_environments` serves those
requests with a ``ForkingWorkerPool`` (:func:`forking_worker_pool`): each worker the runner requests is a process forked
by that server, with everything the driver had imported, given the runner's endpoints in the
environment ``sdk_worker_main`` reads, exactly as Beam's spawned worker processes are. Its work
runs on a core of its own. Where no server can be had (another thread running, gRPC used
before), Beam's thread workers run as before; with one SDK worker nothing changes.

The pool's server and the fork server (when forked for this pipeline) are stopped by the
pipeline result's clean-up, when the job has finished.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shlex
import subprocess
from collections.abc import Callable
from typing import Any

from pipelines.engines import forked_workers
from pipelines.engines.install_once import install_once

__all__ = [
    "fork_sdk_workers",
    "forking_worker_pool",
    "sdk_workers_asked",
    "start_and_replace_loopback_environments",
    "wants_worker_processes",
    "whole_number",
    "worker_environment",
]

_LOGGER = logging.getLogger(__name__)
beams_replace_loopback: list[Callable] = []  # Beam's own, once replaced


def whole_number(value: Any) -> int | None:
    """A Beam option's value as a whole number (Beam keeps some, such as
    ``--sdk_worker_parallelism``, as the text given), or None when it is unset or none."""
    try:
        return int(str(value))
    except ValueError:
        return None


def sdk_workers_asked(options: Any) -> int | None:
    """``--sdk_worker_parallelism`` as a number (None: unset or not a number)."""
    from apache_beam.options.pipeline_options import PortableOptions

    return whole_number(options.view_as(PortableOptions).sdk_worker_parallelism)


def wants_worker_processes(options: Any) -> bool:
    """Whether ``options`` ask a portable runner for more than one SDK worker."""
    return (sdk_workers_asked(options) or 1) > 1


def _pipeline_options_json(options: Any) -> str:
    """``PIPELINE_OPTIONS`` for ``sdk_worker_main``: the options set, those JSON can carry."""
    carried = {}
    for name, value in options.get_all_options(drop_default=True).items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        carried[name] = value
    return json.dumps({"options": carried})


def worker_environment(request: Any, options_json: str) -> dict[str, str]:
    """The environment ``sdk_worker_main`` reads, for the worker a ``StartWorkerRequest`` asks
    for (as Beam's ``SubprocessSdkWorker`` sets it: the endpoints as text-format descriptors)."""
    from apache_beam.portability.api import endpoints_pb2
    from google.protobuf import text_format

    def descriptor(endpoint: Any) -> str:
        return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=endpoint.url))

    env = dict(os.environ)
    env["CONTROL_API_SERVICE_DESCRIPTOR"] = descriptor(request.control_endpoint)
    if request.logging_endpoint.url:
        env["LOGGING_API_SERVICE_DESCRIPTOR"] = descriptor(request.logging_endpoint)
    env["PIPELINE_OPTIONS"] = options_json
    if request.worker_id:
        env["WORKER_ID"] = request.worker_id
    return env


@functools.cache
def forking_worker_pool() -> type:
    """The class ``ForkingWorkerPool`` (made on first use: Beam is imported then)."""
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

    class ForkingWorkerPool(BeamFnExternalWorkerPoolServicer):
        """Beam's external worker pool whose ``StartWorker`` forks a worker process by a fork
        server (through its worker command, a small client that waits for the worker);
        ``StopWorker`` is Beam's (it ends that client; the worker ends when the runner closes
        its control channel)."""

        def __init__(self, server: forked_workers.ForkServer, options_json: str) -> None:
            super().__init__(use_process=True)
            self._server = server
            self._options_json = options_json

        def StartWorker(self, request: Any, unused_context: Any) -> Any:  # noqa: N802 - gRPC's
            from apache_beam.portability.api import beam_fn_api_pb2

            try:
                process = subprocess.Popen(
                    shlex.split(self._server.worker_command),
                    env=worker_environment(request, self._options_json),
                    stdin=subprocess.DEVNULL,
                    close_fds=True,
                )
            except OSError as error:
                return beam_fn_api_pb2.StartWorkerResponse(error=f"forking a worker: {error}")
            self._worker_processes[request.worker_id] = process
            return beam_fn_api_pb2.StartWorkerResponse()

        def close(self) -> None:
            """End the worker commands the runner did not stop (each waits for its worker,
            which ends by itself when the runner closes its control channel) and reap them."""
            processes = list(self._worker_processes.values())
            self._worker_processes.clear()
            forked_workers.end_processes(processes, 5)

        @classmethod
        def serve(
            cls, server: forked_workers.ForkServer, options_json: str
        ) -> tuple[str, Any, Any]:
            """(address, gRPC server, pool) of a pool serving on a free local port."""
            import grpc
            from apache_beam.portability.api import beam_fn_api_pb2_grpc
            from apache_beam.utils import thread_pool_executor

            grpc_server = grpc.server(
                thread_pool_executor.shared_unbounded_instance(),
                options=[("grpc.http2.max_pings_without_data", 0),
                         ("grpc.http2.max_ping_strikes", 0)],
            )  # fmt: skip
            address = f"localhost:{grpc_server.add_insecure_port('localhost:0')}"
            pool = cls(server, options_json)
            beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, grpc_server)
            grpc_server.start()
            return address, grpc_server, pool

    return ForkingWorkerPool


def start_and_replace_loopback_environments(pipeline: Any, options: Any) -> list[Callable]:
    """``PortableRunner.start_and_replace_loopback_environments`` (Beam 2.77): with more than
    one SDK worker asked for and a fork server to be had, each LOOPBACK environment becomes an
    EXTERNAL one served by a ``ForkingWorkerPool``; else Beam's own. Returns the clean-up
    callbacks the pipeline result runs when the job has finished."""
    from apache_beam.options.pipeline_options import PortableOptions
    from apache_beam.portability import python_urns
    from apache_beam.transforms import environments

    loopback = [
        env
        for env in pipeline.components.environments.values()
        if env.urn == python_urns.EMBEDDED_PYTHON_LOOPBACK
    ]
    if not loopback or not wants_worker_processes(options):
        return beams_replace_loopback[0](pipeline, options)
    server = forked_workers.running()
    own = None
    if server is None or not server.alive():
        server = own = forked_workers.ForkServer.of_this_process()
    if server is None:
        _LOGGER.info("SDK workers run as threads: no fork server can be had in this process")
        return beams_replace_loopback[0](pipeline, options)
    forked_workers.grpc_in_use()  # the runner's channels open next: no later fork of this one
    address, grpc_server, pool = forking_worker_pool().serve(
        server, _pipeline_options_json(options)
    )
    external = PortableOptions(environment_type="EXTERNAL", environment_config=address)
    payload = environments.ExternalEnvironment.from_options(external).to_runner_api(None)
    for env in loopback:
        env.urn = payload.urn
        env.payload = payload.payload
    callbacks: list[Callable] = [lambda: grpc_server.stop(1), pool.close]
    if own is not None:
        callbacks.append(own.close)
    return callbacks


@install_once
def fork_sdk_workers() -> bool:
    """Install :func:`start_and_replace_loopback_environments` as PortableRunner's (once;
    idempotent). Returns whether it is installed (the installed Beam has the method)."""
    from apache_beam.runners.portability import portable_runner

    runner = portable_runner.PortableRunner
    original = getattr(runner, "start_and_replace_loopback_environments", None)
    if original is None:
        return False
    beams_replace_loopback.append(original)
    runner.start_and_replace_loopback_environments = staticmethod(
        start_and_replace_loopback_environments
    )
    return True

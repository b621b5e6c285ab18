"""Flink's job-end hang-up of a LOOPBACK worker's data channel stays off stderr; other errors of
the same thread do not (pipelines/engines.quiet_worker_hangups)."""

from __future__ import annotations

import logging
import threading
from concurrent import futures

import grpc
import pytest

from pipelines.engines import runners

_METHOD = "/esa.test.Data/Stream"


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.RpcError:
    """A real gRPC error: a streaming call to an in-process server that aborts it."""

    def stream(request_iterator, context):
        context.abort(code, details)
        yield b""  # pragma: no cover - abort raises

    handler = grpc.method_handlers_generic_handler(
        "esa.test.Data", {"Stream": grpc.stream_stream_rpc_method_handler(stream)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("localhost:0")
    server.start()
    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            call = channel.stream_stream(_METHOD)(iter([b""]))
            with pytest.raises(grpc.RpcError) as raised:
                list(call)
            return raised.value
    finally:
        server.stop(None)


def _raise_in_reader_thread(error: BaseException, name: str = runners._READER_THREAD) -> None:
    def read() -> None:
        logging.getLogger(runners._DATA_PLANE_LOGGER).error(
            "Failed to read inputs in the data plane.", exc_info=error
        )
        raise error

    thread = threading.Thread(target=read, name=name)
    thread.start()
    thread.join()


def _uninstall_quieting() -> None:
    """Undo :func:`runners.quiet_worker_hangups`' filters (its excepthook is the caller's)."""
    for name in (runners._DATA_PLANE_LOGGER, runners._SERVER_LOGGER):
        for installed in list(logging.getLogger(name).filters):
            logging.getLogger(name).removeFilter(installed)
    runners._installed.clear()


def test_only_the_job_end_hangup_is_recognised() -> None:
    assert runners.is_worker_hangup(_rpc_error(grpc.StatusCode.CANCELLED, runners._HANGUP))
    assert not runners.is_worker_hangup(_rpc_error(grpc.StatusCode.CANCELLED, "other"))
    assert not runners.is_worker_hangup(_rpc_error(grpc.StatusCode.UNAVAILABLE, runners._HANGUP))
    assert not runners.is_worker_hangup(RuntimeError(runners._HANGUP))
    assert not runners.is_worker_hangup(None)


def test_hangup_is_dropped_and_other_errors_still_reported(capsys, caplog) -> None:
    seen: list[BaseException] = []
    original = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    runners._installed.clear()
    try:
        runners.quiet_worker_hangups()
        runners.quiet_worker_hangups()  # idempotent: one hook, one filter
        hangup = _rpc_error(grpc.StatusCode.CANCELLED, runners._HANGUP)
        failure = _rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")
        with caplog.at_level(logging.ERROR, logger=runners._DATA_PLANE_LOGGER):
            _raise_in_reader_thread(hangup)
            _raise_in_reader_thread(failure)
            _raise_in_reader_thread(hangup, name="another-thread")
        assert seen == [failure, hangup]
        # the logger drops the hang-up whichever thread logs it; the thread hook only the reader's
        assert [record.exc_info[1] for record in caplog.records] == [failure]
    finally:
        threading.excepthook = original
        _uninstall_quieting()


def test_a_job_servers_routine_stop_is_dropped_and_its_other_warnings_kept(caplog) -> None:
    """Beam's "Really destroying service" WARNING (every stop of a job server it started, Prism's
    at exit) is dropped; another warning of the same logger still comes through."""
    runners._installed.clear()
    server_logger = logging.getLogger(runners._SERVER_LOGGER)
    try:
        runners.quiet_worker_hangups()
        with caplog.at_level(logging.WARNING, logger=runners._SERVER_LOGGER):
            server_logger.warning(
                "Really destroying service at %s with cmd: %s", "localhost:1", ("prism",)
            )
            server_logger.warning("Could not start the job server %s", "prism")
        assert [record.getMessage() for record in caplog.records] == [
            "Could not start the job server prism"
        ]
    finally:
        _uninstall_quieting()

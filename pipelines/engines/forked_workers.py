"""Beam SDK worker processes forked from a process that has already imported what they run.

The multi-process DirectRunner starts each worker as ``python -m
apache_beam.runners.worker.sdk_worker_main``: a fresh interpreter that imports Beam (~1.1-1.8 s of
CPU) and then, unpickling the pipeline, the modules of its DoFns (the simulator's sealing, the
analyzer's opening and arithmetic: ~0.5-1 s more), for every pipeline. ``esa run`` runs two such
pipelines (simulate and analyze) with one worker per CPU, so on two cores about 2 x 2 x 2 s of
CPU went into starting workers, on the critical path.

:class:`ForkServer` is a separate, single-threaded process, started from a fresh interpreter
(``python -m pipelines.engines.forked_workers serve SOCKET MODULE...``) before any pipeline runs.
It imports the given modules once (while the driver is still importing and preparing on its
own core) and then, per request on its Unix socket, forks a worker: the child takes the
requesting command's environment (the Fn API endpoints Beam hands a worker), working directory
and standard streams, and runs ``sdk_worker_main`` exactly as the fresh interpreter would. The request
comes from the worker command Beam starts (``python -m pipelines.engines.forked_workers worker
SOCKET``), a small client that imports nothing heavy and exits with the forked worker's exit
status, so Beam sees an ordinary worker subprocess. :class:`ForkedWorkerRunner` (FnApiRunner)
gives Beam that command instead of its own when the pipeline runs multi-process.

Fork safety: the server never starts a thread nor opens a gRPC channel (it only imports), so
the child is a copy of a single-threaded process; Python reseeds ``random`` in a forked child,
OpenSSL reseeds its generator after a fork, and no module holds a numpy generator made at import
(``privacy.rng`` seeds each one from the OS CSPRNG when it is made, in the worker), so no two
workers share a random stream. The server exits when its parent does or when told to
(SIGTERM); a child ends when the runner closes its control channel, as a spawned worker does, or
with the server: one still running when the server ends is sent SIGTERM, then SIGKILL
(:func:`_end_workers`), and one whose server is killed gets SIGKILL from the kernel
(``PR_SET_PDEATHSIG``). On a portable runner the control channel is the runner's (Flink's
TaskManager), which may outlive the driver: after a failed Flink job its workers stayed
connected, and holding the driver's standard streams kept a caller reading them waiting.

A pipeline run multi-process outside ``esa run`` (``esa shuffle`` or ``esa analyze`` spread over
workers, ``--runner=FnApiRunner --direct_running_mode=multi_processing``) has no server started
in advance. There :class:`ForkedWorkerRunner` forks the server from the driver itself
(:meth:`ForkServer.of_this_process`) just before the pipeline starts: the driver has by then
imported Beam and, building the graph, every module of its DoFns, so the workers start without
importing anything (on a 16-core machine, 16 spawned workers took 1.6 s to take the first bundle
of a sealed analysis that ran 11 s). Only where it is safe: this process has no other Python
thread (a progress line's), has not run a pipeline on gRPC before (gRPC's own threads do not
survive a fork), and lists its descriptors in ``/proc/self/fd``; else Beam spawns its workers.
The copy drops everything of the driver's that must not outlive it: signal handlers go back to
the defaults (a driver's SIGTERM clean-up must not run in the copy), every descriptor but the
standard streams and its socket is pointed at ``/dev/null`` (a lock held on an output directory
is released when the driver releases it), and it ends with ``os._exit`` (no ``atexit`` or
finalizer of the driver's runs in it).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "ForkServer",
    "RUNNER",
    "end_processes",
    "fork_is_safe",
    "grpc_in_use",
    "running",
    "serving",
    "serving_this_process",
]  # and ForkedWorkerRunner

RUNNER = "pipelines.engines.forked_workers.ForkedWorkerRunner"
_LENGTH = 8  # bytes of a request's length prefix
_STATUS = 4  # bytes of the exit status the server answers with
_LATER = "--later"  # separates the modules imported before serving from those imported later
_CONNECT_S = 60.0  # a worker command waits this long for the server's socket
_POLL_S = 0.2  # the server looks for a vanished parent this often (a signal wakes it at once)
_END_S = 2.0  # a worker still running when its server ends has this long after SIGTERM
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent exits

_running: list[ForkServer] = []  # the server of this process (one at a time)


class ForkServer:
    """A fork server process and the worker command that asks it for a worker."""

    def __init__(
        self, preload: Sequence[str], later: Sequence[str] = (), *, this_process: bool = False
    ) -> None:
        """``preload``: imported before the first worker is forked; ``later``: imported one at a
        time while no request waits (children forked after have them too). ``this_process``:
        the server is a fork of this process (:meth:`of_this_process`), not a new interpreter."""
        self._directory = tempfile.mkdtemp(prefix="esa-fork-")
        self.socket_path = os.path.join(self._directory, "server")
        self._process: subprocess.Popen | _ForkedServer
        if this_process:
            self._process = _ForkedServer(self.socket_path)
        else:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, "serve", self.socket_path, *preload, _LATER,
                 *later],
                stdin=subprocess.DEVNULL,
            )  # fmt: skip

    @classmethod
    def of_this_process(cls) -> ForkServer | None:
        """A server forked from this process (it serves with what this process has imported),
        or None where that is not safe (:func:`fork_is_safe`)."""
        if not fork_is_safe():
            return None
        return cls((), this_process=True)

    @property
    def worker_command(self) -> str:
        """The shell command Beam runs as a worker (SubprocessSDKEnvironment's command line)."""
        return f"{sys.executable} -m {__name__} worker {self.socket_path}"

    def alive(self) -> bool:
        """Whether the server still runs (one that failed to import its modules has exited)."""
        return self._process.poll() is None

    def close(self) -> None:
        from pipelines.engines.worker_shutdown import wait_for_workers

        wait_for_workers()  # its children of closed pipelines exit first (and report status 0)
        end_processes([self._process], 10)
        shutil.rmtree(self._directory, ignore_errors=True)


def end_processes(processes: Sequence[Any], grace_s: float) -> None:
    """End ``processes`` (``subprocess.Popen`` or alike) still running: SIGTERM to each, then
    each waited for up to ``grace_s`` and killed (SIGKILL) if it has not ended; all reaped."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_grpc_started: list[bool] = []  # a pipeline has run on gRPC in this process (not empty)


def grpc_in_use() -> None:
    """Note that this process has opened gRPC channels or servers (a pipeline's, a job
    server's): from now on it forks no server (:func:`fork_is_safe`)."""
    _grpc_started.append(True)


# Names Linux gives the threads of gRPC's core, which a Beam pipeline leaves running.
_GRPC_THREADS = ("grpc", "event_engine", "lifeguard")


def fork_is_safe() -> bool:
    """Whether this process may fork (a server, or the experiments' worker pools): no other
    Python thread, no pipeline run on gRPC before (noted by :func:`grpc_in_use`, or seen as a
    gRPC core thread in ``/proc/self/task``: a test process that forked with them alive died in
    ``os.fork``), and its descriptors listed in ``/proc/self/fd`` (see the module docstring)."""
    return (
        threading.active_count() == 1
        and not _grpc_started
        and hasattr(os, "fork")
        and os.path.isdir("/proc/self/fd")
        and not _grpc_threads()
    )


def workers_would_fork() -> bool:
    """Whether a multi-process pipeline started now gets forked workers (a running fork
    server's, or a fork of this driver where :func:`fork_is_safe`), not Beam's spawned ones,
    each of which starts a fresh interpreter and imports Beam (seconds)."""
    server = running()
    return (server is not None and server.alive()) or fork_is_safe()


def _grpc_threads() -> bool:
    """Whether a thread of gRPC's core runs in this process (by its name in ``/proc``)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith(_GRPC_THREADS):
                    return True
        except OSError:
            continue
    return False


class _ForkedServer:
    """The part of ``subprocess.Popen`` that :class:`ForkServer` uses, for a fork of this
    process that serves on ``socket_path``."""

    def __init__(self, socket_path: str) -> None:
        listener = _listen(socket_path)  # before the fork: a request made early waits
        pid = os.fork()
        if pid == 0:  # the copy: never returns into the driver's code
            code = 1
            try:
                _leave_the_driver(keep=listener.fileno())
                _serve_on(listener, (), ())
                code = 0
            except BaseException:  # noqa: BLE001 - reported, then the copy ends
                traceback.print_exc()
            finally:
                os._exit(code)
        listener.close()
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)


def _leave_the_driver(keep: int) -> None:
    """In a fork of the driver: default signal handlers, and every descriptor but the standard
    streams and ``keep`` pointed at /dev/null (the driver's files, locks and sockets are not
    the server's; a descriptor is replaced, not closed, so no number is reused under an object
    that still names it)."""
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        descriptor = int(name)
        if descriptor > 2 and descriptor not in (keep, null):
            with contextlib.suppress(OSError):
                os.fstat(descriptor)  # still open (listdir's own has gone)
                os.dup2(null, descriptor)


def running() -> ForkServer | None:
    """The fork server started by :func:`serving` in this process, if one is up."""
    return _running[-1] if _running else None


@contextlib.contextmanager
def serving(preload: Sequence[str], later: Sequence[str] = ()) -> Iterator[ForkServer]:
    """A fork server (see :class:`ForkServer`) for the pipelines run inside the block."""
    with _registered(ForkServer(preload, later)) as server:
        yield server


@contextlib.contextmanager
def serving_this_process() -> Iterator[ForkServer | None]:
    """A fork server forked from this process now (:meth:`ForkServer.of_this_process`) for the
    pipelines run inside the block: for a command that starts a thread of its own (its progress
    line) before it builds a pipeline. None where one is running already or forking is not
    safe; then the pipelines fork or spawn their workers as they would without it."""
    server = None if running() is not None else ForkServer.of_this_process()
    if server is None:
        yield None
        return
    with _registered(server):
        yield server


@contextlib.contextmanager
def _registered(server: ForkServer) -> Iterator[ForkServer]:
    """``server`` as this process's :func:`running` one for the block, closed after it."""
    _running.append(server)
    try:
        yield server
    finally:
        _running.remove(server)
        server.close()


def _forked_runner_base() -> type:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return FnApiRunner


def __getattr__(name: str) -> Any:
    """``ForkedWorkerRunner``, built on first use: the worker client imports this module and
    must not import Beam."""
    if name != "ForkedWorkerRunner":
        raise AttributeError(name)
    from apache_beam.options.pipeline_options import DirectOptions
    from apache_beam.transforms import environments

    class ForkedWorkerRunner(_forked_runner_base()):
        """FnApiRunner whose multi-process workers are forked by this process's fork server
        (spawned as Beam does when none is running)."""

        def run_pipeline(self, pipeline: Any, options: Any) -> Any:
            direct = options.view_as(DirectOptions)
            if direct.direct_running_mode != "multi_processing":  # in this process
                return super().run_pipeline(pipeline, options)
            server = running()
            own = None
            if server is None or not server.alive():  # outside esa run: fork this driver
                server = own = ForkServer.of_this_process()
            grpc_in_use()
            if server is None:  # Beam's own spawned workers
                return super().run_pipeline(pipeline, options)
            self._default_environment = environments.SubprocessSDKEnvironment.from_command_string(
                command_string=server.worker_command
            )
            # FnApiRunner replaces the environment with its own command in multi_processing
            # mode; in in_memory mode it keeps this one and still runs direct_num_workers.
            direct.direct_running_mode = "in_memory"
            try:
                return super().run_pipeline(pipeline, options)
            finally:
                direct.direct_running_mode = "multi_processing"
                if own is not None:
                    own.close()

    globals()["ForkedWorkerRunner"] = ForkedWorkerRunner
    return ForkedWorkerRunner


# ---------------------------------------------------------------------------------------------
# The server and the worker client (``python -m pipelines.engines.forked_workers ...``)
# ---------------------------------------------------------------------------------------------


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _run_worker(request: dict[str, Any]) -> int:
    """In the forked child: become the requested worker (sdk_worker_main with its environment)."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from apache_beam.runners.worker import sdk_worker_main
    from apache_beam.runners.worker.worker_id_interceptor import WorkerIdInterceptor

    # Read from the environment when the server imported it, before this worker had an ID: the
    # logging channel sends it (Prism refuses a log stream without one).
    WorkerIdInterceptor._worker_id = os.environ.get("WORKER_ID")

    try:
        sdk_worker_main.main([])
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported as a spawned worker's traceback would be
        traceback.print_exc()
        return 1
    return 0


def _listen(socket_path: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    return listener


def _serve(socket_path: str, preload: Sequence[str], later: Sequence[str]) -> None:
    # Listening first: a request made while preloading waits in the backlog.
    _serve_on(_listen(socket_path), preload, later)


def _serve_on(listener: socket.socket, preload: Sequence[str], later: Sequence[str]) -> None:
    parent = os.getppid()
    for module in preload:
        importlib.import_module(module)
    from pipelines.engines.process_tuning import tune_this_process

    tune_this_process()  # as a driver's (with_default_runner): the workers run the bundles
    later = list(later)
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    stopping: list[int] = []  # SIGTERM ends the loop, then the workers (_end_workers)
    signal.signal(signal.SIGTERM, lambda number, _: stopping.append(number))
    # A worker's exit (SIGCHLD) and SIGTERM wake the loop at once, through this pipe: with a
    # handler alone select sleeps out its timeout (PEP 475 retries it), and the client of a
    # worker that had ended heard of it up to _POLL_S later (0.1-0.2 s of every pipeline's end,
    # measured as the driver's wait for its workers after the last stage).
    wake_read, wake_write = os.pipe()
    for descriptor in (wake_read, wake_write):
        os.set_blocking(descriptor, False)
    signal.signal(signal.SIGCHLD, lambda number, _: None)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    try:
        _serve_requests(listener, parent, later, waiting, stopping, wake_read)
    finally:
        _end_workers(waiting)


def _serve_requests(
    listener: socket.socket,
    parent: int,
    later: list[str],
    waiting: dict[int, socket.socket],
    stopping: list[int],
    wake: int,
) -> None:
    """Fork a worker per request until the parent has gone or SIGTERM came; answer each
    client with its worker's exit status. ``wake`` becomes readable when a signal came."""
    server = os.getpid()
    while os.getppid() == parent and not stopping:
        readable, _, _ = select.select([listener, wake], [], [], _POLL_S if not later else 0)
        if wake in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake, 4096):
                    pass
        if not readable and later:
            importlib.import_module(later.pop(0))
        if listener in readable:
            connection, _ = listener.accept()
            descriptors: list[int] = []
            try:  # the length, with the client's stdin, stdout and stderr; then the request
                prefix, descriptors, _, _ = socket.recv_fds(connection, _LENGTH, 3)
                if len(prefix) != _LENGTH or len(descriptors) != 3:
                    raise ValueError("a request starts with its length and 3 descriptors")
                size = int.from_bytes(prefix, "big")
                request = json.loads(_receive(connection, size))
            except (ConnectionError, OSError, ValueError):
                connection.close()
                for descriptor in descriptors:
                    os.close(descriptor)
                continue
            pid = os.fork()
            if pid == 0:
                os.close(signal.set_wakeup_fd(-1))  # the wake pipe is the server's
                os.close(wake)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _die_with_parent(server)
                listener.close()
                for other in waiting.values():
                    other.close()
                connection.close()
                for target, descriptor in enumerate(descriptors):
                    os.dup2(descriptor, target)
                    os.close(descriptor)
                code = _run_worker(request)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            for descriptor in descriptors:
                os.close(descriptor)
            waiting[pid] = connection
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid, None)
            if connection is not None:
                with contextlib.suppress(OSError):
                    connection.sendall(
                        os.waitstatus_to_exitcode(status).to_bytes(_STATUS, "big", signed=True)
                    )
                connection.close()


def _die_with_parent(server: int) -> None:
    """In a worker forked by ``server``: SIGKILL from the kernel when the server exits, however
    it ends (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing: the server ends its workers
    itself); a server already gone by then ends the worker at once."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server:
        os._exit(1)


def _end_workers(waiting: dict[int, socket.socket]) -> None:
    """The server is ending: its workers still running get SIGTERM, and SIGKILL after
    :data:`_END_S`; each is reaped and its client's connection closed (the client then exits
    with status 1)."""
    for pid in waiting:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _END_S
    while waiting and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
            continue
        connection = waiting.pop(pid, None)
        if connection is not None:
            connection.close()
    for pid, connection in waiting.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        connection.close()
    waiting.clear()


def _worker(socket_path: str) -> int:
    """The worker command: ask the server for a worker with this environment, working directory
    and standard streams; wait for it and return its exit status."""
    request = json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        deadline = time.monotonic() + _CONNECT_S
        while True:  # the server binds its socket a moment after it starts
            try:
                connection.connect(socket_path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        socket.send_fds(connection, [len(request).to_bytes(_LENGTH, "big")], [0, 1, 2])
        connection.sendall(request)
        try:
            return int.from_bytes(_receive(connection, _STATUS), "big", signed=True)
        except ConnectionError:
            return 1


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        modules = sys.argv[3:]
        split = modules.index(_LATER)
        _serve(sys.argv[2], modules[:split], modules[split + 1 :])
    else:
        sys.exit(_worker(sys.argv[2]))

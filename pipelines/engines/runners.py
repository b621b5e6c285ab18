"""Where ``make engines`` (scripts/engines.sh) puts the real engines, and the Beam flags that run a
pipeline on each.

Engines, each matched to the installed Beam Python SDK (the portable job API must agree):

- ``prism``: Beam's portable runner written in Go, built by ``go install`` at the SDK's own release
  tag into ``ENGINES/bin/prism-v<beam>``; run through Beam's ``PrismRunner``, which starts it as a
  subprocess job server (``--prism_location``). ``prism_server`` runs the same binary as a
  standing job server that ``PortableRunner`` submits to.
- ``flink``: Apache Flink through Beam's ``FlinkRunner``, given a Flink job server jar:
  Beam's published ``ENGINES/flink/beam-runners-flink-<flink>-job-server-<beam>.jar`` for the
  installed SDK when Maven serves it, else the one ``make engines`` assembled from Beam's Flink
  runner module and its dependencies (``ENGINES/flink/assembled-<beam>-<flink>/``, see
  ``pipelines/engines/flink_cluster.py``); ``--flink_master=[local]`` runs the job server's embedded
  Flink cluster in its JVM.
- ``flink_cluster``: the same job server submitting to a standalone Flink cluster (a JobManager
  and a TaskManager, ``pipelines.engines.flink_cluster.FlinkCluster``) at ``--flink_master=HOST:PORT``.
  Both tell the job server that the cluster already holds its jars, so that jobs stage none
  (``flink_cluster.py``): a cluster that lacks Beam's Flink runner needs Beam's own flags instead.

``ENGINES`` is ``$ESA_ENGINES_DIR``, else ``.engines/`` in the repository (ignored by git). The
workers run on this machine, served from the submitting process (``LOOPBACK``), so local paths
work on every engine: one SDK worker is a thread of that process; more than one
(``--sdk_worker_parallelism``) are processes forked from it (``process_workers.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    JobServerOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
)
from apache_beam.runners.portability.flink_runner import (
    MAGIC_HOST_NAMES,
    FlinkJarJobServer,
    FlinkRunner,
)
from apache_beam.version import __version__ as BEAM_VERSION

from pipelines.engines import forked_workers
from pipelines.engines.ports import free_port

__all__ = ["BEAM_VERSION", "CLUSTER_HOLDS_JARS", "ENGINES", "engines_dir", "flink_cluster_lib",
           "flink_job_server_jar", "one_job_server", "prism_binary", "quiet_worker_hangups",
           "runner_flags"]  # fmt: skip

ENGINES = ("fnapi", "prism", "flink", "flink_cluster")
# The JVM property that tells the assembled Flink job server (flink_job_server/) that the cluster
# already holds its jars, so that its jobs stage none of them.
CLUSTER_HOLDS_JARS = "esa.flink.clusterHoldsJobServerJars"
# The JVM property of its temporary directory (Flink's io.tmp.dirs defaults to it).
JAVA_TEMP_PROPERTY = "java.io.tmpdir"


def engines_dir() -> Path:
    """``$ESA_ENGINES_DIR`` or the repository's ``.engines/``."""
    configured = os.environ.get("ESA_ENGINES_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / ".engines"


def prism_binary() -> Path | None:
    """The Prism binary built for the installed Beam release, or None when not installed."""
    path = engines_dir() / "bin" / f"prism-v{BEAM_VERSION}"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def flink_job_server_jar() -> Path | None:
    """The Flink job server jar: Beam's published one for the installed release (newest Flink
    first), else the assembled one (newest Beam release first), else None."""
    flink = engines_dir() / "flink"
    published = sorted(flink.glob(f"beam-runners-flink-*-job-server-{BEAM_VERSION}.jar"))
    if published:
        return published[-1]
    assembled = sorted(flink.glob("assembled-*/beam-runners-flink-*-job-server-*.jar"),
                       key=lambda jar: _release(jar.parent.name.split("-")[1]))  # fmt: skip
    return assembled[-1] if assembled else None


def flink_cluster_lib() -> Path | None:
    """The assembled jars (Flink runtime and Beam's Flink runner) a standalone cluster runs on."""
    jar = flink_job_server_jar()
    lib = jar.parent / "lib" if jar is not None else None
    return lib if lib is not None and lib.is_dir() else None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def runner_flags(engine: str, parallelism: int | None = None, master: str = "[local]") -> list[str]:
    """Beam flags that run a pipeline on ``engine`` (one of :data:`ENGINES`).

    ``master`` is the Flink cluster's ``HOST:PORT`` for ``flink_cluster`` (``[local]``: the job
    server's embedded cluster). Raises FileNotFoundError naming what is missing when the engine is
    not installed.
    """
    if engine == "fnapi":
        return ["--runner=FnApiRunner"]
    if engine == "prism":
        binary = prism_binary()
        if binary is None:
            raise FileNotFoundError(
                f"no Prism binary for Beam {BEAM_VERSION} in {engines_dir() / 'bin'}: "
                "run `make engines`"
            )
        return ["--runner=PrismRunner", f"--prism_location={binary}", "--environment_type=LOOPBACK"]
    if engine in ("flink", "flink_cluster"):
        jar = flink_job_server_jar()
        if jar is None:
            unavailable = engines_dir() / "flink" / f"unavailable-{BEAM_VERSION}.txt"
            if unavailable.is_file():
                raise FileNotFoundError(
                    f"Maven served no Beam {BEAM_VERSION} Flink job server jar to `make engines` "
                    f"(its answers: {unavailable}) and none was assembled (see mvn-assemble.log)"
                )
            raise FileNotFoundError(
                f"no Flink job server jar in {engines_dir() / 'flink'}: run `make engines`"
            )
        if engine == "flink_cluster" and master == "[local]":
            raise ValueError("flink_cluster needs the cluster's master HOST:PORT")
        flags = [
            "--runner=FlinkRunner",
            f"--flink_master={master if engine == 'flink_cluster' else '[local]'}",
            f"--flink_job_server_jar={jar}",
            # The cluster (embedded, or started from the same jars) holds every jar the job
            # server would stage with each job: the assembled job server then stages none
            # (flink_job_server/PrestagedJobServer.java; Beam's published one ignores this).
            f"--job_server_jvm_properties=-D{CLUSTER_HOLDS_JARS}=true",
            "--environment_type=LOOPBACK",
        ]
        if parallelism is not None:
            flags.append(f"--parallelism={parallelism}")
        return flags
    raise ValueError(f"unknown engine {engine!r}; have {', '.join(ENGINES)}")


def _without_runner(flags: Sequence[str]) -> list[str]:
    kept, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--runner":
            skip = True  # "--runner NAME": drop the name too
        elif not flag.startswith("--runner="):
            kept.append(flag)
    return kept


@contextlib.contextmanager
def one_job_server(flags: Sequence[str]) -> Iterator[list[str]]:
    """The Beam flags for a command that runs several pipelines (``esa run``), with one job server.

    Beam's FlinkRunner starts a Flink job server (a JVM, with its embedded cluster for
    ``[local]``) for every pipeline and stops them only when the process exits, so a
    simulate -> shuffle x K -> analyze run kept K + 2 of them alive, busy, at once. With FlinkRunner
    flags this starts the job server once, yields the same flags submitting through
    ``PortableRunner`` to it (``--job_endpoint``; LOOPBACK workers for an embedded cluster, as
    FlinkRunner does), and stops it on leaving, removing the JVM's temporary directory (one of
    its own unless its flags name one). Other runners' flags are yielded unchanged.
    """
    flags = list(flags)
    options = PipelineOptions(flags)
    runner = options.view_as(StandardOptions).runner or ""
    if runner.rsplit(".", 1)[-1] != "FlinkRunner":
        yield flags
        return
    flink = options.view_as(FlinkRunnerOptions)
    flink.flink_master = FlinkRunner.add_http_scheme(flink.flink_master)
    job_server = options.view_as(JobServerOptions)
    job_server.job_port = job_server.job_port or free_port()
    endpoint = f"localhost:{job_server.job_port}"
    properties = list(job_server.job_server_jvm_properties or [])
    java_temp = None
    if not any(p.startswith(f"-D{JAVA_TEMP_PROPERTY}=") for p in properties):
        # The JVM's temporary files (an embedded cluster unpacks its RPC system there, a 21 MB
        # flink-rpc-akka*.jar, and keeps a minicluster_* directory) in a directory of this
        # server's own, removed when it stops: when Flink did not get to remove its own first,
        # they used to stay in the system's temporary directory.
        java_temp = tempfile.mkdtemp(prefix="esa-flink-job-server-")
        job_server.job_server_jvm_properties = [*properties, f"-D{JAVA_TEMP_PROPERTY}={java_temp}"]
    server = FlinkJarJobServer(options)
    forked_workers.grpc_in_use()  # its readiness check opens a channel in this process
    try:
        server.start()  # returns once the job service answers at the endpoint
        try:
            shared = [
                *_without_runner(flags), "--runner=PortableRunner", f"--job_endpoint={endpoint}"
            ]  # fmt: skip
            if (
                flink.flink_master in MAGIC_HOST_NAMES
                and not options.view_as(PortableOptions).environment_type
            ):
                shared.append("--environment_type=LOOPBACK")
            yield shared
        finally:
            server.stop()
    finally:  # after the JVM has stopped, or failed to start
        if java_temp is not None:
            shutil.rmtree(java_temp, ignore_errors=True)


# The LOOPBACK worker's data-plane reader thread (apache_beam/runners/worker/data_plane.py) and the
# logger it reports through; the job server's words when it closes the channel after a job.
_READER_THREAD = "read_grpc_client_inputs"
_DATA_PLANE_LOGGER = "apache_beam.runners.worker.data_plane"
_HANGUP = "Multiplexer hanging up"


def is_worker_hangup(error: BaseException | None) -> bool:
    """Whether ``error`` is the gRPC CANCELLED a Flink job server sends a LOOPBACK worker's data
    channel when a job has finished ("Multiplexer hanging up"): the end of a job, not a fault."""
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if not (callable(code) and callable(details)):
        return False
    try:
        return getattr(code(), "name", None) == "CANCELLED" and _HANGUP in str(details() or "")
    except Exception:  # noqa: BLE001 - an object that only looks like an RpcError
        return False


class _HangupFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and is_worker_hangup(record.exc_info[1]))


# Beam's words, as a WARNING, for every stop of a job server it started (Prism's, when this
# process exits: after the CLI has given descriptor 2 back to the terminal).
_SERVER_LOGGER = "apache_beam.utils.subprocess_server"
_ROUTINE_STOP = "Really destroying service at "


class _RoutineStopFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ROUTINE_STOP)


_quiet = threading.Lock()
_installed: list[bool] = []


def quiet_worker_hangups() -> None:
    """Keep the job-end hang-up of Flink's data channel off stderr (the CLI calls this once).

    When a job on Flink ends, the job server closes the data channel of the SDK worker that runs
    in this process; Beam's reader thread then logs "Failed to read inputs in the data plane" and
    re-raises, and Python prints the thread's traceback, after the results are complete. Exactly
    that exception, from that thread and that logger, is dropped; every other one is reported
    as before. So is Beam's "Really destroying service at ..." WARNING, which it logs for every
    routine stop of a job server it started (Prism's, at this process's exit, on the terminal
    after the CLI's log file is closed).
    """
    with _quiet:
        if _installed:
            return
        _installed.append(True)
        logging.getLogger(_DATA_PLANE_LOGGER).addFilter(_HangupFilter())
        logging.getLogger(_SERVER_LOGGER).addFilter(_RoutineStopFilter())
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            thread = args.thread
            if (
                thread is not None
                and thread.name == _READER_THREAD
                and is_worker_hangup(args.exc_value)
            ):
                return
            previous(args)

        threading.excepthook = hook

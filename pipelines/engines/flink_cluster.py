"""A Flink job server and a standalone Flink cluster from the jars ``make engines`` assembled.

Maven Central serves Beam's Flink runner module (``beam-runners-flink-<flink>``, which holds the
job server's main class ``FlinkJobServerDriver``) with all its dependencies, Flink's own runtime
among them, but not the shaded job server jar Beam publishes elsewhere. scripts/engines.sh copies
the runner and its dependencies into ``<assembled>/lib`` and calls :func:`write_launcher`, which
writes a jar holding only a manifest: ``Main-Class`` (the job server), ``Class-Path`` (the jars in
``lib/``, relative) and ``Add-Opens`` (the JDK packages Flink reflects into on Java 17). Beam's
``FlinkRunner`` starts it as ``java -jar <launcher>`` like the published jar.

The same jars hold Flink's cluster entry points, so :class:`FlinkCluster` starts a standalone
session cluster on this machine: one JobManager
(``org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint``) and one TaskManager
(``org.apache.flink.runtime.taskexecutor.TaskManagerRunner``), the two JVMs Flink's
``start-cluster.sh`` starts, each with a generated configuration directory. Jobs reach it through
``--flink_master=localhost:<rest port>``; the TaskManager has the Beam runner on its class path.

Every job the stock job server runs stages the 161 jars of ``lib/`` (152 MB) to the cluster, which
uploads them to its blob server and has the TaskManager download them: about 15 s of a 30 s job
on two cores. A cluster started here already runs on those jars, so ``make engines`` also compiles
``flink_job_server/PrestagedJobServer.java`` into ``lib/`` (:data:`PRESTAGED_JAR_PREFIX`) and the
launcher names it as its main class: with the JVM property ``runners.CLUSTER_HOLDS_JARS`` set (the
``flink`` and ``flink_cluster`` flags of runners.py set it) its jobs stage nothing; without, it is
Beam's job server unchanged, for a cluster that needs the jars.

``python -m pipelines.engines.flink_cluster start --slots 2`` runs a cluster in the foreground (Ctrl-C
stops it) and prints the flags that submit to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

from pipelines.engines.ports import free_port

__all__ = ["ADD_OPENS", "FlinkCluster", "free_port", "launcher_main", "write_launcher"]

JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"
# The job server that stages no jars to a cluster holding them (flink_job_server/) and the jar in
# lib/ that make engines compiles it into (runners.CLUSTER_HOLDS_JARS turns its staging off).
PRESTAGED_MAIN = "org.apache.beam.runners.flink.PrestagedJobServer"
PRESTAGED_JAR_PREFIX = "esa-prestaged-job-server-"
JOB_MANAGER_MAIN = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
TASK_MANAGER_MAIN = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
BASH_JAVA_UTILS = "org.apache.flink.runtime.util.bash.BashJavaUtils"
# The TaskManager's task heap and managed memory (MB: what a 3 GB TaskManager had by Flink's
# defaults), and the direct memory each task slot gets on top for its gRPC streams to SDK workers
# (Flink's task off-heap memory, 0 by default; the process's size follows): Beam's runner streams a
# bundle's elements to its SDK worker in messages of up to about 1 MB and asks whether the stream
# can take more only every 100 messages (DirectStreamObserver), so an SDK worker that reads more
# slowly than its task sends (a slow step, a loaded machine) leaves up to ~100 MB of direct buffers
# queued per slot, more where an element is larger than a message (a shuffle's batches of reports
# cross Flink between ReadReportFile and SpillBatch, whose side input starts a stage there).
# Without this they came out of the framework's own 128 MB: two slots' workers ran the TaskManager
# out of direct memory ("OutOfMemoryError: Direct buffer memory", then "call is closed") and the
# job failed, about one 2-slot shuffle of 1.9 M messages in six on 2 loaded cores, and every time
# with a step slower than its input (tests/engines/test_flink_memory.py).
TASK_HEAP_MB = 768
MANAGED_MB = 1024
GRPC_OFF_HEAP_MB_PER_SLOT = 256
# The JDK packages Flink and Beam's Flink runner reach into by reflection (Kryo, Flink's closure
# cleaner, Netty); Flink's own scripts pass the same openings on Java 17.
ADD_OPENS = (
    "java.base/java.io",
    "java.base/java.lang",
    "java.base/java.lang.reflect",
    "java.base/java.net",
    "java.base/java.nio",
    "java.base/java.text",
    "java.base/java.time",
    "java.base/java.util",
    "java.base/java.util.concurrent",
    "java.base/java.util.concurrent.atomic",
    "java.base/sun.nio.ch",
    "java.sql/java.sql",
)
_MANIFEST_WIDTH = 72  # bytes per manifest line; longer values continue on lines starting " "


def _manifest_line(name: str, value: str) -> str:
    line = f"{name}: {value}"
    pieces = [line[:_MANIFEST_WIDTH]]
    rest = line[_MANIFEST_WIDTH:]
    while rest:
        pieces.append(" " + rest[: _MANIFEST_WIDTH - 1])
        rest = rest[_MANIFEST_WIDTH - 1 :]
    return "\r\n".join(pieces)


def write_launcher(directory: str | Path, name: str) -> Path:
    """Write ``directory/name``: a jar whose manifest runs the job server over ``directory/lib``.

    Its main class is :data:`PRESTAGED_MAIN` when a ``lib/`` jar named :data:`PRESTAGED_JAR_PREFIX`
    holds it, else Beam's :data:`JOB_SERVER_MAIN`. Raises FileNotFoundError when ``lib/`` has no
    jar holding Beam's job server.
    """
    directory = Path(directory)
    jars = sorted(path.name for path in (directory / "lib").glob("*.jar"))
    if not any(_holds(directory / "lib" / jar, _class_entry(JOB_SERVER_MAIN))
               for jar in jars if "runners-flink" in jar):  # fmt: skip
        raise FileNotFoundError(f"no jar in {directory / 'lib'} holds {JOB_SERVER_MAIN}")
    prestaged = any(_holds(directory / "lib" / jar, _class_entry(PRESTAGED_MAIN))
                    for jar in jars if jar.startswith(PRESTAGED_JAR_PREFIX))  # fmt: skip
    manifest = "\r\n".join(
        [
            _manifest_line("Manifest-Version", "1.0"),
            _manifest_line("Main-Class", PRESTAGED_MAIN if prestaged else JOB_SERVER_MAIN),
            _manifest_line("Add-Opens", " ".join(ADD_OPENS)),
            _manifest_line("Class-Path", " ".join(f"lib/{jar}" for jar in jars)),
        ]
    )
    launcher = directory / name
    with zipfile.ZipFile(launcher, "w") as archive:
        archive.writestr("META-INF/MANIFEST.MF", manifest + "\r\n\r\n")
    return launcher


def launcher_main(launcher: str | Path) -> str | None:
    """The ``Main-Class`` a job server jar's manifest names (None when it names none)."""
    with zipfile.ZipFile(launcher) as archive:
        text = archive.read("META-INF/MANIFEST.MF").decode()
    attribute = text.replace("\r\n ", "").replace("\n ", "")  # join continuation lines
    for line in attribute.splitlines():
        if line.startswith("Main-Class:"):
            return line.split(":", 1)[1].strip()
    return None


def _class_entry(main: str) -> str:
    return main.replace(".", "/") + ".class"


def _holds(jar: Path, entry: str) -> bool:
    with zipfile.ZipFile(jar) as archive:
        return entry in archive.namelist()


def _jvm_options() -> list[str]:
    return [f"--add-opens={package}=ALL-UNNAMED" for package in ADD_OPENS]


class FlinkCluster:
    """A standalone Flink session cluster (one JobManager, one TaskManager) on this machine.

    ``lib`` is the directory of jars ``make engines`` assembled (Flink's runtime and Beam's Flink
    runner); ``slots`` the TaskManager's task slots; ``restart_attempts`` how many times a failed
    job region is restarted (Flink's fixed-delay restart strategy). Use as a context manager: entering starts both
    JVMs and waits until the TaskManager has registered its slots; leaving stops them and removes
    the configuration and logs unless ``keep_logs``. ``master`` is ``localhost:<rest port>``.
    """

    def __init__(self, lib: str | Path, slots: int = 2, rest_port: int | None = None,
                 startup_timeout_s: float = 90.0, restart_attempts: int = 3) -> None:  # fmt: skip
        self.lib = Path(lib)
        if not any(self.lib.glob("flink-runtime-*.jar")):
            raise FileNotFoundError(f"no Flink runtime jar in {self.lib}: run `make engines`")
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self.rest_port = rest_port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.restart_attempts = restart_attempts
        self.work: Path | None = None
        self.processes: list[subprocess.Popen] = []

    @property
    def master(self) -> str:
        return f"localhost:{self.rest_port}"

    def _configuration(self) -> str:
        grpc_off_heap_mb = GRPC_OFF_HEAP_MB_PER_SLOT * self.slots
        settings = {
            "jobmanager.rpc.address": "localhost",
            "jobmanager.rpc.port": free_port(),
            "jobmanager.bind-host": "localhost",
            "jobmanager.memory.process.size": "1024m",
            "rest.address": "localhost",
            "rest.bind-address": "localhost",
            "rest.port": self.rest_port,
            "taskmanager.host": "localhost",
            "taskmanager.bind-host": "localhost",
            "taskmanager.numberOfTaskSlots": self.slots,
            "taskmanager.memory.task.heap.size": f"{TASK_HEAP_MB}m",
            "taskmanager.memory.managed.size": f"{MANAGED_MB}m",
            "taskmanager.memory.task.off-heap.size": f"{grpc_off_heap_mb}m",
            # Network buffers for the slots' shuffles: Flink's default (a tenth of its memory, 64
            # MB at least) left 449 of the 512 buffers esa analyze needs with 2 slots, and 256 MB
            # later 509 (each of its groupings holds buffers per task and channel).
            "taskmanager.memory.network.min": "512m",
            "taskmanager.memory.network.max": "512m",
            "parallelism.default": 1,
            # A failed task is retried (the region it belongs to restarts), as on a production
            # cluster: outputs must come out exactly once all the same (tests/engines).
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": self.restart_attempts,
            "restart-strategy.fixed-delay.delay": "200 ms",
            "io.tmp.dirs": str(self.work / "tmp"),
        }
        return "".join(f"{key}: {value}\n" for key, value in settings.items())

    def _classpath(self) -> str:
        # logging/ holds an SLF4J binding (slf4j-simple) for the cluster's own logs; the job server
        # runs without one.
        return f"{self.lib}/*:{self.lib.parent / 'logging'}/*"

    def _resources(self, kind: str) -> tuple[list[str], list[str]]:
        """JVM options and dynamic properties for the JobManager or TaskManager (``kind`` "JM" or
        "TM"): what Flink's start scripts compute with BashJavaUtils from the configuration."""
        command = ["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", self._classpath(),
                   BASH_JAVA_UTILS, f"GET_{kind}_RESOURCE_PARAMS", "--configDir",
                   str(self.work / "conf")]  # fmt: skip
        output = subprocess.run(command, capture_output=True, text=True, check=False).stdout
        results = [line.split(":", 1)[1] for line in output.splitlines()
                   if line.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]  # fmt: skip
        if len(results) < 2:
            raise RuntimeError(f"Flink's BashJavaUtils gave no {kind} resources: {output[-500:]}")
        return results[-2].split(), results[-1].split()

    def _start(self, main: str, name: str, kind: str) -> subprocess.Popen:
        jvm, dynamic = self._resources(kind)
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        command = ["java", *jvm, *_jvm_options(), "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
                   "-cp", self._classpath(), main, "--configDir", str(self.work / "conf"),
                   *dynamic]  # fmt: skip
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        log.close()
        return process

    def overview(self) -> dict:
        """The cluster's REST ``/overview`` (task managers, slots, jobs)."""
        with urllib.request.urlopen(f"http://{self.master}/overview", timeout=2) as response:
            return json.load(response)

    def __enter__(self) -> FlinkCluster:
        self.work = Path(tempfile.mkdtemp(prefix="esa-flink-"))
        (self.work / "conf").mkdir()
        (self.work / "tmp").mkdir()
        (self.work / "conf" / "flink-conf.yaml").write_text(self._configuration())
        try:
            self.processes.append(self._start(JOB_MANAGER_MAIN, "jobmanager", "JM"))
            self.processes.append(self._start(TASK_MANAGER_MAIN, "taskmanager", "TM"))
            self._wait_for_slots()
        except BaseException:
            self.__exit__(None, None, None, keep_logs=True)
            raise
        return self

    def _wait_for_slots(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            for process, name in zip(self.processes, ("jobmanager", "taskmanager"), strict=True):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"Flink {name} exited with {process.returncode}: see {self.work}/{name}.log"
                    )
            with contextlib.suppress(OSError, ValueError):
                if self.overview().get("slots-total", 0) >= self.slots:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Flink cluster not ready after {self.startup_timeout_s:.0f} s: see {self.work}"
                )
            time.sleep(0.5)

    def __exit__(self, *exc_info, keep_logs: bool = False) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes = []
        if self.work is not None and not keep_logs:
            shutil.rmtree(self.work, ignore_errors=True)


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.engines.flink_cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    launcher = commands.add_parser("launcher", help="write the job server launcher jar")
    launcher.add_argument("directory")
    launcher.add_argument("name")
    start = commands.add_parser("start", help="run a standalone cluster until interrupted")
    start.add_argument("--slots", type=int, default=2)
    start.add_argument("--rest-port", type=int, default=8081)
    arguments = parser.parse_args(argv)
    if arguments.command == "launcher":
        try:
            write_launcher(arguments.directory, arguments.name)
        except (FileNotFoundError, zipfile.BadZipFile) as error:
            print(f"flink_cluster: {error}", file=sys.stderr)
            return 2
        return 0
    from pipelines.engines import runners

    lib = runners.flink_cluster_lib()
    if lib is None:
        print("flink_cluster: no assembled Flink jars: run `make engines`", file=sys.stderr)
        return 2
    # Ctrl-C or SIGTERM stop the cluster (a shell starts background jobs with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with FlinkCluster(lib, slots=arguments.slots, rest_port=arguments.rest_port) as cluster:
        print(f"Flink cluster up: {cluster.overview()['slots-total']} slots, {cluster.master}")
        print(
            "submit with: " + " ".join(runners.runner_flags("flink_cluster", master=cluster.master))
        )
        with contextlib.suppress(KeyboardInterrupt):
            while all(process.poll() is None for process in cluster.processes):
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(_main())

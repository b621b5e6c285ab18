"""The Flink job server launcher jar and the standalone cluster's checks (no JVM started here;
tests/engines/test_engines.py runs pipelines on both)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipelines.engines import runners
from pipelines.engines.flink_cluster import (
    ADD_OPENS,
    JOB_SERVER_MAIN,
    PRESTAGED_JAR_PREFIX,
    PRESTAGED_MAIN,
    FlinkCluster,
    _main,
    launcher_main,
    write_launcher,
)


def _jar(path: Path, *entries: str) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for entry in entries:
            archive.writestr(entry, b"\xca\xfe\xba\xbe")


def _manifest(jar: Path) -> dict[str, str]:
    with zipfile.ZipFile(jar) as archive:
        text = archive.read("META-INF/MANIFEST.MF").decode()
    assert text.endswith("\r\n\r\n")
    lines = text.split("\r\n")
    assert all(len(line.encode()) <= 72 for line in lines), "manifest lines are at most 72 bytes"
    attributes: dict[str, str] = {}
    name = None
    for line in lines:
        if line.startswith(" "):
            attributes[name] += line[1:]  # a continuation line
        elif line:
            name, value = line.split(": ", 1)
            attributes[name] = value
    return attributes


def test_launcher_names_main_class_every_jar_and_the_module_openings(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    main_entry = JOB_SERVER_MAIN.replace(".", "/") + ".class"
    _jar(lib / "beam-runners-flink-1.19-2.62.0.jar", main_entry)
    names = [
        f"dependency-with-a-rather-long-name-number-{index:03d}-1.0.jar" for index in range(40)
    ]
    for name in names:
        _jar(lib / name, "x/Y.class")
    launcher = write_launcher(tmp_path, "job-server.jar")
    attributes = _manifest(launcher)
    assert attributes["Main-Class"] == JOB_SERVER_MAIN
    assert sorted(attributes["Class-Path"].split()) == sorted(
        f"lib/{name}" for name in [*names, "beam-runners-flink-1.19-2.62.0.jar"]
    )
    assert attributes["Add-Opens"].split() == list(ADD_OPENS)
    assert launcher_main(launcher) == JOB_SERVER_MAIN


def test_launcher_runs_the_prestaged_job_server_only_from_its_own_jar(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    _jar(lib / "beam-runners-flink-1.19-2.62.0.jar", JOB_SERVER_MAIN.replace(".", "/") + ".class")
    prestaged_entry = PRESTAGED_MAIN.replace(".", "/") + ".class"
    _jar(lib / "some-dependency-1.0.jar", prestaged_entry)  # not make engines' jar: ignored
    assert launcher_main(write_launcher(tmp_path, "job-server.jar")) == JOB_SERVER_MAIN
    _jar(lib / f"{PRESTAGED_JAR_PREFIX}0123456789abcdef.jar", "x/Y.class")  # a jar without it
    assert launcher_main(write_launcher(tmp_path, "job-server.jar")) == JOB_SERVER_MAIN
    _jar(lib / f"{PRESTAGED_JAR_PREFIX}0123456789abcdef.jar", prestaged_entry)
    launcher = write_launcher(tmp_path, "job-server.jar")
    assert launcher_main(launcher) == PRESTAGED_MAIN
    assert f"lib/{PRESTAGED_JAR_PREFIX}0123456789abcdef.jar" in _manifest(launcher)["Class-Path"]


def test_launcher_refuses_a_lib_without_the_job_server(tmp_path, capsys):
    (tmp_path / "lib").mkdir()
    _jar(tmp_path / "lib" / "beam-runners-flink-1.19-2.62.0.jar", "org/other/Main.class")
    with pytest.raises(FileNotFoundError, match="FlinkJobServerDriver"):
        write_launcher(tmp_path, "job-server.jar")
    assert _main(["launcher", str(tmp_path), "job-server.jar"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cluster_refuses_a_lib_without_flink_and_zero_slots(tmp_path):
    with pytest.raises(FileNotFoundError, match="make engines"):
        FlinkCluster(tmp_path)
    _jar(tmp_path / "flink-runtime-1.19.0.jar", "x/Y.class")
    with pytest.raises(ValueError, match="at least 1"):
        FlinkCluster(tmp_path, slots=0)


def test_runner_flags_for_the_cluster_need_its_master(tmp_path, monkeypatch):
    monkeypatch.setenv("ESA_ENGINES_DIR", str(tmp_path))
    assembled = tmp_path / "flink" / "assembled-2.62.0-1.19"
    (assembled / "lib").mkdir(parents=True)
    jar = assembled / "beam-runners-flink-1.19-job-server-2.62.0.jar"
    jar.write_bytes(b"")
    assert runners.flink_job_server_jar() == jar
    assert runners.flink_cluster_lib() == assembled / "lib"
    flags = runners.runner_flags("flink_cluster", parallelism=2, master="localhost:8081")
    assert "--flink_master=localhost:8081" in flags and f"--flink_job_server_jar={jar}" in flags
    assert "--flink_master=[local]" in runners.runner_flags("flink")
    holds_jars = f"--job_server_jvm_properties=-D{runners.CLUSTER_HOLDS_JARS}=true"
    assert holds_jars in flags and holds_jars in runners.runner_flags("flink")
    with pytest.raises(ValueError, match="master"):
        runners.runner_flags("flink_cluster")

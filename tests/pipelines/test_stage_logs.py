"""Beam's logs go to a log file unless --verbose (pipelines/commandline/stage_logs.py): a child
process's stderr lands in the file, the terminal keeps stdout, an empty log is removed, a crash
names the log, a usage error does not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipelines.commandline.stage_logs import stage_logs

CHILD = [sys.executable, "-c", "import sys; print('worker chatter', file=sys.stderr)"]


def _run_child(tmp_path, monkeypatch, capfd, verbose):
    monkeypatch.setenv("ESA_LOG_DIR", str(tmp_path))
    with stage_logs("simulate", verbose) as path:
        subprocess.run(CHILD, check=True)
    return path, capfd.readouterr()


def test_a_workers_stderr_goes_to_the_log(tmp_path, monkeypatch, capfd):
    path, captured = _run_child(tmp_path, monkeypatch, capfd, verbose=False)
    assert "worker chatter" not in captured.err
    assert path.read_text() == "worker chatter\n"


def test_verbose_leaves_stderr_alone(tmp_path, monkeypatch, capfd):
    path, captured = _run_child(tmp_path, monkeypatch, capfd, verbose=True)
    assert path is None and "worker chatter" in captured.err
    assert list(tmp_path.iterdir()) == []


def test_an_empty_log_is_removed_and_a_crash_names_its_log(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ESA_LOG_DIR", str(tmp_path))
    with stage_logs("shuffle", False):
        pass
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), stage_logs("shuffle", False) as path:
        subprocess.run(CHILD, check=True)
        raise RuntimeError("boom")
    assert f"esa shuffle: Beam's log: {path}" in capfd.readouterr().err
    with pytest.raises(ValueError), stage_logs("shuffle", False, usage_errors=(ValueError,)):
        subprocess.run(CHILD, check=True)
        raise ValueError("bad flag")
    assert "Beam's log" not in capfd.readouterr().err

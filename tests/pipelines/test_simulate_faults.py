"""``esa simulate`` killed part-way (SIGKILL, in a subprocess) leaves nothing committed; a rerun
into the same output refuses with one line unless ``--overwrite``, and then recovers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas.release import commit as release

pytestmark = pytest.mark.slow

FLAGS = ["--runner=FnApiRunner", "--seed", "5", "--messages-per-shard", "200000"]


def _esa(*args: str) -> list[str]:
    # As the ``esa`` console script does (``python -m pipelines.commandline.main`` would load a second copy
    # of pipelines.commandline.main as __main__, whose UsageError the subcommands do not raise).
    entry = "import sys; from pipelines.commandline.main import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", entry, *args]


def _start_large(output: Path, *extra: str) -> subprocess.Popen:
    """A run of 200,000 respondents in its own process group, to be killed part-way."""
    return subprocess.Popen(
        _esa("simulate", "--output", str(output), "--respondents", "200000", *extra, *FLAGS),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _run_small(output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """A run of 300 respondents to its end, its output captured."""
    return subprocess.run(
        _esa("simulate", "--output", str(output), "--respondents", "300", *extra, *FLAGS),
        capture_output=True,
        text=True,
    )


def _kill_when(process: subprocess.Popen, ready, timeout: float = 120.0) -> bool:
    """SIGKILLs ``process`` (its own process group) once ``ready()``; False if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if ready():
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return True
        time.sleep(0.02)
    return False


def _staged_reports(parent: Path, name: str) -> bool:
    return any(parent.glob(f".{name}.tmp-*/instance=*/reports-*.avro"))


def _committed(output: Path) -> bool:
    return (output / release.COMMIT_FILE).exists()


@pytest.mark.parametrize("point", ["start-up", "writing reports"])
def test_killed_simulate_commits_nothing_and_overwrite_recovers(tmp_path, point):
    output = tmp_path / "sim"
    process = _start_large(output)
    started = time.monotonic()
    if point == "start-up":
        killed = _kill_when(process, lambda: time.monotonic() - started > 1.0)
    else:
        killed = _kill_when(process, lambda: _staged_reports(tmp_path, "sim"))
    assert killed, "the run ended before it could be killed"
    assert not _committed(output)
    with pytest.raises(release.ReleaseError):  # nothing a reader would accept
        release.verify_release(str(output))

    # A rerun recovers (with --overwrite when something is there) and cleans the stale staging.
    output.mkdir(exist_ok=True)
    (output / "partial.avro").write_bytes(b"left by a killed run")
    refused = _run_small(output)
    assert refused.returncode == 2
    # One error line (Beam's own import warning aside, issue #10 item 7), no traceback.
    [line] = [x for x in refused.stderr.splitlines() if x.startswith("esa simulate: error:")]
    assert "pass --overwrite" in line and "Traceback" not in refused.stderr
    recovered = _run_small(output, "--overwrite")
    assert recovered.returncode == 0, recovered.stderr
    verified = release.verify_release(str(output))
    assert verified.commit["format"] == release.REPORTS_FORMAT
    summary = json.loads((output / "simulation.json").read_text())
    assert verified.commit["records"] == summary["messages"] + summary["presence_messages"]
    assert not (output / "partial.avro").exists()
    assert not list(tmp_path.glob(".sim.tmp-*"))


def test_killed_overwrite_keeps_the_previous_committed_output(tmp_path):
    output = tmp_path / "sim"
    first = _run_small(output)
    assert first.returncode == 0, first.stderr
    before = release.verify_release(str(output)).commit
    process = _start_large(output, "--overwrite")
    assert _kill_when(process, lambda: _staged_reports(tmp_path, "sim"))
    assert release.verify_release(str(output)).commit == before


def test_output_appears_committed_or_not_at_all(tmp_path):
    """Killed the moment DIR appears (the rename of the staging directory), DIR is already
    committed: no window in which a complete-looking DIR lacks its commit record."""
    output = tmp_path / "sim"
    process = _start_large(output)
    _kill_when(process, output.exists)  # the run may end first: DIR must be committed then too
    assert output.exists()
    assert release.verify_release(str(output)).commit["format"] == release.REPORTS_FORMAT

"""A full disk during a stage (issue: hardening round 3, item 6): one line naming the path, exit
1, nothing committed and nothing left behind, so that the next run into the same place works.

The disk is a real one: a tmpfs of a few pages mounted for the test (root only; skipped where
mounting is not allowed), so ENOSPC comes from the kernel, in the driver or in a Beam worker.
"""

from __future__ import annotations

import io
import os
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from pipelines.commandline import main as cli
from schemas.release import commit
from tests.transforms import report_factory as rf

FNAPI = ["--runner=FnApiRunner"]


def _esa(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = cli.main(list(argv))
    return code, err.getvalue()


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 16 KiB tmpfs (four pages), unmounted afterwards."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    # Lazily: a failed worker may still hold a file of it open until it is collected.
    subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    recipe, fields = rf.write_recipe(root, "full_disk_test", min_crowd_size=5)
    (root / "reports").mkdir()
    rf.write_reports(root / "reports" / "a.avro", rf.crowd(200, 2, **fields))
    code, err = _esa(
        "shuffle", "--input", str(root / "reports" / "*.avro"), "--output",
        str(root / "release"), "--recipe", recipe, "--crowd-threshold", "10", "--instance", "0",
        *FNAPI,
    )  # fmt: skip
    assert code == 0, err
    return root, recipe


def _one_io_line(code: int, err: str, disk: Path) -> None:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "No space left on device" in lines[0] and str(disk) in lines[0], lines


def _left(disk: Path) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*"))


def test_a_full_disk_during_a_shuffle_is_one_line_and_leaves_nothing(reports, tiny_disk):
    root, recipe = reports
    (tiny_disk / "filler").write_bytes(os.urandom(4096))  # one page of the four left free
    argv = [
        "shuffle", "--input", str(root / "reports" / "*.avro"), "--output",
        str(tiny_disk / "release"), "--recipe", recipe, "--crowd-threshold", "10", *FNAPI,
    ]  # fmt: skip
    code, err = _esa(*argv)
    _one_io_line(code, err, tiny_disk)
    assert not (tiny_disk / "release" / commit.COMMIT_FILE).exists()
    assert _left(tiny_disk) == ["filler"]  # nothing that makes the next run refuse
    (tiny_disk / "filler").unlink()
    argv[4] = str(tiny_disk / "r")  # room for a release now? at least the same refusal-free path
    code, err = _esa(*argv)
    assert code in (0, 1) and "already holds" not in err and "partial" not in err, err


def test_a_full_disk_during_an_analysis_is_one_line_and_leaves_nothing(reports, tiny_disk):
    root, recipe = reports
    (tiny_disk / "filler").write_bytes(os.urandom(8192))
    code, err = _esa(
        "analyze", "--input", str(root / "release"), "--output", str(tiny_disk / "analysis"),
        "--recipe", recipe, *FNAPI,
    )  # fmt: skip
    _one_io_line(code, err, tiny_disk)
    left = [p for p in _left(tiny_disk) if p not in ("filler", "analysis")]
    assert left == [], left


def test_a_full_disk_during_a_simulation_is_one_line_and_leaves_nothing(tiny_disk):
    code, err = _esa(
        "simulate", "--output", str(tiny_disk / "simulation"), "--respondents", "2000",
        "--recipe", "image_grid_onehot", *FNAPI,
    )  # fmt: skip
    _one_io_line(code, err, tiny_disk)
    assert _left(tiny_disk) == []

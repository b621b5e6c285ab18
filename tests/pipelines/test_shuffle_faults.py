"""``esa shuffle`` killed with SIGKILL part-way: nothing a reader accepts is left, and a rerun with
``--overwrite`` recovers the release an uninterrupted run makes (no deletion: same counts)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import fastavro
import pytest

from schemas.release import commit as rel
from tests.pipelines import shuffled
from tests.transforms import report_factory as rf

ROOT = Path(__file__).resolve().parents[2]
FILES = 4
CROWDS = 6


def _inputs(tmp_path: Path) -> tuple[str, str]:
    recipe, fields = rf.write_recipe(tmp_path, "fault_test", min_crowd_size=5)
    (tmp_path / "reports").mkdir()
    for index in range(FILES):
        records = []
        for crowd in range(CROWDS):
            records += rf.crowd(
                40, 3, prefix=f"f{index}c{crowd}", crowd_id=f"c{crowd}", seed=index, **fields
            )
            records += [
                rf.report(f"f{index}c{crowd}-{r}", b"", crowd_id=f"c{crowd}", **fields)
                for r in range(40)
            ]
        rf.write_reports(tmp_path / "reports" / f"r{index:02d}.avro", records)
    return recipe, str(tmp_path / "reports" / "*.avro")


def _command(recipe: str, pattern: str, output: Path, *extra: str) -> list[str]:
    # The installed console script (``python -m pipelines.commandline.main`` would load the CLI module twice).
    return [
        str(Path(sys.executable).with_name("esa")),
        "shuffle",
        "--input",
        pattern,
        "--output",
        str(output),
        "--recipe",
        recipe,
        "--crowd-threshold",
        "10",
        "--messages-per-file",
        "8",
        "--batch-records",
        "200",
        *extra,
    ]


def _kill_when(command: list[str], ready) -> bool:
    """Start ``command`` and SIGKILL it as soon as ``ready()``; False if it finished first."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while process.poll() is None:
            if ready():
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                return True
            time.sleep(0.002)
        return False
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _released(output: Path) -> tuple[list, Counter]:
    verified = shuffled.verify(output)
    payloads: Counter = Counter()
    for path in verified.paths:
        if "/messages/" in path:
            with open(path, "rb") as handle:
                payloads.update((m["crowd_id"], m["payload"]) for m in fastavro.reader(handle))
    return shuffled.crowds(verified), payloads


def _spill_files(private: Path) -> list[Path]:
    return [path for path in (private / "spill").rglob("*") if path.is_file()]


def _message_files(output: Path) -> list[Path]:
    return list((output / "messages").glob("*.avro")) if (output / "messages").exists() else []


@pytest.mark.slow
def test_killed_shuffle_leaves_nothing_accepted_and_overwrite_recovers(tmp_path: Path) -> None:
    recipe, pattern = _inputs(tmp_path)
    # What an uninterrupted run releases without deletion: every data message, and per crowd
    # every respondent (each crowd has 40 distinct origins per file, each with presence + 3 data).
    expected_payloads = Counter(
        (f"c{crowd}", f"f{index}c{crowd}-{r}/{j}".encode())
        for index in range(FILES)
        for crowd in range(CROWDS)
        for r in range(40)
        for j in range(3)
    )

    def _check(directory: Path) -> None:
        crowds, payloads = _released(directory)
        assert payloads == expected_payloads
        assert sorted((c["crowd_id"], c["respondents_released"]) for c in crowds) == [
            (f"c{crowd}", FILES * 40) for crowd in range(CROWDS)
        ]

    output = tmp_path / "out"
    private = Path(f"{output}.private")
    points = {
        "after spill": lambda: len(_spill_files(private)) >= 3,
        "during message writing": lambda: len(_message_files(output)) >= 5,
    }
    killed = []
    for point, ready in points.items():
        for directory in (output, private):  # each kill starts from nothing
            shutil.rmtree(directory, ignore_errors=True)
        if not _kill_when(_command(recipe, pattern, output), ready):
            continue  # the run finished before reaching the point: nothing to check here
        killed.append(point)
        assert not (output / rel.COMMIT_FILE).exists(), point
        with pytest.raises(rel.ReleaseError):
            rel.verify_release(str(output))
        partial = output.exists() and any(output.iterdir())
        rerun = subprocess.run(
            _command(recipe, pattern, output), cwd=ROOT, capture_output=True, text=True
        )
        if partial:
            # A partial release is refused with one line that says what to do.
            assert rerun.returncode == 2 and "--overwrite" in rerun.stderr, point
            assert "already holds" in rerun.stderr or "uncommitted" in rerun.stderr, point
        else:
            # Killed before any release file: only the spill was left, and it is cleaned.
            assert rerun.returncode == 0, point
            _check(output)
            assert not (private / "spill").exists(), point
            continue
        assert not _spill_files(private), point
        recovered = subprocess.run(
            _command(recipe, pattern, output, "--overwrite"), cwd=ROOT, capture_output=True
        )
        assert recovered.returncode == 0, point
        _check(output)
        assert not (private / "spill").exists(), point
    assert killed, "no kill point was reached before the runs finished"

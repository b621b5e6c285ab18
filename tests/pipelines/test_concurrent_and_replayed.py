"""Concurrent writers and replayed releases (issue: hardening round 3, items 2 and 10).

* Every command that writes an output holds an exclusive lock on it (and a shuffle on its
  private folder): a second run into it stops before any work, one line, exit 2.
* A shuffle's run id is in every index entry and in its commit record, which lists only its own
  run's files.
* ``esa analyze --runs-ledger`` refuses a release it accepted before (a replay) and one older
  than the last it accepted of that instance.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from pipelines import shuffle as shuffle_pipeline
from pipelines.commandline import main as cli
from pipelines.commandline.output_lock import lock_path, output_locks
from schemas.release import commit as rel
from tests.transforms import report_factory as rf

FNAPI = ["--runner=FnApiRunner"]


def _esa(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = cli.main(list(argv))
    return code, err.getvalue()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Reports of one crowd (30 respondents x 2 messages) shuffled twice, an older and a newer
    release of instance 0."""
    root = tmp_path_factory.mktemp("replayed")
    recipe, fields = rf.write_recipe(root, "replayed_test", min_crowd_size=5)
    (root / "reports").mkdir()
    rf.write_reports(root / "reports" / "a.avro", rf.crowd(30, 2, **fields))
    for name in ("old", "new"):
        code, err = _esa(
            "shuffle", "--input", str(root / "reports" / "*.avro"), "--instance", "0",
            "--output", str(root / name), "--recipe", recipe, "--crowd-threshold", "10", *FNAPI,
        )  # fmt: skip
        assert code == 0, err
        time.sleep(0.01)  # the newer run commits later
    return root, recipe


def _shuffle_argv(root: Path, recipe: str, output: Path) -> list[str]:
    return [
        "shuffle", "--input", str(root / "reports" / "*.avro"), "--instance", "0",
        "--output", str(output), "--recipe", recipe, "--crowd-threshold", "10", *FNAPI,
    ]  # fmt: skip


@pytest.mark.parametrize("held", ["--output", "--private-output"])
def test_a_second_shuffle_into_a_locked_output_stops_before_any_work(world, tmp_path, held):
    root, recipe = world
    output = tmp_path / "release"
    locked = output if held == "--output" else tmp_path / "release.private"
    with output_locks("shuffle", [(held, str(locked))]):  # another run holds it
        code, err = _esa(*_shuffle_argv(root, recipe, output))
    assert code == 2 and err.count("\n") == 1, err
    assert "in use by another esa run" in err and held in err
    assert not output.exists() and not (tmp_path / "release.private").exists()
    code, err = _esa(*_shuffle_argv(root, recipe, output))  # released when its holder ends
    assert code == 0, err


def test_an_analysis_into_a_locked_output_stops_before_any_work(world, tmp_path):
    root, recipe = world
    output = tmp_path / "analysis"
    with output_locks("analyze", [("--output", str(output))]):
        code, err = _esa("analyze", "--input", str(root / "new"), "--output", str(output),
                         "--recipe", recipe, "--no-pictures", *FNAPI)  # fmt: skip
    assert code == 2 and "in use by another esa run" in err and not output.exists()


def test_the_commit_names_its_run_and_lists_only_that_runs_files(world, tmp_path):
    root, recipe = world
    record = json.loads((root / "new" / rel.COMMIT_FILE).read_text())
    run = record["run"]
    assert len(run["id"]) == 32 and run["windows"][0] < run["windows"][1]
    other = json.loads((root / "old" / rel.COMMIT_FILE).read_text())["run"]
    assert other["id"] != run["id"] and other["committed_at_ms"] <= run["committed_at_ms"]
    private = root / "new.private"
    entries = sorted((private / "index").glob("*.json"))
    assert entries and all(json.loads(p.read_text())["run_id"] == run["id"] for p in entries)
    # A file of another run in the release and its index: the commit refuses to list it.
    copy, copy_private = tmp_path / "rel", tmp_path / "rel.private"
    shutil.copytree(root / "new", copy)
    shutil.copytree(private, copy_private)
    (copy / rel.COMMIT_FILE).unlink()
    [message] = sorted((copy / "messages").glob("*.avro"))
    stray = message.with_name(message.name.replace("-g", "-g9"))
    shutil.copy(message, stray)
    entry = json.loads(sorted((copy_private / "index").glob("messages-*.json"))[0].read_text())
    entry.update(path=f"messages/{stray.name}", run_id="0" * 32)
    (copy_private / "index" / f"messages-{stray.stem}.json").write_text(json.dumps(entry))
    options = shuffle_pipeline.ShuffleOptions(
        ["--input", "x", "--output", str(copy), "--recipe", recipe, "--instance", "0"]
    )
    config = shuffle_pipeline.shuffle_config(options, streaming=False)
    with pytest.raises(RuntimeError, match="another run"):
        shuffle_pipeline.commit_release(str(copy), str(copy_private), config, "1d", None, run["id"])
    assert not (copy / rel.COMMIT_FILE).exists()


def test_the_runs_ledger_refuses_a_replayed_or_older_release(world, tmp_path):
    root, recipe = world
    ledger = tmp_path / "state" / "runs.json"

    def analyze(release: str, name: str) -> tuple[int, str]:
        return _esa(
            "analyze", "--input", str(root / release), "--output", str(tmp_path / name),
            "--recipe", recipe, "--no-pictures", "--runs-ledger", str(ledger), *FNAPI,
        )  # fmt: skip

    code, err = analyze("new", "a1")
    assert code == 0, err
    state = json.loads(ledger.read_text())
    new_run = json.loads((root / "new" / rel.COMMIT_FILE).read_text())["run"]["id"]
    assert state["instances"]["0"]["run_id"] == new_run and state["accepted"] == [new_run]
    summary = json.loads((tmp_path / "a1" / "summary.json").read_text())
    assert summary["inputs"]["replays"].startswith("checked against")
    for release, words in (("new", "a replay"), ("old", "an older release")):
        code, err = analyze(release, f"again-{release}")
        assert code == 2 and err.count("\n") == 1 and words in err, err
        assert not (tmp_path / f"again-{release}").exists()
    assert json.loads(ledger.read_text()) == state  # refused runs change nothing
    # A release from before run ids cannot be checked: refused when a ledger is kept.
    legacy = tmp_path / "legacy"
    shutil.copytree(root / "old", legacy)
    record = json.loads((legacy / rel.COMMIT_FILE).read_text())
    del record["run"]
    (legacy / rel.COMMIT_FILE).write_text(json.dumps(record))
    code, err = _esa("analyze", "--input", str(legacy), "--output", str(tmp_path / "l"),
                     "--recipe", recipe, "--runs-ledger", str(ledger), *FNAPI)  # fmt: skip
    assert code == 2 and "states no run id" in err


def test_two_concurrent_shuffles_into_one_output_one_refused_one_committed(world, tmp_path):
    """Two real processes: the second, started while the first holds the output, stops in one
    line (exit 2); the first commits a release listing only its own run's files."""
    root, recipe = world
    output = tmp_path / "release"
    argv = _shuffle_argv(root, recipe, output)
    first = subprocess.Popen(
        [str(Path(sys.executable).with_name("esa")), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = Path(lock_path(str(output)))
        deadline = time.monotonic() + 120
        while not (lock.exists() and f"\n{first.pid}\n" in lock.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, "never took the lock"
            time.sleep(0.01)
        code, err = _esa(*argv)
        assert first.poll() is None, "the first run ended before the second tried"
        assert code == 2 and err.count("\n") == 1 and "in use by another esa run" in err, err
    finally:
        _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err
    record = json.loads((output / rel.COMMIT_FILE).read_text())
    private = tmp_path / "release.private"
    entries = [json.loads(p.read_text()) for p in (private / "index").glob("*.json")]
    assert {entry["run_id"] for entry in entries} == {record["run"]["id"]}
    assert sorted(entry["path"] for entry in entries) == sorted(f["path"] for f in record["files"])

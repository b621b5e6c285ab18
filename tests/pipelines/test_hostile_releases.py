"""Hostile release directories handed to ``esa analyze`` (issue #11: transactional releases, the
analyzer handed only what it may see, edges refused). One esa-release/2 release is built
(tests/release_fixtures.py: real Avro message files, crowd tables and commit record); each case
copies it, damages it in one way and expects one error line, exit 2. A crowd table edited and
re-committed (SHA-256 matching) tests the table's content checks, not its digest."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.commandline import main as cli
from schemas.release import commit as rel
from schemas.release.crowd_tables import read_crowd_table
from tests import release_fixtures as fx
from tests.transforms import report_factory as rf

Mutation = Callable[[Path], None]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A committed release of one crowd of 30 respondents x 2 messages and a withheld crowd
    (and the reports directory beside it)."""
    root = tmp_path_factory.mktemp("hostile")
    recipe, fields = rf.write_recipe(root, "hostile_test", min_crowd_size=5)
    (root / "reports").mkdir()
    rf.write_reports(root / "reports" / "a.avro", rf.crowd(30, 2, **fields))
    crowds = [
        fx.crowd(None, 30, start=rf.T0, **fields),
        fx.crowd("few", None, start=rf.T0, **fields),
    ]
    payloads = [f"device-{i // 2}/{i % 2}".encode() for i in range(60)]
    parameters = {"crowd_threshold": 10}
    fx.write_release(root / "rel", crowds, [payloads, []], parameters=parameters, groups=2)
    return root / "rel", recipe


def _edit(change: Callable[[dict], None]) -> Mutation:
    def mutate(directory: Path) -> None:
        path = directory / rel.COMMIT_FILE
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    return mutate


def _table(directory: Path, status: str = "released") -> Path:
    """The crowd table holding the crowd of that status."""
    for path in sorted((directory / "crowds").iterdir()):
        if read_crowd_table(str(path))[0]["status"] == status:
            return path
    raise AssertionError(status)


def _crowd(key: str, value: object, status: str = "released") -> Mutation:
    """Set a field of a crowd in its table and re-commit the table (its SHA-256 matches)."""

    def mutate(directory: Path) -> None:
        table = _table(directory, status)
        rows = read_crowd_table(str(table))
        rows[0][key] = value
        fx.write_avro(table, "released_crowd", fx.table_rows(rows))
        fx.recommit(directory)

    return mutate


def _move_table(directory: Path) -> None:
    """The released crowd's table and message files renamed to another bucket's stem."""
    table = _table(directory)
    stem = table.name.removesuffix(".avro")
    bucket = int(stem.rsplit("-b", 1)[1])
    wrong = next(
        name
        for step in range(1, 16)
        if not (
            directory / "crowds" / f"{(name := f'{stem[:-7]}-b{(bucket + step) % 16:05d}')}.avro"
        ).exists()
    )  # an unused bucket of the window
    for path in [*(directory / "messages").iterdir(), table]:
        path.rename(path.with_name(path.name.replace(stem, wrong)))
    fx.recommit(directory)


def _drop_table(directory: Path) -> None:
    _table(directory).unlink()
    fx.recommit(directory, lambda r: r.update(crowds_released=0))


def _edit_table(directory: Path) -> None:
    table = _table(directory)
    rows = read_crowd_table(str(table))
    rows[0]["respondents_released"] = 60  # n doubled, not re-committed
    fx.write_avro(table, "released_crowd", fx.table_rows(rows))


def _parameter(key: str, value: object) -> Mutation:
    return _edit(lambda record: record["parameters"].__setitem__(key, value))


def _message_file(directory: Path) -> Path:
    return next((directory / "messages").iterdir())


def _write_commit(text: str) -> Mutation:
    return lambda directory: (directory / rel.COMMIT_FILE).write_text(text)


CASES: list[tuple[str, Mutation, str]] = [
    ("deeply nested commit", _write_commit("[" * 100_000 + "]" * 100_000), "unreadable commit"),
    ("commit is a list", _write_commit("[1, 2]"), "not a commit record"),
    ("commit truncated", _write_commit('{"format": "esa-rel'), "unreadable commit"),
    ("instance 2^70", _edit(lambda r: r.__setitem__("instance", 2**70)), "instance"),
    ("threshold 0", _parameter("crowd_threshold", 0), "crowd_threshold"),
    ("threshold a string", _parameter("crowd_threshold", "100"), "crowd_threshold"),
    ("threshold 2^63", _parameter("crowd_threshold", 2**63), "crowd_threshold"),
    ("window_ms 0", _parameter("window_ms", 0), "window_ms"),
    ("n = 10^15", _crowd("respondents_released", 10**15), "respondents_released"),
    ("n below the threshold", _crowd("respondents_released", 3), "below the crowd_threshold"),
    ("n negative", _crowd("respondents_released", -1), "respondents_released"),
    ("total n NaN", _edit(lambda r: r.update(respondents_released=float("nan"))), "respondents"),
    ("total n true", _edit(lambda r: r.update(respondents_released=True)), "respondents"),
    ("total n doubled", _edit(lambda r: r.update(respondents_released=60)), "sum to 30"),
    ("withheld with n", _crowd("respondents_released", 12, "withheld"), "withheld but states"),
    ("crowd relabelled", _crowd("crowd_id", "other"), "bucket"),
    ("crowd of another window", _crowd("window_start_ms", rf.T0 - 86_400_000), "window_start"),
    ("crowd of another instance", _crowd("instance", 1), "has instance 1"),
    ("crowd moved to another bucket", _move_table, "belongs in bucket"),
    ("crowd table edited", _edit_table, "SHA-256"),
    ("crowd table removed", _drop_table, "has no crowd table"),
    ("crowd table missing", lambda d: _table(d).unlink(), "missing"),
    ("messages_released off", _crowd("messages_released", 59), "hold 60 records"),
    ("older format", _edit(lambda r: r.update(format="esa-release/1")), "shuffle again"),
    ("a crowds list", _edit(lambda r: r.update(crowds=[])), "lists no crowds"),
    ("crowd_buckets 0", _parameter("crowd_buckets", 0), "crowd_buckets"),
    ("path with ..", _edit(lambda r: r["files"][0].__setitem__("path", "../x.avro")), "relative"),
    ("absolute path", _edit(lambda r: r["files"][0].__setitem__("path", "/etc/hosts")), "relative"),
    (
        "copied file",
        lambda d: shutil.copy(_message_file(d), d / "messages" / "copy.avro"),
        "not listed",
    ),
    (
        "truncated file",
        lambda d: _message_file(d).write_bytes(_message_file(d).read_bytes()[:-9]),
        "bytes",
    ),
    ("zero-byte file", lambda d: _message_file(d).write_bytes(b""), "bytes"),
    ("dead letters inside", lambda d: (d / "dead_letter").mkdir(), "shuffler-private"),
    ("no commit", lambda d: (d / rel.COMMIT_FILE).unlink(), "uncommitted"),
]


@pytest.mark.parametrize(("mutate", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_release_is_refused_in_one_line(
    made: tuple[Path, str], tmp_path: Path, capsys, mutate: Mutation, words: str
) -> None:
    release_dir, recipe = made
    copy = tmp_path / "rel"
    shutil.copytree(release_dir, copy)
    mutate(copy)
    argv = ["analyze", "--input", str(copy), "--output", str(tmp_path / "an"), "--recipe", recipe]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("esa analyze: error:") and words in err[0], err


def test_the_undamaged_release_is_analyzed(made: tuple[Path, str], tmp_path: Path) -> None:
    release_dir, recipe = made
    argv = ["analyze", "--input", str(release_dir), "--output", str(tmp_path / "an"), "--recipe"]
    assert cli.main([*argv, recipe]) == 0
    summary = json.loads((tmp_path / "an" / "summary.json").read_text())

    def records(name: str) -> list[dict]:
        return [
            json.loads(line)
            for part in sorted((tmp_path / "an" / name).glob("part-*"))
            for line in part.read_text().splitlines()
        ]

    # The test payloads are not one-hot codes, so all 60 messages are dead-lettered with a
    # reason and the counters add up; a crowd none of whose messages counted is withheld with
    # that reason, never estimated from its n alone (issue: hardening round 3, item 3).
    assert summary["metrics"]["read"] == summary["metrics"]["dead_lettered"] == 60
    assert summary["metrics"]["adds_up"]
    assert records("reports.jsonl") == []
    assert pq.read_table(tmp_path / "an" / "histograms.parquet").num_rows == 0
    notes = records("withheld.jsonl")
    [rejected] = [note for note in notes if note.get("rejected")]
    assert sum(rejected["rejected"].values()) == 60 and rejected["released_by"] == [0]
    assert "all 60 messages of this crowd were rejected" in rejected["note"]


def test_a_renamed_copy_of_a_release_is_read_and_refused_not_skipped(
    made: tuple[Path, str], tmp_path: Path, capsys
) -> None:
    release_dir, recipe = made
    shutil.copytree(release_dir, tmp_path / "root" / "instance=0")
    shutil.copytree(release_dir, tmp_path / "root" / "backup")
    argv = ["analyze", "--input", str(tmp_path / "root"), "--output", str(tmp_path / "an")]
    assert cli.main([*argv, "--recipe", recipe]) == 2
    assert "instance 0 released twice" in capsys.readouterr().err


@pytest.mark.parametrize("inside", ["rel/an", "rel/messages/an", "."])
def test_analysis_output_may_not_be_inside_or_around_a_release(
    made: tuple[Path, str], tmp_path: Path, capsys, inside: str
) -> None:
    release_dir, recipe = made
    copy = tmp_path / "rel"
    shutil.copytree(release_dir, copy)
    argv = ["analyze", "--input", str(copy), "--output", str(tmp_path / inside), "--recipe", recipe]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must not be inside" in err[0]
    assert rel.verify_release(str(copy)).records == 60  # the release is untouched


def test_shuffle_output_may_not_be_inside_or_around_its_input(
    made: tuple[Path, str], tmp_path: Path, capsys
) -> None:
    release_dir, recipe = made
    reports = release_dir.parent / "reports"
    for output in (reports / "out", reports.parent):
        argv = ["shuffle", "--input", f"{reports}/*.avro", "--output", str(output)]
        assert cli.main([*argv, "--recipe", recipe]) == 2
        assert "must not be inside" in capsys.readouterr().err


# -- Non-regular files (issue: hardening round 3, item 4) -------------------------------------
# A FIFO where a stage expects a file would block its reader forever in open(): each case runs
# the command in a thread with a deadline, and unblocks a reader stuck in open() (by opening the
# FIFO's other end) before failing.


def _without_hanging(argv: list[str], fifo: Path, capsys) -> tuple[int, str]:
    result: dict[str, int] = {}

    def command() -> None:
        result["code"] = cli.main(argv)

    thread = threading.Thread(target=command, daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # release the stuck reader
        os.close(descriptor)
        thread.join(timeout=30)
        pytest.fail(f"{argv[0]} blocked on the FIFO {fifo}")
    return result["code"], capsys.readouterr().err


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "case",
    ["shuffle_input", "recipe", "key_ring", "shuffler_keys", "public_key", "truth", "commit"],
)
def test_a_fifo_where_a_file_is_expected_is_refused_without_opening_it(
    made: tuple[Path, str], tmp_path: Path, capsys, case: str
) -> None:
    release_dir, recipe = made
    copy = tmp_path / "rel"
    shutil.copytree(release_dir, copy)
    out = str(tmp_path / "out")
    analyze = ["analyze", "--input", str(copy), "--output", out, "--recipe", recipe]
    if case == "shuffle_input":
        reports = tmp_path / "reports"
        shutil.copytree(release_dir.parent / "reports", reports)
        fifo = _fifo(reports / "b.avro")
        argv = ["shuffle", "--input", f"{reports}/*.avro", "--output", out, "--recipe", recipe]
    elif case == "recipe":
        fifo = _fifo(tmp_path / "recipe.json")
        argv = ["shuffle", "--input", f"{release_dir.parent}/reports/*.avro", "--output", out]
        argv += ["--recipe", str(fifo)]
    elif case == "key_ring":
        fifo = _fifo(tmp_path / "ring" / f"{'0' * 16}.private.json")
        argv = [*analyze, "--key-ring", str(fifo.parent)]
    elif case == "shuffler_keys":
        fifo = _fifo(tmp_path / "signers" / "trusted_shufflers.json")
        argv = [*analyze, "--shuffler-keys", str(fifo.parent)]
    elif case == "public_key":
        fifo = _fifo(tmp_path / "analyzer.public.json")
        argv = ["simulate", "--output", out, "--respondents", "10", "--public-key", str(fifo)]
    elif case == "truth":
        fifo = _fifo(tmp_path / "truth.parquet")
        argv = [*analyze, "--truth", str(fifo), "--truth-recipe", "x@1"]
    else:
        (copy / rel.COMMIT_FILE).unlink()
        fifo = _fifo(copy / rel.COMMIT_FILE)
        argv = analyze
    code, err = _without_hanging(argv, fifo, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert (
        ("FIFO" in lines[0] or "uncommitted" in lines[0])
        and str(fifo.name) in lines[0]
        or (case == "commit" and "uncommitted" in lines[0])
    ), lines


def test_reading_a_fifo_as_avro_is_one_unreadable_chunk(tmp_path: Path) -> None:
    from transforms.common import avro_io

    fifo = _fifo(tmp_path / "r.avro")
    [chunk] = list(avro_io.read_avro_batches(str(fifo)))
    assert isinstance(chunk, avro_io.UnreadableChunk) and "FIFO" in chunk.detail

"""Hostile release directories handed to ``esa analyze`` (issue #11: transactional releases, the
analyzer handed only what it may see, edges refused). One esa-release/2 release is built
(tests/release_fixtures.py: real Avro message files, crowd tables and commit record); each case
copies it, damages it in one way and expects one error line, exit 2. A crowd table edited and
re-committed (SHA-256 matching) tests the table's content checks, not its digest."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

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
    [histogram] = [
        json.loads(line)
        for part in sorted((tmp_path / "an" / "reports.jsonl").glob("part-*"))
        for line in part.read_text().splitlines()
    ]
    # n is the commit's 30 (K = 4: n_eff = 30/4); the test payloads are not one-hot codes, so
    # all 60 messages are dead-lettered with a reason, and the counters add up.
    assert histogram["respondents_by_instance"] == {"0": 30}
    assert summary["metrics"]["read"] == summary["metrics"]["dead_lettered"] == 60
    assert summary["metrics"]["adds_up"]


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

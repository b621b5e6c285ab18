"""Signed commit records end to end (issue: the analyzer's n comes from unauthenticated commit
records). One small ``esa run`` makes two signed releases; each case copies them, changes them as
someone who can write the release storage but holds no shuffler key would, and expects
``esa analyze --shuffler-keys`` to refuse in one line (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.commandline import main as cli
from schemas.crypto import commit_signing as cs
from schemas.crypto import signing_keys as sk
from schemas.release import commit as rel
from schemas.release.crowd_tables import read_crowd_table
from tests import release_fixtures as fx
from tests.pipelines.test_run import _recipe

FNAPI = "--runner=FnApiRunner"
Mutation = Callable[[Path], None]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``esa run`` of 2,000 respondents over two instances (unsealed, to stay quick)."""
    root = tmp_path_factory.mktemp("signed")
    recipe = _recipe(
        root, "signed-grid", "one_hot_rappor", {"domain_size": 64, "epsilon": 4.0},
        shuffler_instances=2,
    )  # fmt: skip
    argv = ["run", "--output", str(root / "results"), "--recipe", recipe, "--population"]
    argv += ["image:gradient", "--respondents", "2000", "--seed", "5", "--unsealed"]
    assert cli.main([*argv, "--parallel-shuffles", "1", FNAPI]) == 0
    return root / "results"


def _analyze(shuffled: Path, output: Path, keys: Path | None) -> int:
    argv = ["analyze", "--input", str(shuffled), "--output", str(output), FNAPI, "--no-pictures"]
    argv += ["--recipe", str(shuffled.parent / "recipe.json")]
    return cli.main(argv + (["--shuffler-keys", str(keys)] if keys else []))


def _commit(shuffled: Path, instance: int) -> Path:
    return shuffled / f"instance={instance}" / rel.COMMIT_FILE


def _edit(instance: int, change: Callable[[dict], None]) -> Mutation:
    def mutate(shuffled: Path) -> None:
        path = _commit(shuffled, instance)
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record, indent=1, sort_keys=True))

    return mutate


def _inflate_tables(release: Path) -> None:
    """Every released crowd's n ten times in its crowd table, re-committed with consistent
    totals (the signature block kept, now over another record)."""
    for table in (release / "crowds").iterdir():
        rows = read_crowd_table(str(table))
        for crowd in rows:
            if crowd["status"] == "released":
                crowd["respondents_released"] *= 10
        fx.write_avro(table, "released_crowd", fx.table_rows(rows))
    signature = json.loads((release / rel.COMMIT_FILE).read_text())["signature"]
    fx.recommit(release, lambda record: record.update(signature=signature), totals=True)


def _inflate(shuffled: Path) -> None:
    _inflate_tables(shuffled / "instance=0")


def _edit_table(shuffled: Path) -> None:
    table = next((shuffled / "instance=0" / "crowds").iterdir())
    rows = read_crowd_table(str(table))
    rows[0]["messages_released"] += 1
    fx.write_avro(table, "released_crowd", fx.table_rows(rows))


def _signature(value: object) -> Mutation:
    return _edit(0, lambda record: record.__setitem__("signature", value))


def _resign_with_attackers_key(shuffled: Path) -> None:
    attacker = sk.generate_signing_key(0)
    _inflate_tables(shuffled / "instance=0")
    fx.recommit(shuffled / "instance=0", signing_key=attacker)


def _swap_in_instance_1(shuffled: Path) -> None:
    shutil.copy(_commit(shuffled, 1), _commit(shuffled, 0))


def _swap_in_instance_1_as_0(shuffled: Path) -> None:
    _swap_in_instance_1(shuffled)
    _edit(0, lambda record: record.__setitem__("instance", 0))(shuffled)


def _garble(record: dict) -> None:
    record["signature"]["value"] = "x" * 128


CASES: list[tuple[str, Mutation, str]] = [
    ("n inflated, messages untouched", _inflate, "altered after signing"),
    ("n table edited, not re-committed", _edit_table, "SHA-256"),
    ("total n inflated", _edit(0, lambda r: r.update(respondents_released=1)), "altered after"),
    ("instance 1's commit in instance 0's release", _swap_in_instance_1, "instance=0"),
    ("instance 1's commit relabelled 0", _swap_in_instance_1_as_0, "states instance 0"),
    ("re-signed with an attacker's key", _resign_with_attackers_key, "not among"),
    ("signature removed", _edit(0, lambda r: r.pop("signature")), "not signed"),
    ("signature garbled", _edit(0, _garble), "signature value"),
    ("signature huge", _signature({"value": "ab" * 4_000_000}), "not an object of exactly"),
    ("signature a string", _signature("ab" * 4_000_000), "not an object"),
]


@pytest.mark.parametrize(("mutate", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_altered_commit_is_refused_in_one_line(
    made: Path, tmp_path: Path, capsys, mutate: Mutation, words: str
) -> None:
    shuffled = tmp_path / "shuffled"
    shutil.copytree(made / "releases", shuffled)
    shutil.copy(made / "recipe.json", tmp_path / "recipe.json")
    mutate(shuffled)
    assert _analyze(shuffled, tmp_path / "an", made / "shuffler_keys") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("esa analyze: error: refusing release"), err
    assert words in err[0] and len(err[0]) < 400, err[0]
    assert not (tmp_path / "an" / "summary.json").exists()


def test_the_default_run_is_signed_and_authenticated(made: Path) -> None:
    summary = json.loads((made / "analysis" / "summary.json").read_text())
    assert summary["inputs"]["commit_records"].startswith("authenticated: Ed25519")
    keys = sk.load_shuffler_keys(made / "shuffler_keys")
    for instance in (0, 1):
        commit = json.loads(_commit(made / "releases", instance).read_text())
        assert cs.verify_commit(commit, keys).instance == instance
    for private in (made / "shuffler_keys").glob("*.private.json"):
        assert os.stat(private).st_mode & 0o777 == 0o600


def test_signatures_change_no_result(made: Path, tmp_path: Path) -> None:
    """The signed releases analyzed with the keys, and the same releases stripped of their
    signatures analyzed without: the same tables, and the second summary says it plainly."""
    unsigned = tmp_path / "unsigned"
    shutil.copytree(made / "releases", unsigned)
    shutil.copy(made / "recipe.json", tmp_path / "recipe.json")
    for instance in (0, 1):
        _edit(instance, lambda r: r.pop("signature"))(unsigned)
    assert _analyze(made / "releases", tmp_path / "signed-an", made / "shuffler_keys") == 0
    assert _analyze(unsigned, tmp_path / "unsigned-an", None) == 0
    for table in ("histograms.parquet", "longitudinal.parquet"):
        signed = pq.read_table(tmp_path / "signed-an" / table)
        assert signed.equals(pq.read_table(tmp_path / "unsigned-an" / table)), table
    assert pq.read_table(tmp_path / "signed-an" / "histograms.parquet").num_rows == 64
    summary = json.loads((tmp_path / "unsigned-an" / "summary.json").read_text())
    assert summary["inputs"]["commit_records"].startswith("NOT authenticated")


def _one_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"esa {command}: error:"), err
    return err[0]


def test_shuffle_signs_only_with_its_own_instances_key(made: Path, tmp_path: Path, capsys) -> None:
    keys = sk.load_shuffler_keys(made / "shuffler_keys")
    private = {key.instance: made / "shuffler_keys" / f"{key.key_id}.private.json" for key in keys}
    reports = str(made / "simulation" / "instance=1" / "*.avro")
    argv = ["shuffle", "--input", reports, "--output", str(tmp_path / "rel"), FNAPI]
    argv += ["--recipe", str(made / "recipe.json")]
    assert cli.main([*argv, "--signing-key", str(private[0]), "--instance", "1"]) == 2
    assert "instance 0's" in _one_error(capsys, "shuffle")
    assert cli.main([*argv, "--signing-key", str(private[1])]) == 2
    assert "give --instance 1" in _one_error(capsys, "shuffle")
    public = private[1].with_name(private[1].name.replace("private", "public"))
    assert cli.main([*argv, "--signing-key", str(public), "--instance", "1"]) == 2
    assert "not a private key" in _one_error(capsys, "shuffle")
    expired = ["keys", "generate", "--output", str(tmp_path / "old"), "--shuffler-instance", "1"]
    assert cli.main([*expired, "--valid-from", "2020-01-01", "--valid-until", "2021-01-01"]) == 0
    [old] = (tmp_path / "old").glob("*.private.json")
    assert cli.main([*argv, "--signing-key", str(old), "--instance", "1"]) == 2
    assert "is not valid at" in _one_error(capsys, "shuffle")
    assert not (tmp_path / "rel").exists()


def test_keys_cli_and_analyze_key_errors(made: Path, tmp_path: Path, capsys) -> None:
    foreign = tmp_path / "foreign"
    for instance in ("0", "1"):
        argv = ["keys", "generate", "--output", str(foreign), "--shuffler-instance", instance]
        assert cli.main(argv) == 0
    assert len(list(foreign.glob("*.public.json"))) == 2
    assert (
        cli.main(["keys", "generate", "--output", str(foreign), "--shuffler-instance", "-1"]) == 2
    )
    assert "shuffler_instance" in _one_error(capsys, "keys")
    shutil.copy(made / "recipe.json", tmp_path / "recipe.json")
    assert _analyze(made / "releases", tmp_path / "an", foreign) == 2
    assert "not among the shuffler keys" in _one_error(capsys, "analyze")
    assert _analyze(made / "releases", tmp_path / "an", tmp_path / "missing") == 2
    assert "no such file" in _one_error(capsys, "analyze")

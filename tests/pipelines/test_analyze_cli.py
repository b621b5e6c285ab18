"""``esa analyze`` reads only committed releases: n and the privacy parameters come from the
commit records, and every release that is not exactly what was committed is refused with one
line naming the file (exit 2) before any work."""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from pipelines import analyze as analyze_pipeline
from pipelines.commandline.main import main
from privacy.rng import seeded_generator
from schemas.payloads import CENSUS, encode_payloads
from schemas.recipes import load_recipe
from schemas.release import commit
from schemas.release.crowd_tables import read_crowd_table
from tests import release_fixtures as fx
from transforms.analyzer.report_files import read_reports

T0 = 1_704_067_200_000  # 2024-01-01
DAY = 86_400_000
N = (3000, 2000)  # respondents each instance's commit record states


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("recipe") / "cells.json"
    path.write_text(
        json.dumps(
            {
                "name": "cells",
                "version": 1,
                "channel": "cells",
                "randomizer": "one_hot_rappor",
                "randomizer_params": {"domain_size": 8, "epsilon": 3.0},
                "fragmentation": "attribute",
                "epsilon_local": 3.0,
                "epsilon_central_target": 3.0,
                "delta": 1e-6,
                "min_crowd_size": 100,
                "query_class": "test",
                "data_fields": ["cell"],
                "shuffler_instances": 2,
            }
        )  # fmt: skip
    )
    return str(path)


def _commit(directory: Path, instance: int, payloads: list[bytes], respondents: int,
            deletion=(None, None)) -> None:  # fmt: skip
    """A release of one released crowd (``payloads``) and one withheld crowd a day later."""
    crowd = {"channel": "cells", "recipe_id": "cells@1"}
    fx.write_release(
        directory,
        [fx.crowd(None, respondents, start=T0, **crowd), fx.crowd(None, None, start=T0 + DAY, **crowd)],
        [payloads, []],
        instance=instance,
        parameters={"crowd_threshold": 100, "deletion_epsilon": deletion[0],
                    "deletion_delta": deletion[1], "window": "1d", "window_ms": DAY},
    )  # fmt: skip


@pytest.fixture(scope="module")
def releases(tmp_path_factory, recipe_path) -> tuple[Path, np.ndarray]:
    """Two committed releases of one crowd; each respondent's messages go to one instance."""
    root = tmp_path_factory.mktemp("shuffled")
    randomizer = load_recipe(recipe_path).build_randomizer()
    rng = seeded_generator(31)
    values = rng.integers(0, 8, size=N[0])
    instance = np.where(np.arange(N[0]) < N[1], rng.integers(0, 2, size=N[0]), 0)
    messages = randomizer.randomize(values, rng)
    payloads = encode_payloads("bucket", {"bucket": messages.bucket}).to_list()
    census = encode_payloads(CENSUS, {}, count=1).to_list()[0]
    for u in (0, 1):
        chosen = [p for p, r in zip(payloads, messages.respondent, strict=True) if instance[r] == u]
        if u == 1:
            chosen += [census] * 5000  # a flood of retired census payloads: never counted
        deletion = (1.0, 1e-6) if u == 1 else (None, None)
        _commit(root / f"instance={u}", u, chosen, N[u], deletion=deletion)
    return root, values


def _analyze(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", *args, "--no-pictures", "--runner=FnApiRunner"])
    return code, out.getvalue(), err.getvalue()


def test_n_and_deletion_come_from_the_commit_records(releases, recipe_path, tmp_path):
    root, values = releases
    code, _, err = _analyze("--input", str(root), "--output", str(tmp_path / "a"),
                            "--recipe", recipe_path)  # fmt: skip
    assert code == 0, err
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    summary.update(read_reports(str(tmp_path / "a")))  # the per-crowd reports and notes
    [crowd] = summary["histograms"]
    assert crowd["respondents_by_instance"] == {"0": N[0], "1": N[1]}
    assert crowd["respondents_effective"] == pytest.approx(0.5 * N[0] + 0.5 * N[1])
    assert summary["metrics"]["rejected_by_reason"] == {"census_not_counted": 5000}
    assert summary["metrics"]["adds_up"]
    privacy = crowd["privacy"]
    assert privacy["respondents"] == min(N)
    assert privacy["deletion"] == {"1": {"epsilon": 1.0, "delta": 1e-6}}
    assert privacy["epsilon_central_total"] > privacy["epsilon_central"]
    [note] = summary["withheld"]
    assert note["withheld_by"] == [0, 1] and not note["estimated"]
    assert [r["crowd_threshold"] for r in summary["inputs"]["releases"]] == [100, 100]


def _copy(releases, tmp_path) -> Path:
    target = tmp_path / "shuffled"
    shutil.copytree(releases[0], target)
    return target


def _message_file(root: Path, instance: int) -> Path:
    return next((root / f"instance={instance}" / "messages").iterdir())


def _break_uncommitted(root: Path) -> Path:
    (root / "instance=1" / commit.COMMIT_FILE).unlink()
    return root / "instance=1" / commit.COMMIT_FILE


def _break_missing(root: Path) -> Path:
    path = _message_file(root, 0)
    path.unlink()
    return path


def _break_copied(root: Path) -> Path:
    path = root / "instance=0" / "messages" / "part-0 (copy).avro"
    shutil.copy(_message_file(root, 0), path)
    return path


def _break_truncated(root: Path) -> Path:
    path = _message_file(root, 1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 9 // 10])
    return path


def _break_altered(root: Path) -> Path:
    path = _message_file(root, 0)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return path


def _private(name: str, directory: bool = False):
    def breaker(root: Path) -> Path:
        path = root / "instance=0" / name
        if directory:
            path.mkdir()
            (path / "part-0.avro").write_bytes(b"origins")
        else:
            path.write_bytes(b"{}")
        return path

    return breaker


def _break_commit(root: Path) -> Path:
    path = root / "instance=1" / commit.COMMIT_FILE
    path.write_text(path.read_text()[:-40])
    return path


def _break_deletion(root: Path) -> Path:
    path = root / "instance=1" / commit.COMMIT_FILE
    record = json.loads(path.read_text())
    del record["parameters"]["deletion_epsilon"]
    path.write_text(json.dumps(record))
    return path


def _break_instance(root: Path) -> Path:
    path = root / "instance=0" / commit.COMMIT_FILE
    record = json.loads(path.read_text())
    record["instance"] = None
    path.write_text(json.dumps(record))
    return path


def _break_respondents(root: Path) -> Path:
    """A crowd table stating n = -5, re-committed (its SHA-256 matches): the row is refused."""
    for path in sorted((root / "instance=0" / "crowds").iterdir()):
        rows = read_crowd_table(str(path))
        if rows[0]["status"] == "released":
            rows[0]["respondents_released"] = -5
            fx.write_avro(path, "released_crowd", fx.table_rows(rows))
            fx.recommit(root / "instance=0")
            return path
    raise AssertionError("no released crowd")


@pytest.mark.parametrize(
    "breaker",
    [
        _break_uncommitted,
        _break_missing,
        _break_copied,
        _break_truncated,
        _break_altered,
        _private("dead_letter", directory=True),
        _private("manifest.avro"),
        _private("metrics.json"),
        _private("_spill-0123abcd", directory=True),
        _break_commit,
        _break_deletion,
        _break_respondents,
        _break_instance,
    ],
    ids=lambda f: f.__name__,
)
def test_a_release_that_is_not_what_was_committed_is_refused(releases, recipe_path, tmp_path,
                                                             breaker):  # fmt: skip
    root = _copy(releases, tmp_path)
    named = breaker(root)
    output = tmp_path / "out"
    code, out, err = _analyze(
        "--input", str(root), "--output", str(output), "--recipe", recipe_path
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # The line names the file: its path, or its directory and name (a commit-level problem).
    assert str(named) in err or (str(named.parent) in err and named.name in err), err
    assert not output.exists()  # refused before any work


def test_deletion_flags_must_agree_with_the_commit_records(releases, recipe_path, tmp_path):
    code, _, err = _analyze("--input", str(releases[0]), "--output", str(tmp_path / "o"),
                            "--recipe", recipe_path, "--deletion-epsilon", "2",
                            "--deletion-delta", "1e-6")  # fmt: skip
    assert code == 2 and "states deletion" in err and len(err.strip().splitlines()) == 1


def test_a_simulation_is_not_a_release(tmp_path, recipe_path):
    directory = tmp_path / "simulation"
    directory.mkdir()
    (directory / "simulation.json").write_text("{}")
    commit.write_commit(
        str(directory),
        {"format": commit.REPORTS_FORMAT,
         "files": [commit.file_entry(str(directory), "simulation.json")]},
    )  # fmt: skip
    code, _, err = _analyze("--input", str(directory), "--output", str(tmp_path / "o"),
                            "--recipe", recipe_path)  # fmt: skip
    assert code == 2 and "not a shuffler release" in err


def test_spilled_estimates_live_under_the_temp_location_and_are_removed(
    releases, recipe_path, tmp_path, monkeypatch
):
    from transforms.analyzer import analyze as analyze_transforms

    written: list[str] = []
    spill = analyze_transforms.spill_batches

    def recording(directory: str, name: str, batches: list[bytes]) -> list:
        spilled = spill(directory, name, batches)
        written.extend(where.path for where in spilled)
        return spilled

    monkeypatch.setattr(analyze_transforms, "spill_batches", recording)
    root, _ = releases
    output, temp = tmp_path / "a", tmp_path / "temp"
    code, _, err = _analyze("--input", str(root), "--output", str(output),
                            "--recipe", recipe_path, f"--temp_location={temp}")  # fmt: skip
    assert code == 0, err
    expected = analyze_pipeline.analysis_spill_dir(str(output), str(temp))
    assert written and all(path.startswith(expected + "/") for path in written)
    assert expected.startswith(str(temp / "esa-analysis") + "/")
    assert not Path(expected).exists() and not (output / "_batches").exists()
    assert analyze_pipeline.analysis_spill_dir(str(output), None) == str(output / "_batches")

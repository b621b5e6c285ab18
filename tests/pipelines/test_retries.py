"""Retried bundles leave exactly the committed files: a fault injected into the shuffler's
message-file writing and into the analyzer's part-file writing fails the first attempt of some
bundles on a runner that retries them (BundleBasedDirectRunner: up to 4 attempts per bundle;
FnApiRunner and Prism fail the job instead). The release and the analysis must equal an
uninjected run's on the same inputs: no duplicate, no lost file or record, and the release's
commit record lists exactly the files present.

The fault is a test-only wrapper around the write functions the pipelines call (the transforms
look them up at run time), so production code carries no hook. Each selected write fails on its
first attempt only (a marker file per target path records the attempt), after writing half of
its bytes to the file being written: the retried bundle must replace that half-written file.
"""

from __future__ import annotations

import io
import json
import os
import zlib
from collections import Counter
from pathlib import Path

import fastavro
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import analyze as analyze_pipeline
from pipelines import shuffle as shuffle_pipeline
from pipelines import simulate as simulate_pipeline
from tests.pipelines import shuffled
from transforms.analyzer.tables import SPILL_DIR
from transforms.common import atomic_files

pytestmark = pytest.mark.slow

RETRYING = ["--runner=BundleBasedDirectRunner"]
FNAPI = ["--runner=FnApiRunner"]
RESPONDENTS = 400
# Injected failures per run and kind of file (message files; the rest): a bundle then needs at
# most 3 attempts (BundleBasedDirectRunner gives 4), a job at most 4 restarts (the Flink cluster
# of tests/engines allows 5).
BUDGET = 2


class InjectedFault(RuntimeError):
    """The failure the test injects (a worker dying mid-write)."""


def _fails_first_attempt(markers: Path, name: str, every: bool) -> bool:
    """True on the first attempt at ``name`` if it is selected (``every`` file, or half of them
    by a stable hash of the final name); False on every later attempt."""
    if not every and zlib.crc32(name.encode()) % 2:
        return False
    markers.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(
            markers / zlib.crc32(name.encode()).to_bytes(4, "big").hex(), os.O_CREAT | os.O_EXCL
        )
    except FileExistsError:
        return False
    os.close(fd)
    return True


class Faults:
    """Wraps ``atomic_files.publish`` (every release, index and table part file goes through it)
    while ``active``: the selected files fail their first attempt after half their bytes reached
    the final name (the worst case: a truncated file where the real one belongs)."""

    def __init__(self, markers: Path) -> None:
        self.markers = markers
        self.active = False  # set by the test between the uninjected and the injected run
        self.every = False  # fail every file's first attempt (else half of them)
        self.failed: list[str] = []
        self.roots: list[str] = []  # "root//name" of each failure
        self._original = atomic_files.publish

    @staticmethod
    def _kind(root: str, name: str) -> str:
        if name.startswith(("messages/", "index/messages-")):
            return "messages"
        return "batches" if root.rstrip("/").endswith(SPILL_DIR) else "files"

    def publish(self, root, name, write):
        # At most BUDGET failures per run and kind: message files (and their index entries) are
        # written in a stage of their own; crowd tables, their index entries and manifests in the
        # stage that completes a bucket; the analyzer's spilled batches in its estimate stage,
        # its part files in the stages that write them.
        kind = self._kind(root, name)
        if (
            not self.active
            or sum(self._kind(*failed.rsplit("//", 1)) == kind for failed in self.roots) >= BUDGET
            # Every crowd table fails once (there may be only one), half of the other files.
            or not _fails_first_attempt(
                self.markers, f"{root}/{name}", self.every or name.startswith("crowds/")
            )
        ):
            return self._original(root, name, write)

        buffer = io.BytesIO()
        write(buffer)
        data = buffer.getvalue()
        self._original(root, name, lambda sink: sink.write(data[: len(data) // 2]))
        self.failed.append(name)
        self.roots.append(f"{root}//{name}")
        raise InjectedFault(f"injected failure writing {name}")


@pytest.fixture
def faults(monkeypatch, tmp_path) -> Faults:
    injected = Faults(tmp_path / "markers")
    monkeypatch.setattr(atomic_files, "publish", injected.publish)
    return injected


def _recipe(directory: Path) -> str:
    path = directory / "cells.json"
    path.write_text(
        json.dumps(
            {
                "name": "cells",
                "version": 1,
                "channel": "cells",
                "randomizer": "one_hot_rappor",
                "randomizer_params": {"domain_size": 16, "epsilon": 3.0},
                "fragmentation": "attribute",
                "epsilon_local": 3.0,
                "epsilon_central_target": 3.0,
                "delta": 1e-6,
                "min_crowd_size": 10,
                "query_class": "test",
                "data_fields": ["cell"],
                "shuffler_instances": 1,
                "window": "1d",
            }
        )
    )
    return str(path)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("retries")
    recipe = _recipe(root)
    simulate_pipeline.run(
        PipelineOptions(
            FNAPI,
            simulate_recipe=recipe,
            simulate_population="uniform",
            simulate_respondents=RESPONDENTS,
            simulate_output=str(root / "simulation"),
            simulate_seed=7,
        )
    )
    return root, recipe


def _shuffle(root: Path, recipe: str, output: Path, runner: list[str]) -> None:
    summary = shuffle_pipeline.run(
        PipelineOptions(
            runner,
            input=str(root / "simulation" / "instance=0" / "*.avro"),
            output=str(output),
            instance=0,
            recipe=[recipe],
            crowd_threshold=10,
            messages_per_file=40,
        )
    )
    assert summary["adds_up"]


def _release(output: Path) -> tuple[list[str], Counter, dict]:
    """Committed file names, the multiset of (crowd, payload) released, and the crowds."""
    verified = shuffled.verify(output)  # the commit's file list == the files present
    names = sorted(entry.path for entry in verified.entries)
    payloads: Counter = Counter()
    for path in verified.paths:
        if "/messages/" in path:
            with open(path, "rb") as handle:
                payloads.update(
                    (m["crowd_id"], m["window_start"], m["payload"])
                    for m in fastavro.reader(handle)
                )
    assert sum(payloads.values()) == verified.commit["records_released"]
    return names, payloads, shuffled.crowds(verified)


def test_retried_message_writes_commit_exactly_the_uninjected_release(reports, faults):
    root, recipe = reports
    _shuffle(root, recipe, root / "plain", FNAPI)
    faults.active = True
    _shuffle(root, recipe, root / "retried", RETRYING)
    for prefix in ("messages/", "crowds/", "index/"):
        assert any(name.startswith(prefix) for name in faults.failed), (prefix, faults.failed)
    plain, retried = _release(root / "plain"), _release(root / "retried")
    assert len(plain[0]) > 4  # several message files, so several bundles
    assert retried == plain
    for directory in (root / "retried", root / "retried.private"):
        assert not (directory / atomic_files.TEMPORARY_DIR).exists()


def _analyze(root: Path, recipe: str, output: Path, runner: list[str]) -> dict:
    return analyze_pipeline.run(
        PipelineOptions(
            runner,
            analyze_input=[str(root / "plain")],
            analyze_output=str(output),
            analyze_recipe=[recipe],
            analyze_no_pictures=True,
        )
    )


def _tables(output: Path) -> dict:
    assert not (output / SPILL_DIR).exists()  # the spilled batches are removed after the run
    tables = {}
    for name in (analyze_pipeline.HISTOGRAMS_FILE, analyze_pipeline.LONGITUDINAL_FILE):
        directory = output / name
        assert not (directory / atomic_files.TEMPORARY_DIR).exists()
        parts = sorted(path.name for path in directory.iterdir())
        table = pq.read_table(directory)
        tables[name] = (
            parts,
            table.sort_by(
                [(c, "ascending") for c in ("crowd", "bucket") if c in table.column_names]
            ).to_pylist(),
        )
    return tables


def test_retried_table_writes_give_exactly_the_uninjected_analysis(reports, faults):
    root, recipe = reports
    if not (root / "plain").exists():
        _shuffle(root, recipe, root / "plain", FNAPI)
    plain = _analyze(root, recipe, root / "analysis-plain", FNAPI)
    faults.active = faults.every = True
    retried = _analyze(root, recipe, root / "analysis-retried", RETRYING)
    assert any(name.startswith("part-") for name in faults.failed)
    assert any(failed.rsplit("//", 1)[0].endswith(SPILL_DIR) for failed in faults.roots)
    expected = _tables(root / "analysis-plain")
    assert expected[analyze_pipeline.HISTOGRAMS_FILE][1]  # the crowd was estimated
    assert _tables(root / "analysis-retried") == expected
    for summary in (plain, retried):
        summary.pop("seconds")
        summary["inputs"].pop("output")
    assert retried == plain

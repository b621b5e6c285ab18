"""The shuffler's spill (transforms/shuffler/spill.py) on a real run: it lives under the runner's
``--temp_location`` when one is given, is removed by the pipeline on success and on failure, and
no spill file ever holds a plaintext origin (only the keyed origin hash) beside a payload."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import shuffle as shuffle_pipeline
from tests.transforms import report_factory as rf
from transforms.common import atomic_files
from transforms.shuffler import spill

ORIGIN_TAG = b"plaintext-origin-"
RESPONDENTS, MESSAGES = 30, 3


def _inputs(tmp_path: Path) -> tuple[str, str]:
    recipe, fields = rf.write_recipe(tmp_path, "spill_test", min_crowd_size=5)
    records = [
        rf.report(f"{ORIGIN_TAG.decode()}{r:04d}", f"payload {r} {m}".encode(), **fields)
        for r in range(RESPONDENTS)
        for m in range(MESSAGES)
    ]
    (tmp_path / "reports").mkdir()
    rf.write_reports(tmp_path / "reports" / "r.avro", records)
    return recipe, str(tmp_path / "reports" / "*.avro")


def _batches(path: str, positions: list[spill.Spilled]) -> list[pa.RecordBatch]:
    """Every record batch message of a spill file, read back with the schema of its kind."""
    schema = {
        "reports": spill.REPORT_SPILL_SCHEMA,
        "buckets": spill.PIECE_LIST_SCHEMA,
        "released": spill.RELEASED_SPILL_SCHEMA,
        "candidates": spill.CANDIDATE_SPILL_SCHEMA,
    }[Path(path).parent.name]
    return [
        spill.read_spill(spill.Piece(path, offset, length, 0, "", 0), schema)
        for offset, length, _ in positions
    ]


@pytest.fixture
def spilled(monkeypatch) -> list[tuple[str, bytes, list[pa.RecordBatch]]]:
    """(path, bytes, batches) of every spill file the run writes, read as soon as it is
    written (the pipeline removes them when it ends)."""
    seen: list[tuple[str, bytes, list[pa.RecordBatch]]] = []
    original = spill.write_spill

    def write_spill(path, batches, chunk_rows=None, trailers=None):
        positions = original(path, batches, chunk_rows, trailers)
        seen.append((path, Path(path).read_bytes(), _batches(path, positions)))
        return positions

    monkeypatch.setattr(spill, "write_spill", write_spill)
    return seen


def _options(recipe: str, pattern: str, output: Path, temp: Path) -> PipelineOptions:
    return PipelineOptions(
        ["--runner=FnApiRunner", f"--temp_location={temp}"],
        input=pattern,
        output=str(output),
        recipe=[recipe],
        crowd_threshold=5,
        messages_per_file=16,
    )


def test_spill_is_under_temp_location_holds_no_origin_and_is_removed(tmp_path, spilled) -> None:
    recipe, pattern = _inputs(tmp_path)
    output, temp = tmp_path / "out", tmp_path / "temp"
    summary = shuffle_pipeline.run(_options(recipe, pattern, output, temp))
    assert summary["adds_up"] and summary["released"] == RESPONDENTS * MESSAGES
    kinds = {Path(path).parent.name for path, _, _ in spilled}
    assert kinds == {"reports", "buckets", "candidates", "released"}
    root = shuffle_pipeline.spill_root_path(str(output), f"{output}.private", str(temp))
    assert root.startswith(str(temp / "esa-spill"))
    for path, content, batches in spilled:
        assert path.startswith(root), path
        # Never a plaintext origin: not as a column, not anywhere in the bytes.
        assert ORIGIN_TAG not in content, path
        for batch in batches:
            assert "origin" not in batch.schema.names
        if Path(path).parent.name == "reports":
            hashes = [h for batch in batches for h in batch.column("origin_hash").to_pylist()]
            payloads = [p for batch in batches for p in batch.column("payload").to_pylist()]
            assert len(set(hashes)) == RESPONDENTS and len(payloads) == RESPONDENTS * MESSAGES
        if Path(path).parent.name == "candidates":  # an origin's rank in its crowd, no more
            codes = [c for batch in batches for c in batch.column("origin_code").to_pylist()]
            assert len(codes) == RESPONDENTS * MESSAGES and set(codes) == set(range(RESPONDENTS))
    # Removed by the pipeline: nothing of the spill is left, in temp or in the private dir.
    assert not (temp / "esa-spill").exists()
    assert not (Path(f"{output}.private") / "spill").exists()


def test_spill_and_temporary_files_are_removed_when_the_pipeline_fails(
    tmp_path, spilled, monkeypatch
) -> None:
    recipe, pattern = _inputs(tmp_path)
    output, temp = tmp_path / "out", tmp_path / "temp"

    def broken(root, name, write):  # every release file write fails after its temporary file
        atomic_files.FileSystems.create(atomic_files.temporary_path(root, name)).close()
        raise OSError(f"disk full writing {name}")

    monkeypatch.setattr(atomic_files, "publish", broken)
    with pytest.raises(Exception, match="disk full"):
        shuffle_pipeline.run(_options(recipe, pattern, output, temp))
    assert spilled  # the run got as far as spilling
    assert not (temp / "esa-spill").exists()
    assert not (output / atomic_files.TEMPORARY_DIR).exists()
    assert not (Path(f"{output}.private") / atomic_files.TEMPORARY_DIR).exists()
    assert not (output / "_COMMIT.json").exists()

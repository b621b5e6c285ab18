"""new_pipeline: no ``beam-pipeline-temp*`` directory outlives its pipeline, run or not."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.engines.new_pipeline import new_pipeline


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary directory, for this test an empty one of its own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _left(temporary: Path) -> list[str]:
    gc.collect()
    return sorted(path.name for path in temporary.glob("beam-pipeline-temp*"))


def _options() -> PipelineOptions:
    return PipelineOptions(["--runner=FnApiRunner"])


def test_a_pipeline_never_run_leaves_no_directory(temporary: Path) -> None:
    pipeline = new_pipeline(_options())
    _ = pipeline | beam.Create([1, 2])
    assert len(_left(temporary)) == 1  # Beam made it; it is there while the pipeline is
    del pipeline, _
    assert _left(temporary) == []
    # Beam's own pipeline, for comparison, leaves one behind.
    plain = beam.Pipeline(options=_options())
    del plain
    assert len(_left(temporary)) == 1


def test_a_pipeline_left_by_an_exception_leaves_no_directory(temporary: Path) -> None:
    with pytest.raises(ValueError, match="refused"):
        with new_pipeline(_options()) as pipeline:
            _ = pipeline | beam.Create([1])
            raise ValueError("refused while building")
    del pipeline, _
    assert _left(temporary) == []


def test_a_pipeline_that_ran_leaves_no_directory(temporary: Path) -> None:
    with new_pipeline(_options()) as pipeline:
        _ = pipeline | beam.Create([1, 2]) | beam.Map(lambda value: value + 1)
    del pipeline, _
    assert _left(temporary) == []

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


def _dependency_directories(temporary: Path) -> list[str]:
    """What is left in the temporary directory but Beam's requirements cache (one directory
    kept across runs by design) and its job servers' ``beam-temp*`` (removed when the server
    stops, at the latest when the process exits)."""
    gc.collect()
    kept = ("beam-requirements-cache", "beam-temp")
    return sorted(path.name for path in temporary.iterdir() if not path.name.startswith(kept))


def _describing_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """FnApiRunner made to do first what a portable runner does: describe the Python SDK's
    environment (Beam's ``python_sdk_dependencies`` makes a directory for its files)."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.transforms import environments

    beams = fn_runner.FnApiRunner.run_pipeline

    def run_pipeline(self, pipeline, options):
        environments.python_sdk_dependencies(options)
        return beams(self, pipeline, options)

    monkeypatch.setattr(fn_runner.FnApiRunner, "run_pipeline", run_pipeline)


def test_beams_dependency_directories_made_while_running_go_with_the_pipeline(
    temporary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _describing_environment(monkeypatch)
    with new_pipeline(_options()) as pipeline:
        _ = pipeline | beam.Create([1, 2]) | beam.Map(lambda value: value + 1)
    del pipeline, _
    assert _dependency_directories(temporary) == []
    # Beam's own pipeline, for comparison, leaves its dependency directory behind.
    with beam.Pipeline(options=_options()) as plain:
        _ = plain | beam.Create([1])
    assert len(_dependency_directories(temporary)) == 1


@pytest.mark.slow
@pytest.mark.engine
def test_a_pipeline_on_prism_leaves_nothing_in_the_temporary_directory(temporary: Path) -> None:
    from pipelines.engines import runners

    try:
        flags = runners.runner_flags("prism")
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    runners.quiet_worker_hangups()  # Beam's routine stop of the job server, at exit
    with new_pipeline(PipelineOptions(flags)) as pipeline:
        _ = pipeline | beam.Create([1, 2]) | beam.Map(lambda value: value + 1)
    del pipeline, _
    # Beam described the SDK's environment twice (a round trip of the graph, then the
    # runner's own), a directory each, before this change left in the temporary directory.
    assert _dependency_directories(temporary) == []

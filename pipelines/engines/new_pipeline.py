"""A Beam pipeline whose local temporary directories go with it, run or not.

``beam.Pipeline()`` makes a directory ``beam-pipeline-temp*`` in the system's temporary
directory and removes it only at the end of ``Pipeline.run``. A pipeline that is never run (its
construction refused bad input, or ``with beam.Pipeline(...)`` left by an exception, whose
``__exit__`` then skips the run) left its directory behind, one per refused command. Here the
directory is removed once the pipeline object is gone (``weakref.finalize``: when it is collected,
or at the interpreter's exit at the latest); removing it twice is harmless.

Beam also makes a directory of its own (``tmp*``) each time it describes the Python SDK's
environment (``environments.python_sdk_dependencies``: the job's dependency files, such as the
``submission_environment_dependencies.txt`` it writes for a portable runner), and never removes
it: a run on Prism or Flink left two per pipeline (the graph's check by a round trip through its
proto, then the runner's own), and ``esa run`` four pipelines. While a pipeline of
:func:`new_pipeline` runs, those directories are made inside its ``beam-pipeline-temp*`` one
(:func:`keep_sdk_dependencies_with_the_pipeline`), which Beam removes when ``run`` returns: by
then a portable runner has staged the job's files (``PortableRunner.run_pipeline`` returns once
the job is submitted), and other runners never read them.
"""

from __future__ import annotations

import contextvars
import os
import shutil
import tempfile
import weakref
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.engines.install_once import install_once
from pipelines.engines.option_views import views_once

__all__ = ["keep_sdk_dependencies_with_the_pipeline", "new_pipeline", "running_pipeline_tempdir"]

# The local temporary directory of the pipeline this thread is running (None: none).
_running_tempdir: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "esa_running_pipeline_tempdir", default=None
)


def running_pipeline_tempdir() -> str | None:
    """The ``beam-pipeline-temp*`` directory of the pipeline this thread's ``run`` is in, if
    that pipeline is one of :func:`new_pipeline` and its directory is still there."""
    running = _running_tempdir.get()
    return running if running is not None and os.path.isdir(running) else None


@install_once
def keep_sdk_dependencies_with_the_pipeline() -> bool:
    """Beam's ``environments.python_sdk_dependencies`` given no directory makes it in
    :func:`running_pipeline_tempdir` when there is one (in the system's temporary directory as
    before when there is not); False, changing nothing, if the installed Beam lacks it."""
    from apache_beam.transforms import environments

    beams = getattr(environments, "python_sdk_dependencies", None)
    if beams is None:
        return False

    def python_sdk_dependencies(options: Any, tmp_dir: str | None = None) -> Any:
        running = running_pipeline_tempdir()
        if tmp_dir is None and running is not None:
            tmp_dir = tempfile.mkdtemp(dir=running)
        return beams(options, tmp_dir)

    environments.python_sdk_dependencies = python_sdk_dependencies
    return True


class _Pipeline(beam.Pipeline):
    """``beam.Pipeline`` whose ``run`` says which local temporary directory is running."""

    def run(self, test_runner_api: Any = "AUTO") -> Any:
        token = _running_tempdir.set(self.local_tempdir)
        try:
            return super().run(test_runner_api)
        finally:
            _running_tempdir.reset(token)


def new_pipeline(options: PipelineOptions) -> beam.Pipeline:
    """``beam.Pipeline`` of ``options`` (their views made once, :func:`views_once`) whose local
    temporary directory, and the dependency directories Beam makes while it runs, are removed
    with it."""
    keep_sdk_dependencies_with_the_pipeline()
    pipeline = _Pipeline(options=views_once(options))
    weakref.finalize(pipeline, shutil.rmtree, pipeline.local_tempdir, True)
    return pipeline

"""A Beam pipeline whose local temporary directory goes with it, run or not.

``beam.Pipeline()`` makes a directory ``beam-pipeline-temp*`` in the system's temporary
directory and removes it only at the end of ``Pipeline.run``. A pipeline that is never run (its
construction refused bad input, or ``with beam.Pipeline(...)`` left by an exception, whose
``__exit__`` then skips the run) left its directory behind, one per refused command. Here the
directory is removed once the pipeline object is gone (``weakref.finalize``: when it is collected,
or at the interpreter's exit at the latest); removing it twice is harmless.
"""

from __future__ import annotations

import shutil
import weakref

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.engines.option_views import views_once

__all__ = ["new_pipeline"]


def new_pipeline(options: PipelineOptions) -> beam.Pipeline:
    """``beam.Pipeline`` of ``options`` (their views made once, :func:`views_once`) whose local
    temporary directory is removed with it."""
    pipeline = beam.Pipeline(options=views_once(options))
    weakref.finalize(pipeline, shutil.rmtree, pipeline.local_tempdir, True)
    return pipeline

"""PipelineOptions of the ESA stages (Beam's habit: one options class per pipeline, each in its own
module: ``shuffle_options``, ``simulate_options``, ``analyze_options``, ``run_options``, so that a
stage's command line loads no other party's code); this module holds what they share.

Each stage lists its flags once, as :class:`~pipelines.commandline.flags.Flag` entries in ``FLAGS`` (adding a
flag is adding one entry, and a check to ``validate`` if it can be wrong). Defaults come from the
config dataclasses each stage builds (``ShuffleConfig``, ``SimulationPlan``, ``AnalysisConfig``),
so a default is written in one place. ShuffleOptions has no prefix (``--crowd-threshold`` on
Beam's parser too); the others are ``--simulate_<name>``, ``--analyze_<name>``, ``--run_<name>``
on Beam's parser and ``--<name>`` on their ``esa`` command. ``pipelines.commandline.main`` runs ``validate()``
before any work; any flag that is neither the stage's nor Beam's own is an error.
"""

from __future__ import annotations

import hashlib
import os

from apache_beam.io.filesystems import FileSystems

from pipelines.commandline.flags import (
    DEFAULT_BATCH_RUNNER,
    INT64_MAX,
    Flag,
    add_stage_arguments,
    format_duration_ms,
    stage_option_values,
    unknown_beam_flags,
    with_default_runner,
    worker_processes_of,
)

__all__ = [
    "DEFAULT_BATCH_RUNNER",
    "INT64_MAX",
    "Flag",
    "add_stage_arguments",
    "format_duration_ms",
    "stage_option_values",
    "unknown_beam_flags",
    "with_default_runner",
    "worker_processes_of",
]


def temp_location_root(temp_location: str, kind: str, output: str) -> str:
    """``<--temp_location>/<kind>/<digest of output>``: one scratch root per output directory, so
    that cleaning a dead run's scratch data never touches another output's."""
    digest = hashlib.sha256(os.path.abspath(output).encode()).hexdigest()[:16]
    return FileSystems.join(temp_location, kind, digest)

"""What a process that builds or runs a pipeline's bundles sets once in Beam and Python: Beam's
DoFn specs kept per set of methods (``dofn_specs.py``), its bz2 compression of pickles done once
per distinct input (``pickle_compression.py``), its check of a DoFn's source made once per
function (``yield_checks.py``), short state-sampler sleeps
(``state_sampling.py``) and fewer garbage collections (``garbage_collection.py``). A driver sets it in
``pipelines.commandline.flags.with_default_runner``; workers forked from the driver inherit it,
and ``esa run``'s fork server sets it in itself before forking any worker
(``forked_workers.py``)."""

from __future__ import annotations

from pipelines.engines.dofn_specs import remember_dofn_specs
from pipelines.engines.garbage_collection import collect_less_often
from pipelines.engines.pickle_compression import remember_compression
from pipelines.engines.state_sampling import shorten_state_sampling
from pipelines.engines.yield_checks import check_yields_once

__all__ = ["tune_this_process"]


def tune_this_process() -> None:
    """Install the five (each once; idempotent)."""
    remember_dofn_specs()
    remember_compression()
    check_yields_once()
    shorten_state_sampling()
    collect_less_often()

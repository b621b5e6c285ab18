"""Python's cyclic garbage collector, run less often in pipeline processes.

CPython collects its youngest generation every 700 net allocations of container objects (tuples,
lists, dicts, objects) and the older ones every 10 collections of the one below. A pipeline
process makes and drops such objects by the million (crowd keys, Beam's windowed values and
bundle state), almost all freed by reference counting, so those collections mostly walk objects
that are still alive: in ``esa analyze`` of 100,000 crowds on FnApiRunner, 1,624 young and 148
middle collections and 3 full ones took 0.25-0.28 s of its 4 s (measured with ``gc.callbacks``).

:func:`collect_less_often` sets the youngest generation's threshold to
:data:`YOUNG_THRESHOLD` allocations and the older ones' to :data:`OLDER_THRESHOLD` collections:
the same run then made 6 young collections and no other, 0.06-0.09 s in all. Memory held by
unreachable cycles waits for at most that many allocations; nothing else changes. It is applied
by ``pipelines.commandline.flags.with_default_runner``, which every pipeline passes through, and
never lowers a threshold set higher already.
"""

from __future__ import annotations

import gc

__all__ = ["OLDER_THRESHOLD", "YOUNG_THRESHOLD", "collect_less_often"]

YOUNG_THRESHOLD = 50_000
OLDER_THRESHOLD = 20


def collect_less_often() -> tuple[int, int, int]:
    """Raise the collector's thresholds to at least (:data:`YOUNG_THRESHOLD`,
    :data:`OLDER_THRESHOLD`, :data:`OLDER_THRESHOLD`); returns the thresholds now in force."""
    young, middle, old = gc.get_threshold()
    if young == 0:  # automatic collection is off: left off
        return young, middle, old
    gc.set_threshold(
        max(young, YOUNG_THRESHOLD), max(middle, OLDER_THRESHOLD), max(old, OLDER_THRESHOLD)
    )
    return gc.get_threshold()

"""The garbage collector's thresholds in pipeline processes: raised, never lowered."""

from __future__ import annotations

import gc

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline.flags import with_default_runner
from pipelines.engines.garbage_collection import (
    OLDER_THRESHOLD,
    YOUNG_THRESHOLD,
    collect_less_often,
)


@pytest.fixture(autouse=True)
def _thresholds_restored():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_every_pipelines_options_raise_the_thresholds():
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    with_default_runner(PipelineOptions([]))
    assert gc.get_threshold() == (YOUNG_THRESHOLD, OLDER_THRESHOLD, OLDER_THRESHOLD)


def test_a_higher_threshold_is_kept_and_collection_left_off_stays_off():
    gc.set_threshold(YOUNG_THRESHOLD * 4, 5, OLDER_THRESHOLD * 3)
    assert collect_less_often() == (YOUNG_THRESHOLD * 4, OLDER_THRESHOLD, OLDER_THRESHOLD * 3)
    gc.set_threshold(0)
    assert collect_less_often()[0] == 0 and gc.get_threshold()[0] == 0


def test_cycles_are_still_collected():
    """A reference cycle dropped is freed once the young generation's threshold is passed."""
    import weakref

    collect_less_often()

    class Node:
        pass

    first, second = Node(), Node()
    first.other, second.other = second, first
    alive = weakref.ref(first)
    del first, second
    junk = [[] for _ in range(YOUNG_THRESHOLD * 2)]  # container allocations: a collection
    assert junk and alive() is None

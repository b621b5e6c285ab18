"""Beam's DoFn specs kept per DoFn object and per set of methods: the same answers as Beam's,
asked once per set of methods."""

from __future__ import annotations

import gc
import types
import weakref

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer

from pipelines.engines.dofn_specs import methods_key, remember_dofn_specs, remembering

COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
EXPIRY = TimerSpec("expiry", TimeDomain.WATERMARK)
COUNT_PARAM = beam.DoFn.StateParam(COUNT)
EXPIRY_PARAM = beam.DoFn.TimerParam(EXPIRY)


class _Counting(beam.DoFn):
    def process(self, element, count=COUNT_PARAM):
        seen = (count.read() or 0) + 1
        count.write(seen)
        yield element[0], seen


class _Timed(_Counting):
    def process(self, element, count=COUNT_PARAM, expiry=EXPIRY_PARAM):
        yield from super().process(element, count)

    @on_timer(EXPIRY)
    def expired(self):
        return []


class _Twice(beam.DoFn):
    def process(self, element, a=COUNT_PARAM, b=COUNT_PARAM):
        yield element


def _beams(dofn):
    """Beam's own get_dofn_specs (also when the remembering one is installed)."""
    return getattr(userstate.get_dofn_specs, "__wrapped__", userstate.get_dofn_specs)(dofn)


def _counted():
    calls = []

    def counting(dofn):
        calls.append(dofn)
        return _beams(dofn)

    return remembering(counting), calls


@pytest.mark.parametrize("make", [beam.DoFn, _Counting, _Timed, lambda: beam.Map(len).fn])
def test_the_same_specs_as_beam_asked_once_per_set_of_methods(make):
    specs, calls = _counted()
    dofn = make()
    expected = _beams(dofn)
    first, again = specs(dofn), specs(dofn)
    assert first == again == expected
    assert len(calls) == 1
    first[0].add("changed")  # fresh sets each call, as Beam's
    assert specs(dofn) == expected
    other = make()  # another object with the same methods (a bundle processor's copy)
    assert specs(other) == expected
    assert len(calls) == 1


def _timed_process(self, element, count=COUNT_PARAM, expiry=EXPIRY_PARAM):
    yield element


def test_an_object_with_other_methods_is_asked_again():
    specs, calls = _counted()
    assert specs(_Counting()) == ({COUNT}, set())
    changed = _Counting()
    changed.process = types.MethodType(_timed_process, changed)  # its own process method
    assert _beams(changed) == ({COUNT}, {EXPIRY})
    assert specs(changed) == ({COUNT}, {EXPIRY})
    assert len(calls) == 2
    assert specs(_Counting()) == ({COUNT}, set())  # the class's answer is still its own
    assert len(calls) == 2


class _Holder:
    def method(self, element, count=COUNT_PARAM):
        yield element


def test_a_method_with_an_inspect_hook_is_asked_per_object():
    """``beam.FlatMap(bound_method)``: Beam reads ``process``'s parameters through the DoFn's
    ``_inspect_process`` hook, whose answer depends on the wrapped callable, so it is never
    shared between objects."""
    specs, calls = _counted()
    first, second = beam.FlatMap(_Holder().method).fn, beam.FlatMap(_Holder().method).fn
    assert methods_key(first) is None
    assert specs(first) == _beams(first)
    assert specs(second) == _beams(second)
    assert specs(first) == _beams(first)
    assert len(calls) == 2


def test_state_and_timer_specs_are_found():
    specs, _ = _counted()
    assert specs(_Timed()) == ({COUNT}, {EXPIRY})
    assert specs(_Counting()) == ({COUNT}, set())
    assert specs(beam.DoFn()) == (set(), set())


def test_an_object_is_forgotten_when_it_dies_and_failures_are_never_kept():
    specs, calls = _counted()
    dofn = _Counting()
    reference = weakref.ref(dofn)
    specs(dofn)
    del dofn
    calls.clear()
    gc.collect()
    assert reference() is None  # not held by what was kept
    assert specs(_Counting())[0] == {COUNT}
    assert not calls  # kept under its methods
    twice = _Twice()
    for _ in range(2):
        with pytest.raises(ValueError, match="duplicate"):
            specs(twice)
    assert len(calls) == 2


def test_installed_once_and_a_stateful_pipeline_still_runs():
    assert remember_dofn_specs() and remember_dofn_specs()
    assert userstate.get_dofn_specs.__wrapped__ is not None
    with beam.Pipeline("FnApiRunner") as pipeline:
        counted = pipeline | beam.Create([("a", 1), ("a", 2), ("b", 3)]) | beam.ParDo(_Timed())
        assert_that(counted, equal_to([("a", 1), ("a", 2), ("b", 1)]))

"""pipelines/engines/yield_checks.py: Beam's yield-and-return check, once per function."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import core

from pipelines.commandline.flags import with_default_runner
from pipelines.engines.yield_checks import check_yields_once, checking_once


class _Yields(beam.DoFn):
    def process(self, element):
        yield element


class _YieldsAndReturns(beam.DoFn):
    def process(self, element):
        if element:
            return [element]
        yield element


def _beams_check():
    check = core._check_fn_use_yield_and_return
    return getattr(check, "__wrapped__", check)


def test_beam_s_answers_asked_once_per_function():
    asked = []

    def counting(fn):
        asked.append(fn)
        return _beams_check()(fn)

    check = checking_once(counting)
    for _ in range(3):
        assert check(_Yields().process) is False
        assert check(_YieldsAndReturns().process) is True
        assert check(len) is False  # a builtin: no code object, asked each time
    assert len(asked) == 2 + 3
    # Map's and FlatMap's process is one Beam method: asked once for all of them
    maps = [beam.Map(lambda x, k=k: x + k).dofn.process for k in range(5)]
    assert {check(process) for process in maps} == {False}
    assert len(asked) == 2 + 3 + 1


def test_installed_by_every_pipelines_options_and_beam_still_warns(caplog):
    with_default_runner(PipelineOptions([]))
    assert check_yields_once() and core._check_fn_use_yield_and_return is not _beams_check()

    class _Fresh(beam.DoFn):  # ParDo warns from the answer: for each ParDo, as before
        def process(self, element):
            if element:
                return [element]
            yield element

    with caplog.at_level("WARNING"):
        beam.ParDo(_Fresh())
        beam.ParDo(_Fresh())
    warned = [r for r in caplog.records if "yield and return" in r.getMessage()]
    assert len(warned) == 2

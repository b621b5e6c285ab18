"""Beam's bundle state samplers sample every 10 ms at most once a pipeline's options are made."""

from __future__ import annotations

import inspect

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statesampler
from apache_beam.utils import counters

from pipelines.commandline.flags import with_default_runner
from pipelines.engines.state_sampling import SAMPLING_PERIOD_MS, shorten_state_sampling


def _new_sampler() -> statesampler.StateSampler:
    return statesampler.StateSampler("test-step", counters.CounterFactory())


def test_installed_by_every_pipelines_options():
    with_default_runner(PipelineOptions([]))
    sampler = _new_sampler()
    assert (
        sampler.sampling_period_ms == SAMPLING_PERIOD_MS < statesampler.DEFAULT_SAMPLING_PERIOD_MS
    )


def test_idempotent_and_only_the_default():
    assert shorten_state_sampling() and shorten_state_sampling(SAMPLING_PERIOD_MS * 7)
    assert _new_sampler().sampling_period_ms == SAMPLING_PERIOD_MS  # installed once
    explicit = statesampler.StateSampler("x", counters.CounterFactory(), sampling_period_ms=50)
    assert explicit.sampling_period_ms == 50
    parameter = inspect.signature(statesampler.StateSampler.__init__).parameters[
        "sampling_period_ms"
    ]
    assert parameter.default == SAMPLING_PERIOD_MS


def test_a_sampler_still_counts_the_time_of_its_state():
    """The msec counters still add up: a state held while the sampler runs gets time."""
    sampler = _new_sampler()
    state = sampler.scoped_state(counters.CounterName("step"), "process")
    sampler.start()
    with state:
        total = 0
        for value in range(2_000_000):  # about 50-100 ms of work, several sampling periods
            total += value
    sampler.stop()
    assert total and state.sampled_msecs_int() > 0

"""Beam's per-bundle state sampler, stopped without waiting out a long sleep.

Every bundle a Beam SDK worker processes starts a ``statesampler.StateSampler``: a thread that
sleeps, wakes, adds the time since its last wake to the step the bundle is in (Beam's msec
counters), and sleeps again, its sleeps growing 1.2x from 2 ms up to its sampling period, 200 ms
by default. Stopping it at the end of the bundle joins that thread, so the bundle's end waits
out the sleep in progress: about a sixth of the bundle's time for a short bundle, up to 200 ms
for a long one, on every bundle of every stage. In ``esa analyze`` of 100,000 crowds on
FnApiRunner (eight stages, 4-5 s) the main thread waited there 0.4-0.5 s; a sampled stack showed
it in ``Thread.join`` under ``StateSampler.stop``.

:func:`shorten_state_sampling` makes new samplers sample every :data:`SAMPLING_PERIOD_MS` at
most (they ramp up from 1 ms), so a bundle's end waits a few milliseconds; the counters are as
exact (finer, if anything), and a sampler thread waking 100 times a second takes no measurable
CPU. It changes only the default of the sampler's ``sampling_period_ms`` and is installed by
``pipelines.commandline.flags.with_default_runner``, which every pipeline passes through; the
workers forked from a driver inherit it. If the installed Beam's sampler has no such default,
nothing changes.
"""

from __future__ import annotations

import inspect

from pipelines.engines.install_once import install_once

__all__ = ["SAMPLING_PERIOD_MS", "shorten_state_sampling"]

# The longest sleep of a bundle's state sampler (Beam's default: 200 ms).
SAMPLING_PERIOD_MS = 10


@install_once
def shorten_state_sampling(period_ms: int = SAMPLING_PERIOD_MS) -> bool:
    """Make ``period_ms`` the default sampling period of Beam's ``StateSampler`` (once;
    idempotent). Returns whether it is installed."""
    from apache_beam.runners.worker import statesampler

    init = getattr(statesampler.StateSampler, "__init__", None)
    parameters = list(inspect.signature(init).parameters.values()) if init else []
    defaults = getattr(init, "__defaults__", None)
    fits = (
        bool(parameters)
        and parameters[-1].name == "sampling_period_ms"
        and defaults is not None
        and len(defaults) == 1
    )
    if fits:
        init.__defaults__ = (int(period_ms),)
    return fits

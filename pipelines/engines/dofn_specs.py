"""Beam's DoFn state and timer specs, found once per DoFn object.

``apache_beam.transforms.userstate.get_dofn_specs`` wraps every bound method of a DoFn in a
``MethodWrapper`` (an ``inspect.signature`` each; DoFn itself has 28), about 1.25 ms a call, and
Beam asks it 4-5 times per ParDo while a pipeline is built and run (``ParDo.__init__``'s
validation, ``DoFnSignature``, ``to_runner_api``, each bundle processor): 448 calls, ~0.55 s, in
``esa analyze`` at 9,959 crowds, the largest fixed cost left in building its pipeline. Its
answer depends only on the DoFn's methods and their parameter defaults, fixed when the object is
made.

:func:`remember_dofn_specs` installs a wrapper that keeps the answer per object (by identity, for
as long as the object lives; a DoFn that cannot be weakly referenced is asked every time), and
returns fresh sets each call as the original does; a failure is raised each time, never kept.
It is installed by ``pipelines.commandline.flags.with_default_runner``, which every pipeline
passes through. If the installed Beam has no ``userstate.get_dofn_specs``, nothing changes.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["remember_dofn_specs", "remembering"]

_install = threading.Lock()
_installed: list[bool] = []

Specs = tuple[set[Any], set[Any]]


def remembering(original: Callable[[Any], Specs]) -> Callable[[Any], Specs]:
    """``original`` (``get_dofn_specs``) with its answers kept per DoFn object."""
    kept: dict[int, tuple[weakref.ref, frozenset, frozenset]] = {}

    def get_dofn_specs(dofn: Any) -> Specs:
        key = id(dofn)
        hit = kept.get(key)
        if hit is not None and hit[0]() is dofn:
            return set(hit[1]), set(hit[2])
        states, timers = original(dofn)
        try:
            ref = weakref.ref(dofn, lambda _, key=key: kept.pop(key, None))
        except TypeError:  # no weak references to it: not kept
            return states, timers
        kept[key] = (ref, frozenset(states), frozenset(timers))
        return states, timers

    get_dofn_specs.__wrapped__ = original  # type: ignore[attr-defined]
    get_dofn_specs.__doc__ = original.__doc__
    return get_dofn_specs


def remember_dofn_specs() -> bool:
    """Install :func:`remembering` over Beam's ``get_dofn_specs`` (once; idempotent). Returns
    whether it is installed."""
    from apache_beam.transforms import userstate

    with _install:
        if _installed:
            return _installed[0]
        original = getattr(userstate, "get_dofn_specs", None)
        fits = callable(original)
        if fits:
            userstate.get_dofn_specs = remembering(original)
        _installed.append(fits)
        return fits

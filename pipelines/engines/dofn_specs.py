"""Beam's DoFn state and timer specs, found once per DoFn object and once per set of methods.

``apache_beam.transforms.userstate.get_dofn_specs`` wraps every bound method of a DoFn in a
``MethodWrapper`` (an ``inspect.signature`` each; DoFn itself has 28), about 1.25 ms a call, and
Beam asks it 4-5 times per ParDo while a pipeline is built and run (``ParDo.__init__``'s
validation, ``DoFnSignature``, ``to_runner_api``, each bundle processor): 448 calls, ~0.55 s, in
``esa analyze`` at 9,959 crowds, the largest fixed cost left in building its pipeline. Kept per
object, the calls left were those of each bundle processor, which unpickles its own copies of the
DoFns (and of ParDos made again while building): 0.16 s of that analysis at 9,959 crowds.

Beam's answer is made only from the object's bound methods (``dir(dofn)``, each attribute that
is a ``types.MethodType``): their names, their functions' parameters and defaults, and, for a
method ``m`` with an ``_inspect_m`` hook, what the hook returns. :func:`remembering` keeps it
per object (by identity, for as long as the object lives) and, for an object with no such hook
in use, also under its methods: the names with the identities of each function and of the
objects its signature is read from (``__defaults__``, ``__kwdefaults__``, ``__signature__``,
``__wrapped__``; held by the entry, so no identity is reused while it is kept). Two DoFns with
the same methods, such as a bundle processor's copy of a DoFn and the driver's, get one answer
without asking Beam; fresh sets are returned each call as the original does, and a failure is
raised each time, never kept. Finding the methods costs about 45 µs against Beam's 0.8-1.3 ms.

It is installed by ``pipelines.commandline.flags.with_default_runner``, which every pipeline
passes through. If the installed Beam has no ``userstate.get_dofn_specs``, nothing changes.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

from pipelines.engines.install_once import install_once

__all__ = ["remember_dofn_specs", "remembering", "methods_key"]


Specs = tuple[set[Any], set[Any]]

# Entries kept under a DoFn's methods; the table empties when full (DoFn classes are few).
METHOD_KEYS_LIMIT = 1024
_SIGNATURE_SOURCES = ("__defaults__", "__kwdefaults__", "__signature__", "__wrapped__")


def methods_key(dofn: Any) -> tuple[tuple, tuple] | None:
    """``(key, held)``: what Beam's answer for ``dofn`` is made from, as identities (``key``)
    and the objects they are identities of (``held``, to be kept alive beside the key); None
    when an ``_inspect_<name>`` hook of one of its methods would be asked (its answer may
    depend on the object's state)."""
    parts: list[Any] = [type(dofn)]
    held: list[Any] = [type(dofn)]
    names = dir(dofn)
    present = set(names)
    for name in names:
        value = getattr(dofn, name, None)
        if not isinstance(value, types.MethodType):
            continue
        if f"_inspect_{name}" in present:
            return None
        function = value.__func__
        sources = [getattr(function, source, None) for source in _SIGNATURE_SOURCES]
        parts.append((name, id(function), *map(id, sources)))
        held.append((function, sources))
    return tuple(parts), tuple(held)


def remembering(original: Callable[[Any], Specs]) -> Callable[[Any], Specs]:
    """``original`` (``get_dofn_specs``) with its answers kept per DoFn object and per
    :func:`methods_key`."""
    kept: dict[int, tuple[weakref.ref, frozenset, frozenset]] = {}
    by_methods: dict[tuple, tuple[tuple, frozenset, frozenset]] = {}

    def keep(dofn: Any, states: frozenset, timers: frozenset) -> None:
        key = id(dofn)
        try:
            ref = weakref.ref(dofn, lambda _, key=key: kept.pop(key, None))
        except TypeError:  # no weak references to it: kept under its methods only
            return
        kept[key] = (ref, states, timers)

    def get_dofn_specs(dofn: Any) -> Specs:
        hit = kept.get(id(dofn))
        if hit is not None and hit[0]() is dofn:
            return set(hit[1]), set(hit[2])
        found = methods_key(dofn)
        if found is not None:
            entry = by_methods.get(found[0])
            if entry is not None:
                keep(dofn, entry[1], entry[2])
                return set(entry[1]), set(entry[2])
        states, timers = original(dofn)
        frozen_states, frozen_timers = frozenset(states), frozenset(timers)
        keep(dofn, frozen_states, frozen_timers)
        if found is not None:
            if len(by_methods) >= METHOD_KEYS_LIMIT:
                by_methods.clear()
            by_methods[found[0]] = (found[1], frozen_states, frozen_timers)
        return states, timers

    get_dofn_specs.__wrapped__ = original  # type: ignore[attr-defined]
    get_dofn_specs.__doc__ = original.__doc__
    return get_dofn_specs


@install_once
def remember_dofn_specs() -> bool:
    """Install :func:`remembering` over Beam's ``get_dofn_specs`` (once; idempotent). Returns
    whether it is installed."""
    from apache_beam.transforms import userstate

    original = getattr(userstate, "get_dofn_specs", None)
    fits = callable(original)
    if fits:
        userstate.get_dofn_specs = remembering(original)
    return fits

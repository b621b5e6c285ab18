"""Beam's check of a DoFn's ``process`` for both ``yield`` and ``return``, once per function.

``ParDo.__init__`` asks ``apache_beam.transforms.core._check_fn_use_yield_and_return`` of every
ParDo's ``process`` method whether it uses both (Beam then warns), and the answer is read from
the method's source: ``inspect.getsourcelines`` and a tokenizer over the function, about 0.8 ms
a call. Most ParDos are ``Map`` or ``FlatMap``, whose ``process`` is one Beam method, and a
process that builds several pipelines (``esa run``'s four, a streaming analyzer's one per
window, the tests) builds the same ParDos again each time.

:func:`checking_once` keeps each answer under the function's code object: one code object is
one piece of source (its file and first line), so the answer cannot change while the process
runs. A callable without a code object (a builtin, a callable instance) is asked of Beam every
time. ParDo still warns of a ``process`` that yields and returns for each ParDo (it warns from
the answer); the note the check itself logs on a ``process`` that returns None is given once per
function. Per pipeline built again in a process: 59 checks of a tiny analysis, 15-25 ms, none
after the first pipeline. Installed by ``pipelines.engines.process_tuning`` with the rest; if the installed Beam
has no such function, nothing changes.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

from pipelines.engines.install_once import install_once

__all__ = ["CHECKED_LIMIT", "check_yields_once", "checking_once"]

CHECKED_LIMIT = 1024  # answers kept; the table empties when full (DoFn classes are few)


def _code_of(fn: Any) -> types.CodeType | None:
    """The code object of a function or bound method, else None."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def checking_once(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``original`` (Beam's check) asked once per code object; of other callables each time."""
    answers: dict[types.CodeType, bool] = {}
    lock = threading.Lock()

    def check(fn: Any) -> bool:
        code = _code_of(fn)
        if code is None:
            return original(fn)
        with lock:
            if code in answers:
                return answers[code]
        answer = original(fn)
        with lock:
            if len(answers) >= CHECKED_LIMIT:
                answers.clear()
            answers[code] = answer
        return answer

    check.__wrapped__ = original  # type: ignore[attr-defined]
    return check


@install_once
def check_yields_once() -> bool:
    """Install :func:`checking_once` over Beam's check (once; idempotent). Returns whether it
    is installed."""
    from apache_beam.transforms import core

    original = getattr(core, "_check_fn_use_yield_and_return", None)
    fits = callable(original)
    if fits:
        core._check_fn_use_yield_and_return = checking_once(original)
    return fits

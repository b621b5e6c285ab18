"""scipy.special's ufuncs (Boost's binomial functions, ``expit``, ``log_ndtr``, ...) without the
rest of scipy.special.

``import scipy.special`` runs the package's ``__init__``, which imports the whole of
scipy.special and its array-API layer: 0.5 s on 2 cores, paid by every process that accounts a
crowd (the analyzer's workers) and by every driver that loads a recipe whose epsilon_local is
solved (the shuffler's and the analyzer's). The ufuncs the accounting uses live in one extension
module, ``scipy.special._ufuncs``, which loads in 0.03 s with the three extensions it imports
itself; ``scipy.special.expit is _ufuncs.expit`` (the same objects, so the same floats).

:func:`ufuncs` imports that extension under a bare stand-in for its package (a module with the
package's ``__path__`` and nothing else), removed again at once, where scipy.special is not
imported yet: the extension and its own imports stay in ``sys.modules`` as the real ones, and a
later ``import scipy.special`` runs the package ``__init__``, which finds them there
(tests/privacy/test_binomial.py checks both).
"""

from __future__ import annotations

import os
import sys
import threading
import types
from typing import Any

__all__ = ["ufuncs"]

_LOADING = threading.Lock()


def ufuncs() -> Any:
    """The module ``scipy.special._ufuncs`` (imported on first use, see the module docstring)."""
    loaded = sys.modules.get("scipy.special._ufuncs")
    if loaded is not None:
        return loaded
    with _LOADING:
        if "scipy.special" in sys.modules:  # imported already, or by another thread meanwhile
            from scipy.special import _ufuncs

            return _ufuncs
        import scipy

        package = types.ModuleType("scipy.special")
        package.__path__ = [os.path.join(os.path.dirname(scipy.__file__), "special")]
        sys.modules["scipy.special"] = package
        try:
            from scipy.special import _ufuncs
        finally:
            del sys.modules["scipy.special"]
            if vars(scipy).get("special") is package:  # (getattr would import it: lazy)
                del scipy.special
        return _ufuncs

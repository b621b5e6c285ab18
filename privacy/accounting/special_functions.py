"""scipy.special's ufuncs (Boost's binomial functions, ``expit``, ``log_ndtr``, ...) without the
rest of scipy.

``import scipy.special`` runs the package's ``__init__``, which imports the whole of
scipy.special and its array-API layer: 0.5 s on 2 cores, paid by every process that accounts a
crowd (the analyzer's workers) and by every driver that loads a recipe whose epsilon_local is
solved (the shuffler's and the analyzer's). The ufuncs the accounting uses live in one extension
module, ``scipy.special._ufuncs``, which loads in 0.03 s with the extensions it imports itself;
``scipy.special.expit is _ufuncs.expit`` (the same objects, so the same floats). Some scipy
releases have one of those extensions import a module of another scipy package (a sampled stack
on scipy 1.18 showed ``scipy.linalg``'s ``__init__``, and through it ``scipy._lib._array_api``,
run under the import of ``_ufuncs``: about a second, on every analyzer process).

:func:`ufuncs` imports that extension with every scipy package it meets on the way (other than
those imported already) made a bare stand-in: a module with the package's ``__path__`` and
nothing else, so no package ``__init__`` runs (:func:`import_without_package_inits`). The
stand-ins are removed again at once; the modules imported under them stay in ``sys.modules`` as
the real ones, and a later ``import scipy.special`` (or ``scipy.linalg``) runs the package
``__init__``, which finds them there (tests/privacy/test_binomial.py checks it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["import_without_package_inits", "ufuncs"]

_LOADING = threading.Lock()


class _BarePackage(importlib.abc.Loader):
    """Makes a package module and runs nothing in it (its ``__path__`` comes from the spec)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        return None


class _BarePackages(importlib.abc.MetaPathFinder):
    """While installed, a package under ``root`` imported by the thread that installed it (and
    not imported yet) is found as a bare package: the same ``__path__``, no ``__init__`` run;
    modules are found by the other finders as usual."""

    def __init__(self, root: str) -> None:
        self._prefix = root + "."
        self._thread = threading.get_ident()
        self.made: list[str] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith(self._prefix) or threading.get_ident() != self._thread:
            return None
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is None or real.submodule_search_locations is None:
            return None  # not a package (or not found): imported as usual
        bare = importlib.machinery.ModuleSpec(fullname, _BarePackage(), is_package=True)
        bare.submodule_search_locations = list(real.submodule_search_locations)
        self.made.append(fullname)
        return bare


def import_without_package_inits(name: str) -> ModuleType:
    """Import module ``name`` (``root.package....module``, ``root`` imported as usual) with no
    ``__init__`` run of a package under ``root`` that is not imported yet: each such package is
    a bare stand-in while ``name`` and what it imports are imported, and is removed from
    ``sys.modules`` (and from its parent) afterwards. The modules imported stay imported."""
    root = name.split(".", 1)[0]
    importlib.import_module(root)
    finder = _BarePackages(root)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module(name)
    finally:
        sys.meta_path.remove(finder)
        for package in reversed(finder.made):
            stand_in = sys.modules.get(package)
            if stand_in is None or not isinstance(stand_in.__spec__.loader, _BarePackage):
                continue  # imported for real meanwhile (not by this thread)
            del sys.modules[package]
            parent_name, _, leaf = package.rpartition(".")
            parent = sys.modules.get(parent_name)
            # vars(): getattr would import a lazily loaded subpackage (scipy's __getattr__)
            if parent is not None and vars(parent).get(leaf) is stand_in:
                delattr(parent, leaf)


def ufuncs() -> Any:
    """The module ``scipy.special._ufuncs`` (imported on first use, see the module docstring)."""
    loaded = sys.modules.get("scipy.special._ufuncs")
    if loaded is not None:
        return loaded
    with _LOADING:
        if "scipy.special" in sys.modules:  # imported already, or by another thread meanwhile
            from scipy.special import _ufuncs

            return _ufuncs
        return import_without_package_inits("scipy.special._ufuncs")

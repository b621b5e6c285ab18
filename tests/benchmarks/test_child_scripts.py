"""The scripts benchmarks run in child processes (module-level strings handed to
``benchmarks.common.run_child``) import only names that exist: such a script is never imported
by the suite, so a module moved elsewhere broke ``make bench`` (bench_engines imported
``pipelines.cli`` long after it had become ``pipelines.commandline.main``)."""

from __future__ import annotations

import ast
import importlib
import pkgutil

import pytest

import benchmarks


def _child_scripts() -> list[tuple[str, str, str]]:
    found = []
    for info in pkgutil.iter_modules(benchmarks.__path__):
        module = importlib.import_module(f"benchmarks.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, str) and "\nimport " in value and "from " in value:
                try:
                    ast.parse(value)
                except SyntaxError:
                    continue
                found.append((info.name, name, value))
    return found


SCRIPTS = _child_scripts()


def test_there_are_child_scripts_to_check():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize(
    ("module", "name", "script"), SCRIPTS, ids=[f"{m}.{n}" for m, n, _ in SCRIPTS]
)
def test_a_child_script_imports_names_that_exist(module, name, script):
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(imported, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule

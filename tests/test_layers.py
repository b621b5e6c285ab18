"""Arrows point down (DESIGN.md, Layers): pipelines -> transforms -> (simulators, schemas) -> privacy.

``experiments`` (Section VII of the paper, regenerated) sits beside ``pipelines``: it uses every
layer below and the pipelines themselves (its message-level check runs ``esa run``), and of
``pipelines`` only the ``esa experiment`` command line imports it.

Checked statically from each module's import statements, so a violation fails even if the import
would happen only on a rarely used path.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# For each layer, the project packages it may import.
ALLOWED = {
    "privacy": {"privacy"},
    "schemas": {"schemas", "privacy"},
    "simulators": {"simulators", "schemas", "privacy"},
    "transforms": {"transforms", "simulators", "schemas", "privacy"},
    "pipelines": {"pipelines", "experiments", "transforms", "simulators", "schemas", "privacy"},
    "experiments": {"experiments", "pipelines", "transforms", "simulators", "schemas", "privacy"},
}
# The one module of pipelines/ that may import experiments/.
EXPERIMENT_CLI = "pipelines/experiment.py"
PROJECT = set(ALLOWED)
# privacy/ is pure math: no Beam, no Avro, no file system.
FORBIDDEN_IN_PRIVACY = {
    "apache_beam",
    "fastavro",
    "avro",
    "pyarrow",
    "pathlib",
    "shutil",
    "io",
    "glob",
}


def imported_top_level(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_down(layer):
    offenders = {}
    for path in modules(layer):
        bad = (imported_top_level(path) & PROJECT) - ALLOWED[layer]
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"{layer}/ imports layers above it: {offenders}"


def test_only_the_experiment_command_imports_experiments():
    offenders = [
        str(path.relative_to(ROOT))
        for path in modules("pipelines")
        if "experiments" in imported_top_level(path)
        and str(path.relative_to(ROOT)) != EXPERIMENT_CLI
    ]
    assert not offenders, f"only {EXPERIMENT_CLI} may import experiments/: {offenders}"


def test_privacy_is_pure_math():
    offenders = {}
    for path in modules("privacy"):
        bad = imported_top_level(path) & FORBIDDEN_IN_PRIVACY
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"privacy/ must not touch Beam, Avro or files: {offenders}"


def test_layer_check_detects_a_violation(tmp_path):
    # The checker itself must be able to fail.
    module = tmp_path / "bad.py"
    module.write_text("import apache_beam as beam\nfrom pipelines import cli\n")
    assert imported_top_level(module) == {"apache_beam", "pipelines"}

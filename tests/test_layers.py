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


# ---------------------------------------------------------------------------------------------
# Parties (DESIGN.md, Parties and trust boundaries): the modules each party runs, and what they
# may never load, directly or through anything they import (the transitive closure of module
# imports, function-level imports included; ``if TYPE_CHECKING:`` imports excluded).
# ---------------------------------------------------------------------------------------------

PACKAGES = ("privacy", "schemas", "simulators", "transforms", "pipelines", "experiments")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for inner in ast.walk(child):
                    skipped.add(id(inner))
    return skipped


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Project module -> the project modules it imports (a name imported from a package counts
    as that submodule when it is one)."""
    paths = {module_name(p): p for package in PACKAGES for p in (root / package).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _type_checking_only(tree)
        targets: set[str | None] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in paths else resolve(node.module))
            elif isinstance(node, ast.Import):
                targets.update(
                    resolve(alias.name)
                    for alias in node.names
                    if alias.name.split(".")[0] in PACKAGES
                )
        graph[name] = {target for target in targets if target and target != name}
    return graph


GRAPH = import_graph()


def reachable(module: str, graph: dict[str, set[str]] = GRAPH) -> set[str]:
    seen: set[str] = set()
    stack = [module]
    while stack:
        for target in graph.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


# What can open a sealed payload or read the analyzer's private keys.
OPENS_SEALED = ("schemas.crypto.analyzer_keys", "transforms.analyzer.opening")
SHUFFLER_CODE = (
    "transforms.shuffler",
    "pipelines.shuffle",
    "pipelines.stream_shuffle",
    "pipelines.commandline.shuffle_options",
)
ANALYZER_CODE = (
    "transforms.analyzer",
    "pipelines.analyze",
    "pipelines.stream_analyze",
    "pipelines.commandline.analyze_options",
)
DEVICE_CODE = (
    "transforms.devices",
    "simulators",
    "pipelines.simulate",
    "pipelines.stream_simulate",
)
COLLECTOR_CODE = ("pipelines.collect", "pipelines.collector")

# party -> (its modules, what none of them may reach)
PARTIES = {
    "shuffler": (
        SHUFFLER_CODE + ("pipelines.commandline.shuffler_key_flags",),
        OPENS_SEALED + ANALYZER_CODE + DEVICE_CODE,
    ),
    "analyzer": (
        ANALYZER_CODE
        + (
            "pipelines.release_counts",
            "pipelines.pictures",
            "pipelines.unshard",
            "pipelines.commandline.analyzer_key_flags",
        ),
        SHUFFLER_CODE + DEVICE_CODE,
    ),
    "devices": (
        DEVICE_CODE
        + ("pipelines.commandline.simulate_options", "pipelines.commandline.device_key_flags"),
        SHUFFLER_CODE + ANALYZER_CODE + ("transforms.analyzer.opening",),
    ),
    # The collector in front of a shuffler instance: authenticated identities and sealed bytes.
    "collector": (COLLECTOR_CODE, OPENS_SEALED + ANALYZER_CODE + SHUFFLER_CODE + DEVICE_CODE),
    # The two Prio3 aggregators of the aggregate model: their own keys and the VDAF only.
    "aggregators": (
        ("transforms.aggregators", "pipelines.aggregate"),
        SHUFFLER_CODE + ANALYZER_CODE + DEVICE_CODE,
    ),
    # LDP-SGD's devices and server as transforms; the server opens sealed reports with the
    # analyzer's own code, and shuffling is the shuffler pipeline's job (pipelines/train.py).
    "training (transforms)": (("transforms.training",), SHUFFLER_CODE),
}


def party_violations(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    offenders: dict[str, list[str]] = {}
    for party, (members, forbidden) in PARTIES.items():
        for module in sorted(graph):
            if not _under(module, members):
                continue
            bad = sorted(m for m in reachable(module, graph) if _under(m, forbidden))
            if bad:
                offenders[f"{party}: {module}"] = bad
    return offenders


@pytest.mark.parametrize("party", sorted(PARTIES))
def test_every_party_has_modules(party):
    members, _ = PARTIES[party]
    assert any(_under(module, members) for module in GRAPH), f"{party}: no module matches"


def test_no_party_reaches_across_its_walls():
    """The shuffler loads nothing that opens a sealed payload or reads an analyzer key and no
    analyzer or device code; the analyzer loads no shuffler or device code; device code loads
    no shuffler or analyzer code; training's transforms hold no shuffler of their own."""
    offenders = party_violations(GRAPH)
    assert not offenders, f"imports across a trust boundary: {offenders}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    assert not cycles(GRAPH), f"modules that import each other: {cycles(GRAPH)}"


def test_wall_and_cycle_checks_can_fail():
    graph = {
        "transforms.shuffler.x": {"schemas.helper"},
        "schemas.helper": {"schemas.crypto.analyzer_keys"},
        "schemas.crypto.analyzer_keys": set(),
        "a.one": {"a.two"},
        "a.two": {"a.one"},
    }
    assert "shuffler: transforms.shuffler.x" in party_violations(graph)
    assert cycles(graph) == [["a.one", "a.two"]]

"""Training inherits the core's guarantees (DESIGN.md, Layout): ``esa train`` shuffles only
through the shuffler's pipeline and reads releases only through the analyzer's verified reader.

Checked on the modules themselves (the functions they call are the stages' own objects) and on
their source (no call that lists files, so no message file is found by a glob; no release reader
other than the analyzer's). ``tests/pipelines/test_train_hostile.py`` checks the behaviour.
"""

from __future__ import annotations

import ast
import inspect

import pipelines.train as training
import transforms.training.epochs as epochs
from pipelines import analyze, shuffle
from transforms.analyzer import aggregate
from transforms.shuffler import decide, read, release, sinks, spill, steps
from transforms.shuffler import shuffle as shuffle_transforms

TRAINING_MODULES = (training, epochs)
# Calls that list or match files: a release is read from its verified commit record only.
LISTING_CALLS = {"glob", "rglob", "iglob", "listdir", "scandir", "walk", "match"}
# Readers of a release that skip the analyzer's checks (signature, counts, pinned SHA-256).
RAW_RELEASE_READERS = {"verify_release", "iter_crowds", "read_crowd_table", "release_files"}


def _called_names(module) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Attribute):
                names.add(function.attr)
            elif isinstance(function, ast.Name):
                names.add(function.id)
    return names


def _imported_modules(module) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_training_reads_releases_only_through_the_analyzers_verified_reader():
    assert training.open_release is analyze.open_release
    assert training.pinned_crowd_tables is aggregate.pinned_crowd_tables
    assert training.pinned_crowd_table_records is aggregate.pinned_crowd_table_records
    assert epochs.pinned_message_paths is aggregate.pinned_message_paths
    for module in TRAINING_MODULES:
        called = _called_names(module)
        assert not called & LISTING_CALLS, (
            f"{module.__name__} lists files: {called & LISTING_CALLS}"
        )
        assert not called & RAW_RELEASE_READERS, (
            f"{module.__name__} reads a release around the analyzer: {called & RAW_RELEASE_READERS}"
        )


def test_training_shuffles_only_through_the_shufflers_pipeline():
    assert training.shuffle_pipeline is shuffle
    assert "run" in _called_names(training)
    internals = {
        module.__name__
        for module in (
            shuffle_transforms,
            read,
            release,
            sinks,
            spill,
            steps,
            decide,
        )
    }
    for module in TRAINING_MODULES:
        used = _imported_modules(module) & internals
        assert not used, f"{module.__name__} uses the shuffler's internals: {used}"

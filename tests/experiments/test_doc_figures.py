"""docs/ldp_sgd.md's figures are experiments.doc_figures' output: its privacy figures equal the
accounting today (the ε_c row once said 8.80 where esa train prints 1.51) and its block is what
the generator's parser reads back."""

from __future__ import annotations

import re

import pytest

from experiments import doc_figures

pytestmark = pytest.mark.slow


def _block(name: str) -> str:
    path, _ = doc_figures.DOCS[name]
    text = path.read_text()
    match = re.search(
        rf"doc_figures:{name} begin[^>]*-->\n(.*?)<!-- doc_figures:{name} end", text, re.S
    )
    assert match, f"{path} has no generated {name} block"
    return match.group(1)


def test_ldp_sgd_privacy_figures_are_the_accountings():
    block = _block("ldp_sgd")
    rows = [line for line in block.splitlines() if line.startswith("| eps_c after")]
    grid_row, devices_row = (line.strip("|").split("|")[1:] for line in rows)
    expected = [f"{doc_figures.epsilon_central(eps, 1438):.3g}" for eps in doc_figures.GRID]
    assert [cell.strip() for cell in grid_row] == expected
    expected = [f"{doc_figures.epsilon_central(1.9, n):.3g}" for n in doc_figures.DEVICE_COUNTS]
    assert [cell.strip() for cell in devices_row] == expected
    path, _ = doc_figures.DOCS["ldp_sgd"]
    headline = f"eps_c = {doc_figures.epsilon_central(1.9, 1438):.3g}, delta = 1e-5"
    assert headline in path.read_text()


def test_replace_block_rewrites_only_the_block():
    text = "a\n<!-- doc_figures:x begin (gen) -->\nold\n<!-- doc_figures:x end -->\nb\n"
    assert doc_figures.replace_block(text, "x", "new") == text.replace("old", "new")
    with pytest.raises(ValueError, match="no doc_figures:y block"):
        doc_figures.replace_block(text, "y", "new")

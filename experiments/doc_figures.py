"""Figures quoted in the docs, regenerated from real runs: ``python -m experiments.doc_figures``.

Each doc holds the generated text between ``<!-- doc_figures:NAME begin -->`` and
``<!-- doc_figures:NAME end -->``; this module rewrites it in place (``--check`` only compares),
and tests/experiments/test_doc_figures.py checks the privacy figures against the accounting, so
no figure there is typed by hand.

``ldp_sgd`` (docs/ldp_sgd.md): LDP-SGD on the bundled digits devices (``esa train``'s defaults:
T = 20 epochs, L = 1, radius 5, one report per device, δ = 1e-5), numpy epochs
(``simulators.sgd_devices.reference_training``, what ``esa train``'s grid runs) for the ε_le grid
and for the first n devices, and ε_c after T epochs from ``privacy.accounting.ldp_sgd``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np

from privacy.accounting.ldp_sgd import ldp_sgd_guarantee
from simulators.sgd_data import DeviceData, accuracy, load_device_data
from simulators.sgd_devices import EpochPlan, reference_training

__all__ = ["DOCS", "ldp_sgd_figures", "replace_block"]

ROOT = Path(__file__).resolve().parents[1]
EPOCHS, CLIP_NORM, RADIUS, DELTA = 20, 1.0, 5.0, 1e-5
GRID = (0.5, 1.0, 1.9, 4.0, 8.0)
DEVICE_COUNTS = (360, 720, 1438)
SEEDS = (1, 2, 3)


def _accuracy(data: DeviceData, epsilon: float, seed: int) -> float:
    plan = EpochPlan(1, epsilon, CLIP_NORM, data.dimension, seed=seed)
    theta = reference_training(data, plan, EPOCHS, RADIUS)[-1].theta
    return float(accuracy(theta, data.test_x, data.test_y, data.classes))


def _first(data: DeviceData, devices: int) -> DeviceData:
    x, y = data.examples(0, devices)
    return dataclasses.replace(data, devices=devices, _train_x=x, _train_y=y)


def epsilon_central(epsilon: float, devices: int) -> float:
    return ldp_sgd_guarantee(epsilon, devices, EPOCHS, DELTA).epsilon_central


def ldp_sgd_figures() -> str:
    """The Markdown block of docs/ldp_sgd.md (module docstring)."""
    data = load_device_data("digits")
    n = data.devices
    grid = [(eps, _accuracy(data, eps, 1), epsilon_central(eps, n)) for eps in GRID]
    lines = [
        f"ε_le grid at T = {EPOCHS} on all {n:,} digits devices (seed 1, numpy epochs):",
        "",
        "| eps_le | " + " | ".join(f"{eps:g}" for eps, _, _ in grid) + " |",
        "|---" * (len(grid) + 1) + "|",
        f"| accuracy after {EPOCHS} epochs | "
        + " | ".join(f"{acc:.1%}".replace("%", " %") for _, acc, _ in grid)
        + " |",
        f"| eps_c after {EPOCHS} epochs (delta {DELTA:g}) | "
        + " | ".join(f"{eps_c:.3g}" for _, _, eps_c in grid)
        + " |",
        "",
        f"The first n devices (same test set, eps_le = 1.9, mean of seeds {', '.join(map(str, SEEDS))}):",
        "",
        "| devices n | " + " | ".join(f"{count:,}" for count in DEVICE_COUNTS) + " |",
        "|---" * (len(DEVICE_COUNTS) + 1) + "|",
    ]
    means = [
        float(np.mean([_accuracy(_first(data, count), 1.9, seed) for seed in SEEDS]))
        for count in DEVICE_COUNTS
    ]
    lines.append(
        "| LDP-SGD accuracy | " + " | ".join(f"{m:.1%}".replace("%", " %") for m in means) + " |"
    )
    lines.append(
        f"| eps_c after {EPOCHS} epochs (delta {DELTA:g}) | "
        + " | ".join(f"{epsilon_central(1.9, count):.3g}" for count in DEVICE_COUNTS)
        + " |"
    )
    return "\n".join(lines)


DOCS = {"ldp_sgd": (ROOT / "docs" / "ldp_sgd.md", ldp_sgd_figures)}


def replace_block(text: str, name: str, block: str) -> str:
    """``text`` with the generated block ``name`` replaced by ``block``."""
    pattern = re.compile(
        rf"(<!-- doc_figures:{name} begin[^>]*-->\n)(.*?)(<!-- doc_figures:{name} end -->)", re.S
    )
    if not pattern.search(text):
        raise ValueError(f"no doc_figures:{name} block")
    return pattern.sub(lambda m: m.group(1) + block.rstrip("\n") + "\n" + m.group(3), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.doc_figures")
    parser.add_argument("names", nargs="*", default=sorted(DOCS), help="Blocks to regenerate.")
    parser.add_argument("--check", action="store_true", help="Only compare; exit 1 if stale.")
    args = parser.parse_args(argv)
    stale = []
    for name in args.names:
        path, make = DOCS[name]
        text = path.read_text()
        updated = replace_block(text, name, make())
        if updated != text:
            stale.append(str(path))
            if not args.check:
                path.write_text(updated)
    print(("stale: " if args.check else "rewrote: ") + (", ".join(stale) or "nothing"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

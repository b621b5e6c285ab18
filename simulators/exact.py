"""The exact aggregate simulator: what the analyzer sees, drawn without making messages.

For the one-hot randomizers (k-RAPPOR and its variants, report fragmentation, binary randomized
response, the zero-sum protocol) the released count of every bucket is a sum of independent
binomials given the true counts, S_j = Bin(c_j, p_one) + Bin(n - c_j, p_zero) for attribute
fragmentation (esa-privacy-revisited Section III; Section IV for report fragments). The randomizers
draw these sums directly (``sample_bucket_sums``); this module wraps that draw with the paper's
datasets at their full size (Table II), so the largest setting — 236,559,063 respondents over
2,795,520 buckets — runs in seconds instead of making ~10^10 messages.

The Table II images are not all available (the Map and Child pictures are not redistributable);
``paper_counts`` keeps each dataset's exact grid and respondent total and takes its shape from a
stand-in picture: scikit-image's horse for Horse when installed, generated patterns otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from simulators import images
from simulators.populations import apportion, heavy_hitter_counts


class ExactRandomizer(Protocol):
    domain_size: int

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> Any: ...


@dataclass(frozen=True)
class PaperDataset:
    """One column of Table II (esa-privacy-revisited): grid (None for a plain domain), domain
    size and the number of respondents."""

    name: str
    grid: tuple[int, int] | None
    domain_size: int
    respondents: int

    def __post_init__(self) -> None:
        if self.grid is not None and self.grid[0] * self.grid[1] != self.domain_size:
            raise ValueError(f"{self.name}: grid {self.grid} does not cover {self.domain_size}")


PAPER_DATASETS: dict[str, PaperDataset] = {
    "map": PaperDataset("map", (1365, 2048), 2_795_520, 236_559_063),
    "horse": PaperDataset("horse", (274, 320), 87_680, 1_914_589),
    "child": PaperDataset("child", (721, 497), 358_337, 50_409_435),
    "heavy-hitter": PaperDataset("heavy-hitter", None, 1_778_120, 203_950_512),
}
# Stand-in pictures for the Table II images (the originals are not redistributable).
_STAND_INS = {"map": ("disc",), "horse": ("horse", "disc"), "child": ("gradient",)}


def paper_counts(name: str, seed: int = 0) -> np.ndarray:
    """True counts of a Table II dataset with its exact domain size and respondent total.

    ``heavy-hitter``: the Section VII-A shape (``populations.heavy_hitter_counts``); images: a
    stand-in picture on the dataset's grid, one respondent per unit of luminosity, scaled to the
    dataset's total as the paper scaled the Map (Section VII-B).
    """
    if name not in PAPER_DATASETS:
        raise ValueError(f"unknown paper dataset {name!r}; choose from {', '.join(PAPER_DATASETS)}")
    dataset = PAPER_DATASETS[name]
    if dataset.grid is None:
        return heavy_hitter_counts(dataset.domain_size, dataset.respondents, seed)
    picture = None
    for stand_in in _STAND_INS[name]:
        try:
            picture = images.load_image(stand_in, dataset.grid)
            break
        except ValueError:  # an optional picture that is not installed: take the next one
            continue
    assert picture is not None  # the last stand-in is always a generated one
    return apportion(picture.ravel().astype(np.float64), dataset.respondents)


@dataclass(frozen=True, eq=False)
class ExactAggregate:
    """What the analyzer would see for one window: released bucket sums and the respondents
    (the census count), next to the truth they came from."""

    true_counts: np.ndarray
    bucket_sums: np.ndarray
    respondents: int
    seconds: float

    def estimate(self, randomizer: Any) -> Any:
        """The de-biased histogram (``randomizer.estimate``)."""
        return randomizer.estimate(self.bucket_sums, self.respondents)


def exact_bucket_sums(
    randomizer: ExactRandomizer, true_counts: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Released bucket sums drawn from their exact distribution (the randomizer's binomial sums)."""
    draw = getattr(randomizer, "sample_bucket_sums", None)
    if draw is None:
        raise ValueError(
            f"{type(randomizer).__name__} has no exact aggregate draw; "
            "simulate its messages instead (simulators.fleet)"
        )
    counts = np.asarray(true_counts)
    if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.integer) or np.any(counts < 0):
        raise ValueError("true_counts must be a 1-D array of non-negative integers")
    if counts.size != randomizer.domain_size:
        raise ValueError(
            f"true_counts has {counts.size} buckets, the randomizer's domain has "
            f"{randomizer.domain_size}"
        )
    return np.asarray(draw(counts.astype(np.int64, copy=False), rng), dtype=np.int64)


def simulate_exact(
    randomizer: ExactRandomizer, true_counts: np.ndarray, rng: np.random.Generator
) -> ExactAggregate:
    """One exact aggregate draw, timed."""
    started = time.perf_counter()
    sums = exact_bucket_sums(randomizer, true_counts, rng)
    return ExactAggregate(
        true_counts=np.asarray(true_counts),
        bucket_sums=sums,
        respondents=int(np.sum(true_counts)),
        seconds=time.perf_counter() - started,
    )

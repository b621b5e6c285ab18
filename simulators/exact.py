"""The exact aggregate simulator: what the analyzer sees, drawn without making messages.

For the one-hot randomizers (k-RAPPOR and its variants, report fragmentation, binary randomized
response, the zero-sum protocol) the released count of every bucket is a sum of independent
binomials given the true counts, S_j = Bin(c_j, p_one) + Bin(n - c_j, p_zero) for attribute
fragmentation (esa-privacy-revisited Section III; Section IV for report fragments). The randomizers
draw these sums directly (``sample_bucket_sums``); this module wraps that draw with the paper's
datasets at their full size (Table II), so the largest setting — 236,559,063 respondents over
2,795,520 buckets — runs in seconds instead of making ~10^10 messages.

:data:`PAPER_DATASETS` are the four populations of Table II at the paper's n, d and delta; the
paper's images and browser data are not public, so each dataset keeps its exact grid and
respondent total and takes its shape from a stand-in (scikit-image's moon, horse and camera for
Map, Horse and Child, the ``images`` extra; the Section VII-A shape for the heavy hitters).
``experiments`` (the package) regenerates Section VII's tables on these datasets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from simulators import images
from simulators.populations import PAPER_HEAVY_HITTERS, heavy_hitter_counts, image_counts


class ExactRandomizer(Protocol):
    domain_size: int

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> Any: ...


@dataclass(frozen=True)
class Dataset:
    """One population of Table II (esa-privacy-revisited) at a chosen size.

    ``image`` names the stand-in picture of :mod:`simulators.images` (None for the heavy-hitter
    shape); its luminosity is resized to ``grid`` and apportioned to exactly ``respondents``
    respondents, as the paper scales its Map image by 2.5. ``delta`` is the one of the dataset's
    tables (Tables I, IV, VIII, IX); ``source`` says what stands in for the paper's data.
    """

    key: str
    title: str
    respondents: int
    domain_size: int
    delta: float
    grid: tuple[int, int] | None = None
    image: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not self.key or "/" in self.key:
            raise ValueError(f"key must be a non-empty name without '/', got {self.key!r}")
        if self.respondents < 1:
            raise ValueError(f"respondents must be >= 1, got {self.respondents}")
        if self.domain_size < 2:
            raise ValueError(f"domain_size must be >= 2, got {self.domain_size}")
        if not 0 < self.delta < 0.5:
            raise ValueError(f"delta must be in (0, 0.5), got {self.delta}")
        if self.grid is not None and self.grid[0] * self.grid[1] != self.domain_size:
            raise ValueError(f"grid {self.grid} does not cover domain_size {self.domain_size}")
        if (self.image is None) != (self.grid is None):
            raise ValueError("an image dataset needs both image and grid; others neither")

    @property
    def is_image(self) -> bool:
        return self.image is not None


PAPER_DATASETS: dict[str, Dataset] = {
    "map": Dataset(
        "map",
        "Map",
        respondents=236_559_063,
        domain_size=2_795_520,
        delta=5e-10,
        grid=(1365, 2048),
        image="moon",
        source="stand-in: scikit-image 'moon' resized to 1365x2048 (the paper's phone-location "
        "image is not public)",
    ),
    "horse": Dataset(
        "horse",
        "Horse",
        respondents=1_914_589,
        domain_size=87_680,
        delta=5e-8,
        grid=(274, 320),
        image="horse",
        source="stand-in: scikit-image 'horse' silhouette, inverted (bright horse on black), "
        "resized to 274x320 (the paper's contour drawing is not public)",
    ),
    "child": Dataset(
        "child",
        "Child",
        respondents=50_409_435,
        domain_size=358_337,
        delta=5e-9,
        grid=(721, 497),
        image="camera",
        source="stand-in: scikit-image 'camera' resized to 721x497 (the paper's drawing of a "
        "child is not public); like the paper's, a dense image with mean luminosity about 140",
    ),
    "heavy-hitters": Dataset(
        "heavy-hitters",
        "Heavy-hitter",
        respondents=203_950_512,
        domain_size=1_778_120,
        delta=5e-10,
        source="stand-in: simulators.populations heavy-hitter shape (100 heavy hitters with a "
        "quarter of the mass, power law x^-1.35; the paper's browser data are not public)",
    ),
}


def dataset_counts(dataset: Dataset, seed: int) -> np.ndarray:
    """True respondents per value (int64, length d): the image's luminosity apportioned to n
    (Section VII-B), or the heavy-hitter shape (Section VII-A) drawn with ``seed``."""
    if dataset.is_image:
        luminosity = images.load_image(dataset.image, dataset.grid)
        return image_counts(luminosity, dataset.respondents)
    heavy = min(PAPER_HEAVY_HITTERS, dataset.domain_size)
    return heavy_hitter_counts(dataset.domain_size, dataset.respondents, seed, heavy_hitters=heavy)


def paper_counts(name: str, seed: int = 0) -> np.ndarray:
    """True counts of the Table II dataset ``name`` at its exact domain size and respondents."""
    if name not in PAPER_DATASETS:
        raise ValueError(f"unknown paper dataset {name!r}; choose from {', '.join(PAPER_DATASETS)}")
    return dataset_counts(PAPER_DATASETS[name], seed)


@dataclass(frozen=True, eq=False)
class ExactAggregate:
    """What the analyzer would see for one window: released bucket sums and the respondents
    (what the shufflers' commit records state), next to the truth they came from."""

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

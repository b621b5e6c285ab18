"""Reference values and independent computations shared by the accounting tests."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

# Table II (esa-privacy-revisited): respondents, and delta_c from the table captions.
DATASETS = {
    "map": (236_559_063, 5e-10),
    "horse": (1_914_589, 5e-8),
    "child": (50_409_435, 5e-9),
    "heavy_hitter": (203_950_512, 5e-10),
}


def shuffled_rr_delta(respondents: int, epsilon_rr: float, epsilon: float) -> float:
    """Exact delta(eps) of the shuffled count of n randomized-response bits for one pair of
    neighbouring datasets (the target bit 1 vs 0, all other bits 0), both directions. A lower
    bound on the delta of the mechanism: a claimed (eps, delta) with delta below it is false."""
    q = 1.0 / (1.0 + math.exp(epsilon_rr))
    others = stats.binom.pmf(np.arange(respondents), respondents - 1, q)
    with_one = np.zeros(respondents + 1)
    with_zero = np.zeros(respondents + 1)
    with_one[1:] += (1 - q) * others
    with_one[:-1] += q * others
    with_zero[1:] += q * others
    with_zero[:-1] += (1 - q) * others
    factor = math.exp(epsilon)
    return float(
        max(
            np.maximum(with_one - factor * with_zero, 0).sum(),
            np.maximum(with_zero - factor * with_one, 0).sum(),
        )
    )

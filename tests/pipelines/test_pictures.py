"""Pictures: legible PNGs whose choice of buckets cannot make an unbiased estimate look biased."""

from __future__ import annotations

import numpy as np

from pipelines import pictures
from privacy.rng import seeded_generator


def test_buckets_are_chosen_by_truth_not_by_their_noise():
    rng = seeded_generator(3)
    truth = np.concatenate([np.zeros(5000), np.full(500, 80.0)])
    estimate = truth + rng.normal(0.0, 40.0, truth.size)
    shown = pictures.buckets_to_show(truth, 1000)
    assert shown.size == 1000
    # Every bucket with a large true count is shown; the rest are zero-truth buckets whose errors
    # spread like all errors (sd 40; its estimate's s.e. is 40/sqrt(2m): 4.5 of them, false
    # failure ~7e-6). Choosing by |estimate| would show only the noisiest ones (sd > 100).
    assert set(np.flatnonzero(truth > 0)) <= set(shown.tolist())
    zero_shown = shown[truth[shown] == 0]
    spread = estimate[zero_shown].std(ddof=1)
    assert abs(spread - 40.0) < 4.5 * 40.0 / np.sqrt(2 * zero_shown.size)


def test_estimate_vs_truth_is_a_png_for_small_and_large_domains():
    rng = seeded_generator(4)
    for size in (8, 5000):
        truth = rng.integers(0, 100, size).astype(float)
        estimate = truth + rng.normal(0.0, 5.0, size)
        png = pictures.estimate_vs_truth(
            np.arange(size), estimate, np.full(size, 5.0), truth, "test"
        )
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000

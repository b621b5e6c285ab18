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


def test_pictured_crowds_are_the_first_in_order_streamed_with_repeats():
    """The bounded streaming choice equals sorting every distinct key (repeats: one crowd
    released by several instances) and taking the first ``limit`` of each kind."""
    rng = seeded_generator(8)
    keys = [
        (kind, int(day) * 10, int(day) * 10 + 10, f"ch{int(c)}", "r@1", None if i % 7 == 0 else f"k{i}")
        for i, (kind, day, c) in enumerate(
            zip(rng.choice(["histogram", "longitudinal"], 300), rng.integers(0, 5, 300),
                rng.integers(0, 3, 300), strict=True)
        )
    ]  # fmt: skip
    stream = keys + keys[::-1]  # every crowd twice

    def order(key):
        return (key[3], key[4], key[5] or "", key[1])

    for limit in (0, 5, 24):
        expected = set()
        for kind in ("histogram", "longitudinal"):
            expected |= set(sorted({k for k in keys if k[0] == kind}, key=order)[:limit])
        assert pictures.pictured_crowds(iter(stream), limit) == expected

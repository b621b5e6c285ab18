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


def _crowd_rows(rng, recipes, rows: int, repeats: int) -> list[dict]:
    """Crowd-table rows of ``recipes`` (and of a recipe no book holds), released or withheld,
    with channels and crowd IDs that order differently as code points and as UTF-16 (``"é"``,
    ``"😀"``, ``"ｚ"``), null and empty crowd IDs, and each crowd in ``repeats`` windows."""
    texts = ["a", "Z", "é", "😀", "ｚ", "a😀", "aé", ""]
    day = 86_400_000
    out = []
    for index in range(rows):
        recipe = recipes[int(rng.integers(0, len(recipes)))]
        recipe_id = recipe.id if index % 11 else "no_such_recipe@1"
        crowd = (
            None
            if index % 13 == 0
            else texts[int(rng.integers(0, len(texts)))] + str(int(rng.integers(0, 5)))
        )
        channel = texts[int(rng.integers(0, len(texts)))]
        status = "withheld" if index % 5 == 0 else "released"
        for window in range(repeats):
            start = 1_704_067_200_000 + (index % 3 + window) * day
            out.append({"window_start_ms": start, "window_end_ms": start + day, "instance": 0,
                        "channel": channel, "recipe_id": recipe_id, "crowd_id": crowd,
                        "status": status, "respondents_released": 9, "messages_released": 9})  # fmt: skip
    return out


def test_picture_candidates_hold_the_crowds_chosen_one_by_one():
    """Given the candidates Arrow finds in crowd tables, PicturedCrowds chooses what it does
    given every released crowd of a known recipe: over strings whose code-point order is not
    their UTF-16 one, null and empty crowd IDs, withheld crowds and unknown recipes, crowds
    repeated over windows (longitudinal ones share a key: the selection must then fall back
    to a grouping) and tables of either kind alone."""
    import pyarrow as pa

    from schemas.recipes import load_recipe
    from transforms.analyzer import arithmetic

    histogram, longitudinal = load_recipe("small_one_hot_rappor"), load_recipe("small_longitudinal")
    book = arithmetic.RecipeBook([histogram, longitudinal])
    rng = seeded_generator(21)
    for recipes, rows, repeats in (
        ([histogram, longitudinal], 400, 1),
        ([histogram, longitudinal], 200, 8),
        ([longitudinal], 300, 12),
        ([histogram], 50, 1),
    ):
        crowds = _crowd_rows(rng, recipes, rows, repeats)
        for limit in (0, 1, 5, 24):
            one_by_one = pictures.PicturedCrowds(limit)
            for crowd in crowds:
                recipe = book.get(crowd["recipe_id"])
                if crowd["status"] == "released" and recipe is not None:
                    one_by_one.add(arithmetic.crowd_key(recipe, crowd))
            keys = pictures.picture_candidates(pa.Table.from_pylist(crowds), book, limit)
            assert keys is not None and len(keys) <= 2 * pictures.CANDIDATE_ROWS_PER_CROWD * limit
            assert pictures.pictured_crowds(keys, limit) == one_by_one.chosen()


def test_picture_candidates_leave_to_the_caller_what_arrow_cannot_order():
    """A null channel or recipe, or a longitudinal window whose length overflows: None (the
    caller looks at each crowd)."""
    import pyarrow as pa

    from schemas.recipes import load_recipe
    from transforms.analyzer import arithmetic

    longitudinal = load_recipe("small_longitudinal")
    book = arithmetic.RecipeBook([longitudinal])
    row = {"window_start_ms": 0, "window_end_ms": 86_400_000, "instance": 0, "channel": "c",
           "recipe_id": longitudinal.id, "crowd_id": "x", "status": "released",
           "respondents_released": 9, "messages_released": 9}  # fmt: skip
    assert pictures.picture_candidates(pa.Table.from_pylist([row]), book) == [
        (arithmetic.LONGITUDINAL, 0, 86_400_000, "c", longitudinal.id, "x")
    ]
    for changed in ({"channel": None}, {"recipe_id": None},
                    {"window_start_ms": -(1 << 63), "window_end_ms": (1 << 63) - 1}):  # fmt: skip
        assert pictures.picture_candidates(pa.Table.from_pylist([{**row, **changed}]), book) is None

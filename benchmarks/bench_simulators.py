"""Paper-scale inputs of the exact simulator (esa-privacy-revisited, Table II): the heavy-hitter
population (203,950,512 respondents over 1,778,120 values, VII-A) and one exact aggregate draw of
OneHotRappor over the Map dataset (236,559,063 respondents, 2,795,520 buckets). These were
wall-clock asserts in the unit tests; here they are measured against baselines from the same run:
sorting as many random floats as the population has values (any ranked shape costs that), and one
binomial draw per bucket."""

from __future__ import annotations

import numpy as np

from benchmarks.common import best_seconds
from privacy.randomizers import build_randomizer
from privacy.rng import seeded_generator
from simulators.exact import paper_counts, simulate_exact
from simulators.populations import heavy_hitter_counts

HEAVY_VALUES = 1_778_120
HEAVY_RESPONDENTS = 203_950_512


def run(quick: bool) -> list[dict]:
    repeats = 1 if quick else 3
    scale = 10 if quick else 1
    values, respondents = HEAVY_VALUES // scale, HEAVY_RESPONDENTS // scale
    rng = seeded_generator(11)
    shape = best_seconds(lambda: heavy_hitter_counts(values, respondents, seed=1), repeats)
    ranked = best_seconds(lambda: np.sort(rng.random(values)), repeats)
    rows = [
        {
            "benchmark": "heavy_hitter_counts",
            "metric": "values_per_s",
            "value": values / shape,
            "baseline": values / ranked,
            "ratio": ranked / shape,
            "note": f"{respondents} respondents over {values} values, best of {repeats}; "
            "baseline: np.sort of as many random floats",
        }
    ]
    counts = paper_counts("map")
    if quick:
        counts = counts[: counts.size // scale]
    randomizer = build_randomizer("one_hot_rappor", {"domain_size": counts.size, "epsilon": 8.0})
    draw = best_seconds(lambda: simulate_exact(randomizer, counts, rng), repeats)
    absent = int(counts.sum()) - counts
    binomial = best_seconds(lambda: rng.binomial(absent, randomizer.p_zero), repeats)
    rows.append(
        {
            "benchmark": "simulate_exact_map",
            "metric": "buckets_per_s",
            "value": counts.size / draw,
            "baseline": counts.size / binomial,
            "ratio": binomial / draw,
            "note": f"{int(counts.sum())} respondents x {counts.size} buckets, eps 8, best of "
            f"{repeats}; baseline: one rng.binomial per bucket",
        }
    )
    return rows

"""Local randomizer throughput at the paper's Map setting (Table III, esa-privacy-revisited):
OneHotRappor over 2,795,520 buckets at ε_ℓ = 13.14 (about 6.5 set bits per respondent), and the
exact aggregate simulator ``sample_bucket_sums`` for 236,559,063 respondents. Baselines, measured
in the same run: numpy drawing as many uniform integers as the randomizer emits messages, and
one binomial draw per bucket (the false positives alone)."""

from __future__ import annotations

import numpy as np

from benchmarks.common import best_seconds
from privacy.randomizers import OneHotRappor
from privacy.rng import seeded_generator

MAP_BUCKETS = 2_795_520
MAP_RESPONDENTS = 236_559_063
MAP_EPSILON = 13.14


def run(quick: bool) -> list[dict]:
    respondents, repeats = (100_000, 2) if quick else (1_000_000, 5)
    randomizer = OneHotRappor(MAP_BUCKETS, MAP_EPSILON)
    rng = seeded_generator(2025)
    values = rng.integers(0, MAP_BUCKETS, respondents)
    messages = len(randomizer.randomize(values, rng))
    randomize_seconds = best_seconds(lambda: randomizer.randomize(values, rng), repeats)
    baseline_seconds = best_seconds(lambda: rng.integers(0, MAP_BUCKETS, messages), repeats)
    note = (
        f"OneHotRappor d={MAP_BUCKETS}, eps={MAP_EPSILON}, n={respondents}, "
        f"{messages / respondents:.2f} messages/respondent, best of {repeats}; "
        f"baseline: rng.integers for the same {messages} messages"
    )
    rows = [
        {
            "benchmark": "one_hot_rappor_randomize",
            "metric": metric,
            "value": count / randomize_seconds,
            "baseline": count / baseline_seconds,
            "ratio": baseline_seconds / randomize_seconds,
            "note": note,
        }
        for metric, count in (("respondents_per_s", respondents), ("messages_per_s", messages))
    ]
    # Exact aggregate simulator: the whole Map population in one draw per bucket and bit state.
    true_counts = (
        np.bincount(
            rng.integers(0, MAP_BUCKETS, MAP_RESPONDENTS // 1000), minlength=MAP_BUCKETS
        ).astype(np.int64)
        * 1000
    )
    true_counts[0] += MAP_RESPONDENTS - true_counts.sum()
    sample_seconds = best_seconds(lambda: randomizer.sample_bucket_sums(true_counts, rng), repeats)
    absent = MAP_RESPONDENTS - true_counts
    binomial_seconds = best_seconds(lambda: rng.binomial(absent, randomizer.p_zero), repeats)
    rows.append(
        {
            "benchmark": "one_hot_rappor_sample_bucket_sums",
            "metric": "buckets_per_s",
            "value": MAP_BUCKETS / sample_seconds,
            "baseline": MAP_BUCKETS / binomial_seconds,
            "ratio": binomial_seconds / sample_seconds,
            "note": (
                f"{MAP_RESPONDENTS} respondents x {MAP_BUCKETS} buckets in {sample_seconds:.2f} s "
                f"(two binomials per bucket), best of {repeats}; baseline: one rng.binomial per "
                f"bucket for its false positives alone, Binomial(n - c_j, p_zero)"
            ),
        }
    )
    return rows


if __name__ == "__main__":
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(
            f"{row['benchmark']:36s} {row['metric']:18s} {row['value']:12.4g} vs "
            f"{row['baseline']:12.4g} x{row['ratio']:6.2f}  {row['note']}"
        )

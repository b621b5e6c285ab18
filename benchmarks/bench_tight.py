"""Time of the tight shuffle accountant (variation-ratio reduction, privacy.accounting.tight)
per ``amplify`` (upper bound, the reduction's lower end and the explicit-pair lower bound) and per
``solve`` (eps_l for a target eps_c), beside the FMT numerical bound in the same run (baseline).

Shuffled binary randomized response at eps_0 = 4, delta = 1e-8 (amplify) and eps_c = 0.5,
delta = 1e-8 (solve, one-hot RAPPOR per attribute). Quick mode: n = 1e3, 1e5, 1e7, 1e9, amplify
only above 1e7; full mode: every power of ten from 1e3 to 1e9, both.
"""

from __future__ import annotations

import time

from privacy.accounting import (
    FMT_NUMERICAL,
    ONE_HOT_RAPPOR,
    VARIATION_RATIO,
    fmt_numerical_epsilon,
    solve_epsilon_local,
    tight_bound,
)

DELTA = 1e-8
EPSILON_LOCAL = 4.0
TARGET = 0.5


def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    value = function(*args, **kwargs)
    return time.perf_counter() - started, value


def run(quick: bool) -> list[dict]:
    sizes = (10**3, 10**5, 10**7, 10**9) if quick else tuple(10**k for k in range(3, 10))
    rows = []
    for respondents in sizes:
        seconds, bound = _timed(tight_bound, "binary_rr", EPSILON_LOCAL, respondents, DELTA)
        base_seconds, base = _timed(fmt_numerical_epsilon, EPSILON_LOCAL, respondents, DELTA)
        rows.append(
            {
                "benchmark": f"tight amplify n={respondents:.0e} eps0={EPSILON_LOCAL:g}",
                "metric": "seconds",
                "value": seconds,
                "baseline": base_seconds,
                "ratio": seconds / base_seconds,
                "note": f"upper={bound.upper:.6g} lower={bound.lower:.6g} "
                f"reduction_lower={bound.reduction_lower:.6g}; fmt_numerical={base:.6g}",
            }
        )
        if quick and respondents > 10**7:
            continue
        seconds, solved = _timed(
            solve_epsilon_local, TARGET, respondents, DELTA, ONE_HOT_RAPPOR, bound=VARIATION_RATIO
        )
        base_seconds, base_solved = _timed(
            solve_epsilon_local, TARGET, respondents, DELTA, ONE_HOT_RAPPOR, bound=FMT_NUMERICAL
        )
        rows.append(
            {
                "benchmark": f"tight solve n={respondents:.0e} eps_c={TARGET:g}",
                "metric": "seconds",
                "value": seconds,
                "baseline": base_seconds,
                "ratio": seconds / base_seconds,
                "note": f"eps_l={solved.epsilon_local:.6g} "
                f"(fmt_numerical: {base_solved.epsilon_local:.6g})",
            }
        )
    return rows


if __name__ == "__main__":
    for row in run(quick=False):
        print(row)

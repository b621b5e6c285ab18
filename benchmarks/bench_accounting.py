"""Time of the FMT numerical amplification bound (privacy.accounting.fmt_numerical_epsilon).

The bound evaluates the clone distribution Bin(n-1, e^-eps0) only inside a window holding all but
1e-4 delta of its mass, cut into at most 4096 monotone blocks. Baseline, measured in the same run:
the same window with every clone count evaluated (no blocks), which is exact up to the dropped
tail mass. The reference implementation, which walks every block of the binomial from n/2, does
not finish in minutes at n = 1e8 and is not run.
"""

from __future__ import annotations

import time

from privacy.accounting import fmt_numerical_epsilon

DELTA = 1e-8


def _timed(epsilon_local: float, respondents: int, resolution: int) -> tuple[float, float]:
    started = time.perf_counter()
    value = fmt_numerical_epsilon(epsilon_local, respondents, DELTA, resolution=resolution)
    return time.perf_counter() - started, value


def run(quick: bool) -> list[dict]:
    sizes = (10**4, 10**5) if quick else (10**6, 10**7, 10**8)
    rows = []
    for respondents in sizes:
        for epsilon_local in (1.0, 4.0):
            seconds, value = _timed(epsilon_local, respondents, 4096)
            full_seconds, full_value = _timed(epsilon_local, respondents, 10**9)
            rows.append(
                {
                    "benchmark": f"fmt_numerical n={respondents:.0e} eps0={epsilon_local:g}",
                    "metric": "seconds",
                    "value": seconds,
                    "baseline": full_seconds,
                    "ratio": seconds / full_seconds,
                    "note": f"eps={value:.6g} (every clone count: {full_value:.6g}), "
                    f"delta={DELTA:g}",
                }
            )
    return rows


if __name__ == "__main__":
    for row in run(quick=False):
        print(row)

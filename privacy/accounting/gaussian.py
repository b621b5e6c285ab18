"""The Gaussian-mechanism baseline of the paper's tables ("No LDP" columns).

Two calibrations of the noise sigma for (eps, delta):

* :func:`gaussian_sigma_paper` reproduces the sigma column of Tables I, IV, VIII and IX:
  sigma = (sqrt(L) + sqrt(L + 2 eps)) / (2 eps) with L = ln(1/(2 delta)), the root of
  eps = sqrt(L)/sigma + 1/(2 sigma^2). That is the privacy loss of a sensitivity-1 Gaussian at
  z = sqrt(L) standard deviations; P[Z > sqrt(L)] = delta would need the tail exp(-z^2)/2, not
  the true exp(-z^2/2)/2. So this sigma is not in general (eps, delta)-DP for sensitivity 1: it
  is for small eps (eps = 0.0025, delta = 5e-10 gives 1821 > 1780 exact) but not from about
  eps = 0.05 on (eps = 1, delta = 5e-10: sigma 4.66 < 5.61 exact, and its real delta is 1.1e-7).
  The delta it does give is ``gaussian_delta(sigma, eps)``; :func:`gaussian_baseline` reports
  both. Use it to compare with the paper, never to calibrate noise.
* :func:`gaussian_sigma_exact` is the analytic Gaussian mechanism (Balle and Wang 2018, Theorem
  8): the smallest sigma with gaussian_delta(sigma, eps, sensitivity) <= delta, which is exactly
  (eps, delta)-DP, for any eps > 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from privacy.accounting.core import brent_root, check_delta, check_epsilon
from privacy.accounting.special_functions import ufuncs

__all__ = [
    "GaussianBaseline",
    "gaussian_baseline",
    "gaussian_sigma_paper",
    "gaussian_sigma_exact",
    "gaussian_delta",
]


def gaussian_sigma_paper(epsilon: float, delta: float) -> float:
    """sigma = (sqrt(L) + sqrt(L + 2 eps)) / (2 eps), L = ln(1/(2 delta)): the paper's column."""
    eps = check_epsilon(epsilon, "epsilon")
    d = check_delta(delta)
    if d >= 0.5:
        raise ValueError(f"delta must be < 1/2 for ln(1/(2 delta)) > 0, got {delta!r}")
    level = math.log(1.0 / (2.0 * d))
    return (math.sqrt(level) + math.sqrt(level + 2.0 * eps)) / (2.0 * eps)


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact delta(eps) of the Gaussian mechanism (Balle and Wang 2018, Theorem 8)::

        delta = Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D)

    computed from log Phi so that the difference keeps its digits.
    """
    special = ufuncs()

    s = check_epsilon(sigma, "sigma")
    eps = check_epsilon(epsilon, "epsilon", allow_zero=True)
    sens = check_epsilon(sensitivity, "sensitivity")
    a = sens / (2.0 * s) - eps * s / sens
    b = -sens / (2.0 * s) - eps * s / sens
    log_first = float(special.log_ndtr(a))
    log_second = eps + float(special.log_ndtr(b))
    if log_second >= log_first:
        return 0.0
    return math.exp(log_first) * -math.expm1(log_second - log_first)


def gaussian_sigma_exact(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Analytic Gaussian mechanism (Balle and Wang 2018): the sigma solving
    gaussian_delta(sigma, eps, sensitivity) = delta by root-finding (delta falls as sigma
    grows), rounded up to the first sigma that meets it."""
    eps = check_epsilon(epsilon, "epsilon")
    d = check_delta(delta)
    sens = check_epsilon(sensitivity, "sensitivity")

    def excess(log_sigma: float) -> float:
        value = gaussian_delta(math.exp(log_sigma), eps, sens)
        return math.log(max(value, 1e-320)) - math.log(d)

    low = math.log(sens) - 5.0
    while excess(low) <= 0.0:
        low -= 5.0
    high = math.log(sens) + 1.0
    while excess(high) > 0.0:
        high += 2.0
    root, converged = brent_root(excess, low, high, xtol=1e-14, rtol=1e-14, maxiter=100)
    if not converged:
        raise RuntimeError(
            f"analytic Gaussian sigma: no root after 100 iterations, value is {root:g}"
        )
    sigma = math.exp(root)
    while gaussian_delta(sigma, eps, sens) > d:
        sigma *= 1.0 + 1e-13
    return sigma


@dataclass(frozen=True)
class GaussianBaseline:
    """Both calibrations for one (eps, delta) at the given L2 sensitivity: the paper's sigma, the
    delta it really achieves at that sensitivity (``paper_delta``; it is (eps, delta)-DP only if
    ``paper_delta <= delta``) and the exact analytic sigma."""

    epsilon: float
    delta: float
    sensitivity: float
    sigma_paper: float
    paper_delta: float
    sigma_exact: float

    @property
    def paper_sigma_is_private(self) -> bool:
        return self.paper_delta <= self.delta


def gaussian_baseline(epsilon: float, delta: float, sensitivity: float = 1.0) -> GaussianBaseline:
    """The paper's sigma (for sensitivity 1, scaled by ``sensitivity``), its true delta, and the
    exact analytic-Gaussian sigma."""
    sens = check_epsilon(sensitivity, "sensitivity")
    sigma_paper = gaussian_sigma_paper(epsilon, delta) * sens
    return GaussianBaseline(
        epsilon=float(epsilon),
        delta=float(delta),
        sensitivity=sens,
        sigma_paper=sigma_paper,
        paper_delta=gaussian_delta(sigma_paper, epsilon, sens),
        sigma_exact=gaussian_sigma_exact(epsilon, delta, sens),
    )

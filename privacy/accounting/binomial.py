"""The binomial law's pmf, cdf, sf, ppf and isf as ``scipy.stats.binom`` computes them, without
importing ``scipy.stats`` (about a second of imports, paid by every process that accounts a
crowd; ``scipy.special`` costs half of it, its ufuncs alone about 0.03 s:
``privacy.accounting.special_functions``).

``scipy.stats.binom`` evaluates Boost's binomial functions (``scipy.special.ufuncs()._binom_*``)
inside ``rv_discrete``'s argument handling: a point outside the support has mass 0, the cdf is 1
from n on and the sf 1 below 0, ppf(0) = -1 and ppf(1) = n (isf the other way round), invalid parameters give nan, and the
values are clipped to [0, 1]. The functions here apply the same rules around the same ufuncs
element by element, so they return the same floats bit for bit
(tests/privacy/test_binomial.py compares them over a grid with the edges).
"""

from __future__ import annotations

import numpy as np

from privacy.accounting.special_functions import ufuncs

__all__ = ["Binomial", "pmf", "cdf", "sf", "ppf", "isf", "around", "valid_laws"]


def _arrays(x, n, p) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``x``, ``n``, ``p`` broadcast (each keeps its dtype) and where (n, p) are valid."""
    x, n, p = np.broadcast_arrays(np.asarray(x), np.asarray(n), np.asarray(p))
    valid = (n >= 0) & (n == np.round(n)) & (p >= 0) & (p <= 1)
    return x, n, p, valid


def _result(out: np.ndarray) -> np.ndarray | float:
    return out[()] if out.ndim == 0 else out


def pmf(k, n, p) -> np.ndarray | float:
    """Pr[X = k] for X ~ Bin(n, p); 0 off the integers 0..n."""
    k, n, p, valid = _arrays(k, n, p)
    inside = valid & (k >= 0) & (k <= n) & (np.floor(k) == k)
    out = np.zeros(k.shape)
    out[~valid | np.isnan(k)] = np.nan
    if inside.any():
        out[inside] = np.clip(ufuncs()._binom_pmf(k[inside], n[inside], p[inside]), 0, 1)
    return _result(out)


def cdf(k, n, p) -> np.ndarray | float:
    """Pr[X <= k]."""
    k, n, p, valid = _arrays(k, n, p)
    inside = valid & (k >= 0) & (k < n) & np.isfinite(k)
    out = np.zeros(k.shape)
    out[k >= n] = 1.0
    out[np.isneginf(k)] = 0.0
    out[~valid | np.isnan(k)] = np.nan
    if inside.any():
        values = ufuncs()._binom_cdf(np.floor(k[inside]), n[inside], p[inside])
        out[inside] = np.clip(values, 0, 1)
    return _result(out)


def sf(k, n, p) -> np.ndarray | float:
    """Pr[X > k]."""
    k, n, p, valid = _arrays(k, n, p)
    inside = valid & (k >= 0) & (k < n) & np.isfinite(k)
    out = np.zeros(k.shape)
    out[~valid | np.isnan(k)] = np.nan
    out[((k < 0) | np.isneginf(k)) & valid] = 1.0
    if inside.any():
        values = ufuncs()._binom_sf(np.floor(k[inside]), n[inside], p[inside])
        out[inside] = np.clip(values, 0, 1)
    return _result(out)


def valid_laws(n, p) -> bool:
    """Whether every (n, p) is a binomial law: n a whole number >= 0, p in [0, 1]."""
    n = np.asarray(n, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    return bool(
        (np.mod(n, 1.0) == 0.0).all() and (n >= 0.0).all() and ((p >= 0.0) & (p <= 1.0)).all()
    )


def around(
    k: np.ndarray,
    n: np.ndarray,
    p,
    shifts: tuple[float, ...] = (-1.0, 0.0, 1.0),
    *,
    laws_valid: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(``pmf(k + shift, n, p)`` for each of ``shifts``, stacked as rows, ``sf(k, n, p)``): the
    same floats as those calls, in one pass of each ufunc. Where every k is an integer and every
    (n, p) valid (the shuffle bounds' evaluations, ``variation_ratio`` and ``shuffle``, tens of
    thousands per crowd size) the rules above reduce to a mask, without the calls' general
    argument handling (most of their time on the few hundred points such a call has); other
    arguments go through the calls themselves. ``laws_valid``: :func:`valid_laws` of (n, p)
    when the caller knows it (checked here when None)."""
    k = np.asarray(k, dtype=np.float64)
    points = np.array([k if shift == 0.0 else k + shift for shift in shifts])
    if laws_valid is None:
        laws_valid = valid_laws(n, p)
    if not (laws_valid and (np.mod(k, 1.0) == 0.0).all()):
        return np.asarray(pmf(points, n, p), dtype=np.float64), np.asarray(sf(k, n, p))
    functions = ufuncs()
    inside = (points >= 0.0) & (points <= n)
    masses = np.clip(functions._binom_pmf(np.where(inside, points, 0.0), n, p), 0, 1)
    # sf: 1 below the support, 0 from n on, the ufunc in between.
    between = (k >= 0.0) & (k < n)
    tails = np.clip(functions._binom_sf(np.where(between, k, 0.0), n, p), 0, 1)
    return np.where(inside, masses, 0.0), np.where(between, tails, np.where(k < 0.0, 1.0, 0.0))


def _quantile(q, n, p, ufunc: str, lowest_at: float) -> np.ndarray | float:
    """``_binom_ppf`` or ``_binom_isf`` (``ufunc``) inside (0, 1); -1 at ``q = lowest_at`` and
    n at the other end, as ``rv_discrete`` gives them."""
    q, n, p, valid = _arrays(q, n, p)
    inside = valid & (q > 0) & (q < 1)
    out = np.full(q.shape, np.nan)
    out[(q == lowest_at) & valid] = -1
    top = (q == 1 - lowest_at) & valid
    out[top] = n[top]
    if inside.any():
        solve = getattr(ufuncs(), ufunc)
        out[inside] = solve(q[inside], n[inside], p[inside]) + 0  # as scipy: -0 -> 0
    return _result(out)


def ppf(q, n, p) -> np.ndarray | float:
    """The least k with Pr[X <= k] >= q (-1 at q = 0, n at q = 1)."""
    return _quantile(q, n, p, "_binom_ppf", lowest_at=0.0)


def isf(q, n, p) -> np.ndarray | float:
    """The least k with Pr[X > k] <= q (n at q = 0, -1 at q = 1)."""
    return _quantile(q, n, p, "_binom_isf", lowest_at=1.0)


class Binomial:
    """Bin(n, p) with its parameters fixed (as ``scipy.stats.binom(n, p)``)."""

    def __init__(self, n, p) -> None:
        self.n, self.p = n, p

    def pmf(self, k):
        return pmf(k, self.n, self.p)

    def cdf(self, k):
        return cdf(k, self.n, self.p)

    def sf(self, k):
        return sf(k, self.n, self.p)

    def ppf(self, q):
        return ppf(q, self.n, self.p)

    def isf(self, q):
        return isf(q, self.n, self.p)

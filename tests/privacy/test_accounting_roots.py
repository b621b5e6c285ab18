"""privacy.accounting.core.brent_root returns scipy.optimize.brentq's root bit for bit (the bounds
solved with brentq must not move), and accounting a crowd no longer imports scipy.optimize."""

import math

import numpy as np
import pytest
from scipy import optimize

from privacy.accounting import core, shuffle
from tests.privacy.fresh_imports import ACCOUNTING_A_CROWD, imports_module


def _scipy(function, low, high, xtol, rtol, maxiter):
    root, result = optimize.brentq(
        function, low, high, xtol=xtol, rtol=rtol, maxiter=maxiter, full_output=True, disp=False
    )
    return root, result.converged


def _same(ours, theirs):
    assert ours[1] == theirs[1]
    assert type(ours[0]) is float
    assert math.copysign(1.0, ours[0]) == math.copysign(1.0, theirs[0])
    assert ours[0] == theirs[0] or (math.isnan(ours[0]) and math.isnan(theirs[0]))


def _functions(rng):
    """Smooth, flat, steep, kinked and stepped functions with a sign change on [low, high]."""
    for _ in range(60):
        r, c, s = rng.uniform(-3, 3), rng.uniform(0.01, 5), 10.0 ** rng.uniform(-200, 200)
        low, high = r - rng.uniform(1e-9, 10), r + rng.uniform(1e-9, 10)
        yield lambda x, r=r, c=c: (x - r) ** 3 + c * (x - r), low, high
        yield lambda x, r=r, s=s: s * math.tanh(x - r), low, high
        yield lambda x, r=r, c=c: math.log1p(math.exp(x)) - math.log1p(math.exp(r)), low, high
        yield lambda x, r=r: -math.floor(16 * (x - r)) - 0.5, low, high  # steps, decreasing
        yield lambda x, r=r, c=c: abs(x - r) ** 0.5 * math.copysign(c, x - r), low, high
        yield lambda x, r=r: math.expm1(-(x - r)) ** 3, high, low  # flat at the root, reversed
    # products of the end values that underflow to -0.0 (scipy tests signs, not the product)
    yield lambda x: 1e-170 * (x - 0.3), 0.0, 1.0
    yield lambda x: 1e200 * (x - 0.7), 0.0, 1.0


@pytest.mark.parametrize(
    "xtol, rtol, maxiter",
    [(2e-12, 4 * np.finfo(float).eps, 100), (1e-300, 1e-9, 200), (1e-14, 1e-14, 100),
     (1e-12, 1e-4, 100), (1e-300, 1e-9, 3)],
)  # fmt: skip
def test_roots_match_scipy_bit_for_bit(xtol, rtol, maxiter):
    rng = np.random.default_rng(20261126)
    cases = converged = 0
    for function, low, high in _functions(rng):
        ours = core.brent_root(function, low, high, xtol=xtol, rtol=rtol, maxiter=maxiter)
        _same(ours, _scipy(function, low, high, xtol, rtol, maxiter))
        cases, converged = cases + 1, converged + ours[1]
    assert cases == 362
    # maxiter = 3 leaves most searches unfinished, and the cube flat at its root (60 cases)
    # may run out at the tightest tolerances: the unconverged iterates must match too
    assert (converged < cases / 2) if maxiter == 3 else (converged >= cases - 60)


def test_fmt_numerical_excess_roots_match_scipy():
    """The accounting's own functions: the FMT numerical bound's log excess over delta."""
    for eps0, n, delta in [(8.9, 100_000, 5e-8), (2.0, 1_000, 1e-6), (0.5, 10**7, 1e-12)]:
        window = shuffle._CloneWindow(n, eps0, 1e-4 * delta, 4096)

        def excess(eps, window=window, delta=delta):
            return math.log(max(window.bracket(eps).upper, 1e-300)) - math.log(delta)

        for xtol, rtol in [(1e-12, 1e-8), (1e-300, 1e-12)]:
            ours = core.brent_root(excess, 0.0, eps0, xtol=xtol, rtol=rtol, maxiter=100)
            _same(ours, _scipy(excess, 0.0, eps0, xtol, rtol, 100))


def test_ends_and_refusals_as_scipy():
    assert core.brent_root(lambda x: x, 0.0, 1.0, xtol=1e-12, rtol=1e-9, maxiter=5) == (0.0, True)
    assert core.brent_root(lambda x: x - 1, 0.0, 1.0, xtol=1e-12, rtol=1e-9, maxiter=5) == (
        1.0,
        True,
    )
    refusals = [
        (lambda x: x + 2.0, 0.0, 1.0, 1e-12, 1e-9, "different signs"),
        (lambda x: math.nan if x > 0.2 else x - 1, 0.0, 1.0, 1e-12, 1e-9, "NaN"),
        (lambda x: x - 0.5, 0.0, 1.0, 0.0, 1e-9, "xtol too small"),
        (lambda x: x - 0.5, 0.0, 1.0, 1e-12, 4e-16, "rtol too small"),
    ]
    for function, low, high, xtol, rtol, message in refusals:
        with pytest.raises(ValueError, match=message):
            core.brent_root(function, low, high, xtol=xtol, rtol=rtol, maxiter=50)
        with pytest.raises(ValueError, match=message):
            _scipy(function, low, high, xtol, rtol, 50)


def test_accounting_a_crowd_imports_no_scipy_optimize():
    """The point of the port: the analyzer's privacy report runs without scipy.optimize."""
    assert not imports_module(ACCOUNTING_A_CROWD, "scipy.optimize")

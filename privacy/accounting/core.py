"""Result types, the module error and input validation shared by the accounting functions."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "BoundOutOfRange",
    "CentralGuarantee",
    "PrivacyLoss",
    "LEMMA_II6",
    "THEOREM_III1_EXACT",
    "THEOREM_III1_SIMPLIFIED",
    "FMT_CLOSED_FORM",
    "FMT_NUMERICAL",
    "VARIATION_RATIO",
    "THEOREM_IV2",
    "LOCAL",
    "BASIC_COMPOSITION",
    "ADVANCED_COMPOSITION",
    "BOUND_DESCRIPTIONS",
]

# Names of the bounds, as they appear in results, reports and on the command line.
LEMMA_II6 = "lemma_ii6"
THEOREM_III1_EXACT = "theorem_iii1_exact"
THEOREM_III1_SIMPLIFIED = "theorem_iii1_simplified"
FMT_CLOSED_FORM = "fmt_closed_form"
FMT_NUMERICAL = "fmt_numerical"
VARIATION_RATIO = "variation_ratio"
THEOREM_IV2 = "theorem_iv2"
LOCAL = "local"
BASIC_COMPOSITION = "basic_composition"
ADVANCED_COMPOSITION = "advanced_composition"

BOUND_DESCRIPTIONS: Mapping[str, str] = MappingProxyType(
    {
        LEMMA_II6: "Lemma II.6 (esa-privacy-revisited): shuffled binary randomized response",
        THEOREM_III1_EXACT: "Theorem III.1 (esa-privacy-revisited), exact form via Lemma II.6 "
        "with lambda = 2n/(1+e^eps_l)",
        THEOREM_III1_SIMPLIFIED: "Theorem III.1 (esa-privacy-revisited): "
        "sqrt(64 e^eps_l log(4/delta) / n)",
        FMT_CLOSED_FORM: "Feldman-McMillan-Talwar closed form (samplable-anonymous-aggregation "
        "Theorem 3.1)",
        FMT_NUMERICAL: "Feldman-McMillan-Talwar numerical bound (hockey-stick divergence of the "
        "clone reduction, binomial window plus dropped mass)",
        VARIATION_RATIO: "variation-ratio reduction (Wang et al., VLDB 2024), numerical: "
        "hockey-stick divergence of the reduced pair, binomial window plus dropped mass",
        THEOREM_IV2: "Theorem IV.2 (esa-privacy-revisited): report fragments of attribute-"
        "fragmented k-RAPPOR",
        LOCAL: "the local guarantee itself (no amplification)",
        BASIC_COMPOSITION: "basic composition: epsilons and deltas add up",
        ADVANCED_COMPOSITION: "Theorem II.7 (esa-privacy-revisited), Bun-Steinke advanced "
        "composition",
    }
)


class BoundOutOfRange(ValueError):
    """Parameters lie outside the validity range of the requested bound.

    The message names the violated condition. Outside its conditions a closed form can return a
    number below the true epsilon, so no number is returned at all.
    """


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_epsilon(value: object, name: str, *, allow_zero: bool = False) -> float:
    """A finite epsilon (> 0, or >= 0 with ``allow_zero``) as a float; ValueError naming ``name``."""
    if not _is_real(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    result = float(value)  # type: ignore[arg-type]
    if result < 0 or (result == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return result


def check_delta(value: object, name: str = "delta", *, allow_zero: bool = False) -> float:
    """A probability delta in (0, 1) (or [0, 1) with ``allow_zero``); ValueError naming ``name``."""
    if not _is_real(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    result = float(value)  # type: ignore[arg-type]
    low_ok = result >= 0 if allow_zero else result > 0
    if not low_ok or result >= 1:
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return result


def check_count(value: object, name: str, *, minimum: int = 1) -> int:
    """A whole number >= ``minimum`` (integral floats such as 1e6 are accepted)."""
    if isinstance(value, bool) or not _is_real(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    as_float = float(value)  # type: ignore[arg-type]
    if not math.isfinite(as_float) or as_float != math.floor(as_float):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    result = int(value)  # type: ignore[call-overload]
    if result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return result


@dataclass(frozen=True)
class PrivacyLoss:
    """An (epsilon, delta)-DP guarantee and the bound that produced it."""

    epsilon: float
    delta: float
    bound: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, "epsilon", allow_zero=True))
        if not _is_real(self.delta) or not 0 <= float(self.delta) <= 1:
            raise ValueError(f"delta must be in [0, 1], got {self.delta!r}")
        object.__setattr__(self, "delta", float(self.delta))
        if not isinstance(self.bound, str) or not self.bound:
            raise ValueError(f"bound must be a non-empty string, got {self.bound!r}")


@dataclass(frozen=True)
class CentralGuarantee:
    """The central (epsilon, delta)-DP guarantee of n shuffled epsilon_local-DP reports.

    ``bound`` names the result that produced ``epsilon`` (one of the names in
    ``BOUND_DESCRIPTIONS``); ``details`` holds the bound's inputs and intermediate values (for
    ``amplify``, every candidate bound with its value or the reason it does not apply).
    """

    epsilon: float
    delta: float
    bound: str
    epsilon_local: float
    respondents: int
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, "epsilon", allow_zero=True))
        object.__setattr__(self, "delta", check_delta(self.delta, "delta", allow_zero=True))
        if not isinstance(self.bound, str) or not self.bound:
            raise ValueError(f"bound must be a non-empty string, got {self.bound!r}")
        object.__setattr__(
            self, "epsilon_local", check_epsilon(self.epsilon_local, "epsilon_local")
        )
        object.__setattr__(self, "respondents", check_count(self.respondents, "respondents"))
        if not isinstance(self.details, Mapping):
            raise ValueError(f"details must be a mapping, got {type(self.details).__name__}")
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dictionary (``epsilon_central`` is the central epsilon)."""
        return {
            "epsilon_central": self.epsilon,
            "delta": self.delta,
            "bound": self.bound,
            "bound_description": BOUND_DESCRIPTIONS.get(self.bound, self.bound),
            "epsilon_local": self.epsilon_local,
            "respondents": self.respondents,
            "details": to_plain(self.details),
        }


def to_plain(value: Any) -> Any:
    """Mappings and sequences turned into dicts and lists (for JSON)."""
    if isinstance(value, Mapping):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(item) for item in value]
    if isinstance(value, CentralGuarantee | PrivacyLoss):
        return value.to_dict() if isinstance(value, CentralGuarantee) else vars(value).copy()
    return value


# The smallest relative tolerance Brent's method accepts (scipy.optimize.brentq's, 4 machine eps).
SMALLEST_ROOT_RTOL = 4.0 * 2.220446049250313e-16


def brent_root(
    function: Callable[[float], float],
    low: float,
    high: float,
    *,
    xtol: float,
    rtol: float,
    maxiter: int,
) -> tuple[float, bool]:
    """(root, converged): Brent's method (Brent 1973, ch. 4) on a bracket [low, high] whose ends'
    values differ in sign, in the variant ``scipy.optimize.brentq`` runs (inverse quadratic
    extrapolation, Charles Harris's brentq.c): the same floating-point steps in the same order,
    so the same root bit for bit (tests/privacy/test_accounting_roots.py holds it to scipy's),
    without importing ``scipy.optimize`` (a third of a second, paid by every process that
    accounts a crowd). ``converged`` is False when ``maxiter`` steps did not reach the tolerance
    ``xtol + rtol |x|`` (the last iterate is returned). ValueError for a bracket without a sign
    change, a NaN value or tolerances brentq refuses."""
    if xtol <= 0:
        raise ValueError(f"xtol too small ({xtol:g} <= 0)")
    if rtol < SMALLEST_ROOT_RTOL:
        raise ValueError(f"rtol too small ({rtol:g} < {SMALLEST_ROOT_RTOL:g})")

    def value(x: float) -> float:
        fx = float(function(x))
        if math.isnan(fx):
            raise ValueError(f"The function value at x={x} is NaN; solver cannot continue.")
        return fx

    xtol, rtol = float(xtol), float(rtol)
    xpre, xcur = float(low), float(high)
    xblk = fblk = spre = scur = 0.0
    fpre = value(xpre)
    fcur = value(xcur)
    if fpre * fcur > 0:
        raise ValueError("f(a) and f(b) must have different signs")
    if fpre == 0:
        return xpre, True
    if fcur == 0:
        return xcur, True
    for _ in range(int(maxiter)):
        if fpre != 0 and fcur != 0 and math.copysign(1.0, fpre) != math.copysign(1.0, fcur):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur, True
        bisect = True
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            try:
                if xpre == xblk:  # interpolate
                    stry = -fcur * (xcur - xpre) / (fcur - fpre)
                else:  # extrapolate
                    dpre = (fpre - fcur) / (xpre - xcur)
                    dblk = (fblk - fcur) / (xblk - xcur)
                    stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            except ZeroDivisionError:  # IEEE division gives inf or nan there: no short step
                stry = math.nan
            shorter = abs(spre) if abs(spre) < 3 * abs(sbis) - delta else 3 * abs(sbis) - delta
            if 2 * abs(stry) < shorter:  # good short step
                spre, scur = scur, stry
                bisect = False
        if bisect:
            spre = scur = sbis
        xpre, fpre = xcur, fcur
        xcur += scur if abs(scur) > delta else (delta if sbis > 0 else -delta)
        fcur = value(xcur)
    return xcur, False


def first_nonpositive(
    excess: Callable[[float], float], low: float, high: float, tolerance: float
) -> float:
    """Smallest x in [low, high], to relative ``tolerance`` and on the safe side, with
    excess(x) <= 0 for a non-increasing ``excess`` with excess(high) <= 0. Brent's method finds
    the root; when rounding puts its answer on the wrong side, bisection (at most 200 steps)
    closes in while keeping excess(answer) <= 0, so the search always ends."""
    if excess(low) <= 0.0:
        return low
    root, _ = brent_root(excess, low, high, xtol=1e-300, rtol=max(tolerance, 4e-16), maxiter=200)
    answer = min(root + tolerance * abs(root) + 1e-300, high)
    if excess(answer) <= 0.0:
        return answer
    bad, good = answer, high
    for _ in range(200):
        if good - bad <= tolerance * abs(good):
            break
        middle = 0.5 * (bad + good)
        bad, good = (bad, middle) if excess(middle) <= 0.0 else (middle, good)
    return good


def last_positive(
    excess: Callable[[float], float], low: float, high: float, tolerance: float
) -> float:
    """Largest x in [low, high], to relative ``tolerance`` and on the safe side, with
    excess(x) > 0 for a non-increasing ``excess`` with excess(low) > 0 >= excess(high)
    (bounded like :func:`first_nonpositive`)."""
    root, _ = brent_root(excess, low, high, xtol=1e-300, rtol=max(tolerance, 4e-16), maxiter=200)
    answer = max(root - tolerance * abs(root) - 1e-300, low)
    if excess(answer) > 0.0:
        return answer
    good, bad = low, answer
    for _ in range(200):
        if bad - good <= tolerance * abs(bad):
            break
        middle = 0.5 * (good + bad)
        good, bad = (middle, bad) if excess(middle) > 0.0 else (good, middle)
    return good

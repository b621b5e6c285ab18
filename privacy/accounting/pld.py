"""Composition of several releases through privacy-loss distributions (PLDs).

Each release is either a plain (eps, delta) guarantee (:class:`PrivacyLoss`) or a privacy curve
(:class:`PrivacyCurve`: an upper bound on delta(eps) at every eps, such as the tight shuffle
bound's hockey-stick curve). Google's ``dp-accounting`` turns a guarantee into its pessimistic
PLD (``from_privacy_parameters``) and a curve into the pessimistic "connect-the-dots" PLD of
Doroshenko et al. (2022) on a grid of eps (between grid points the PLD's curve is the chord in
e^eps, above the true curve because hockey-stick curves are convex in e^eps); PLDs compose by
convolution. :func:`compose` also evaluates basic composition (and advanced composition,
Theorem II.7 of esa-privacy-revisited, for k copies of one guarantee) and returns the smallest
eps with the method that gave it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privacy.accounting.core import (
    ADVANCED_COMPOSITION,
    BASIC_COMPOSITION,
    BoundOutOfRange,
    PrivacyLoss,
    check_delta,
    check_epsilon,
)

__all__ = [
    "PLD_COMPOSITION",
    "PrivacyCurve",
    "ComposedGuarantee",
    "compose",
    "compose_prefixes",
    "tight_curve",
]

PLD_COMPOSITION = "pld_composition"

# PLD discretization of the privacy loss (dp-accounting rounds losses up to multiples of it).
_DISCRETIZATION = 1e-4
_GRID_POINTS = 96


@dataclass(frozen=True)
class PrivacyCurve:
    """An upper bound ``delta_of(eps)`` on a release's privacy curve for eps >= 0, and the eps
    beyond which the curve is not needed (``delta_of(top)`` is charged as mass at infinity)."""

    delta_of: Callable[[float], float]
    top: float
    name: str

    def epsilon_for(self, delta: float) -> float:
        """Smallest eps on the curve (by bisection on a grid to 1e-9) with delta_of(eps) <= delta."""
        low, high = 0.0, self.top
        if self.delta_of(low) <= delta:
            return 0.0
        if self.delta_of(high) > delta:
            raise BoundOutOfRange(f"{self.name}: delta {delta:.3g} is below the curve's floor")
        while high - low > 1e-9 * max(high, 1e-9):
            middle = 0.5 * (low + high)
            if self.delta_of(middle) <= delta:
                high = middle
            else:
                low = middle
        return high


@dataclass(frozen=True)
class ComposedGuarantee:
    """(epsilon, delta) of several composed releases and the method that gave it."""

    epsilon: float
    delta: float
    method: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "method": self.method,
            "details": self.details,
        }


def tight_curve(
    randomizer: str, epsilon_local: float, respondents: int, delta_floor: float, **options: Any
) -> PrivacyCurve:
    """The tight shuffle bound's upper privacy curve (variation-ratio reduction) for eps up to
    where its delta falls to ``delta_floor``."""
    from privacy.accounting.tight import WINDOW_SHARE, variation_ratio_epsilon
    from privacy.accounting.variation_ratio import ReducedPair, variation_ratio_parameters

    floor = check_delta(delta_floor, "delta_floor")
    parameters = variation_ratio_parameters(randomizer, epsilon_local, **options)
    pair = ReducedPair(parameters, respondents, WINDOW_SHARE * floor)
    top = variation_ratio_epsilon(parameters, respondents, floor)[1]
    cache: dict[float, float] = {}

    def delta_of(eps: float) -> float:
        if eps not in cache:
            cache[eps] = pair.delta(eps)[1]
        return cache[eps]

    return PrivacyCurve(
        delta_of=delta_of,
        top=max(top, 1e-6),
        name=f"variation_ratio({parameters.name}, eps0={epsilon_local:g}, n={respondents})",
    )


def _pld_of(item: PrivacyLoss | PrivacyCurve):
    from dp_accounting.pld import common, pld_pmf, privacy_loss_distribution

    if isinstance(item, PrivacyLoss):
        return privacy_loss_distribution.from_privacy_parameters(
            common.DifferentialPrivacyParameters(item.epsilon, item.delta), _DISCRETIZATION
        )
    grid = np.unique(np.ceil(np.linspace(0.0, item.top, _GRID_POINTS) / _DISCRETIZATION))
    deltas = np.array([item.delta_of(float(k) * _DISCRETIZATION) for k in grid])
    deltas = np.minimum.accumulate(np.clip(deltas, 0.0, 1.0))
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(_DISCRETIZATION, grid.astype(int), deltas)
    return privacy_loss_distribution.PrivacyLossDistribution(pmf)


def _basic(items: Sequence[PrivacyLoss | PrivacyCurve], delta: float) -> float | None:
    """Basic composition: fixed deltas of plain guarantees, the rest of delta split evenly
    among the curves; None when the plain deltas alone exceed delta."""
    fixed = math.fsum(item.delta for item in items if isinstance(item, PrivacyLoss))
    curves = [item for item in items if isinstance(item, PrivacyCurve)]
    if fixed > delta or (curves and fixed >= delta):
        return None
    share = (delta - fixed) / len(curves) if curves else 0.0
    total = math.fsum(item.epsilon for item in items if isinstance(item, PrivacyLoss))
    for curve in curves:
        try:
            total += curve.epsilon_for(share)
        except BoundOutOfRange:
            return None
    return total


def compose(guarantees: Sequence[PrivacyLoss | PrivacyCurve], delta: float) -> ComposedGuarantee:
    """The (eps, delta) of the composition of ``guarantees`` (any mix of plain guarantees and
    privacy curves), by the best of PLD composition (dp-accounting), basic composition and,
    for k copies of one plain guarantee, advanced composition (Theorem II.7)."""
    from privacy.accounting.composition import compose_advanced

    items = list(guarantees)
    if not items:
        raise ValueError("guarantees must not be empty")
    for index, item in enumerate(items):
        if not isinstance(item, PrivacyLoss | PrivacyCurve):
            raise ValueError(
                f"guarantees[{index}] must be a PrivacyLoss or PrivacyCurve, "
                f"got {type(item).__name__}"
            )
    d = check_delta(delta)
    candidates: dict[str, float | str] = {}
    basic = _basic(items, d)
    candidates[BASIC_COMPOSITION] = basic if basic is not None else "deltas exceed the target"
    plain = [item for item in items if isinstance(item, PrivacyLoss)]
    if len(plain) == len(items) and len({(i.epsilon, i.delta) for i in plain}) == 1:
        k, first = len(plain), plain[0]
        try:
            slack = d - k * first.delta
            if slack <= 0 or first.epsilon == 0:
                raise BoundOutOfRange("no delta left for advanced composition")
            candidates[ADVANCED_COMPOSITION] = compose_advanced(
                first.epsilon, first.delta, k, slack
            ).epsilon
        except BoundOutOfRange as error:
            candidates[ADVANCED_COMPOSITION] = f"not applicable: {error}"
    try:
        total = None
        groups: dict[int, list] = {}
        for item in items:  # identical releases: one PLD, composed with itself
            groups.setdefault(id(item), [item, 0])[1] += 1
        for item, count in groups.values():
            current = _pld_of(item)
            if count > 1:
                current = current.self_compose(count)
            total = current if total is None else total.compose(current)
        value = float(total.get_epsilon_for_delta(d))
        candidates[PLD_COMPOSITION] = value if math.isfinite(value) else "delta below the PLD's"
    except (ValueError, ArithmeticError) as error:
        candidates[PLD_COMPOSITION] = f"not applicable: {error}"
    numbers = {name: v for name, v in candidates.items() if isinstance(v, float)}
    if not numbers:
        raise BoundOutOfRange(f"no composition method applies at delta = {d:.3g}")
    best = min(numbers, key=numbers.get)
    return ComposedGuarantee(
        epsilon=check_epsilon(numbers[best], "epsilon", allow_zero=True),
        delta=d,
        method=best,
        details={"candidates": candidates, "releases": len(items)},
    )


def compose_prefixes(item: PrivacyLoss | PrivacyCurve, count: int, delta: float) -> list[float]:
    """PLD composition of k copies of one release for k = 1..count (one convolution per k): the
    eps at ``delta`` after each release, e.g. per epoch of LDP-SGD or per analysis round."""
    from privacy.accounting.core import check_count

    k = check_count(count, "count")
    d = check_delta(delta)
    single = _pld_of(item)
    total, values = single, []
    for index in range(k):
        if index:
            total = total.compose(single)
        values.append(float(total.get_epsilon_for_delta(d)))
    return values

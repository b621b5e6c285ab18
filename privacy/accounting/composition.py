"""Composition of (epsilon, delta)-DP guarantees."""

from __future__ import annotations

import math
from collections.abc import Iterable

from privacy.accounting.core import (
    ADVANCED_COMPOSITION,
    BASIC_COMPOSITION,
    BoundOutOfRange,
    PrivacyLoss,
    check_count,
    check_delta,
    check_epsilon,
)

__all__ = ["compose_basic", "compose_advanced", "compose_repeated"]


def compose_basic(losses: Iterable[PrivacyLoss]) -> PrivacyLoss:
    """Basic composition: the epsilons add up and so do the deltas (capped at 1)."""
    items = list(losses)
    if not items:
        raise ValueError("losses must not be empty")
    for index, item in enumerate(items):
        if not isinstance(item, PrivacyLoss):
            raise ValueError(f"losses[{index}] must be a PrivacyLoss, got {type(item).__name__}")
    epsilon = math.fsum(item.epsilon for item in items)
    delta = min(math.fsum(item.delta for item in items), 1.0)
    return PrivacyLoss(epsilon=epsilon, delta=delta, bound=BASIC_COMPOSITION)


def compose_advanced(epsilon: float, delta: float, count: int, delta_slack: float) -> PrivacyLoss:
    """Theorem II.7 (esa-privacy-revisited; Bun-Steinke, Corollary 8.11): k adaptively composed
    (eps, delta)-DP algorithms are (eps', delta' + k delta)-DP for every delta' > 0 with::

        eps' = k eps^2 / 2 + sqrt(k) eps sqrt(2 log(sqrt(k pi / 2) eps / delta'))

    The logarithm must be >= 0, i.e. sqrt(k pi / 2) eps >= delta'; otherwise BoundOutOfRange.
    """
    eps = check_epsilon(epsilon, "epsilon")
    d = check_delta(delta, allow_zero=True)
    k = check_count(count, "count")
    slack = check_delta(delta_slack, "delta_slack")
    argument = math.sqrt(k * math.pi / 2.0) * eps / slack
    if argument < 1.0:
        raise BoundOutOfRange(
            "Theorem II.7 needs sqrt(k pi / 2) epsilon / delta' >= 1 (a non-negative logarithm); "
            f"got {argument:.6g}"
        )
    composed = k * eps * eps / 2.0 + math.sqrt(k) * eps * math.sqrt(2.0 * math.log(argument))
    total_delta = slack + k * d
    if total_delta > 1.0:
        raise BoundOutOfRange(f"Theorem II.7: delta' + k delta = {total_delta:.6g} exceeds 1")
    return PrivacyLoss(epsilon=composed, delta=total_delta, bound=ADVANCED_COMPOSITION)


def compose_repeated(epsilon: float, delta: float, count: int, delta_slack: float) -> PrivacyLoss:
    """The tighter of basic composition (k eps, k delta) and Theorem II.7 (eps', delta' + k delta)
    for k copies of one (eps, delta) guarantee; the result names the one used. Basic composition
    wins ties (it spends no extra delta)."""
    eps = check_epsilon(epsilon, "epsilon")
    d = check_delta(delta, allow_zero=True)
    k = check_count(count, "count")
    check_delta(delta_slack, "delta_slack")
    basic = PrivacyLoss(epsilon=k * eps, delta=min(k * d, 1.0), bound=BASIC_COMPOSITION)
    try:
        advanced = compose_advanced(eps, d, k, delta_slack)
    except BoundOutOfRange:
        return basic
    return advanced if advanced.epsilon < basic.epsilon else basic

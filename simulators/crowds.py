"""Natural crowds: each respondent belongs to one crowd (a region, an app version), so shufflers
apply their thresholds crowd by crowd and some crowds are withheld.

A population spec takes three extra keys (``simulators.populations`` parses the rest):
``crowds=C`` (C crowds), ``crowd_exponent=S`` (crowd sizes proportional to rank^-S, as app
versions and regions are: a few large crowds and a long tail; default 1, 0 gives equal sizes) and
``crowd_name=NAME`` (crowd ids ``NAME-00`` .. ``NAME-<C-1>``, zero-padded; default ``crowd``).
For example ``zipf,crowds=12,crowd_exponent=1.2,crowd_name=region``.

Respondent r belongs to the crowd at position pi(r) of the cumulative crowd sizes, pi a seeded
affine permutation of [0, n) (as count populations hand out values,
``simulators.populations.CountsPopulation``): sizes are exact (largest-remainder apportionment),
membership is independent of the respondent's value and of how the population is sharded.
Crowd ids are coarse and non-sensitive by construction: shufflers read them in the clear
(README, *Crowd ids are not blinded*).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simulators.populations import affine_permutation, apportion

__all__ = ["CROWD_KEYS", "CrowdAssignment", "split_crowd_keys"]

CROWD_KEYS = ("crowds", "crowd_exponent", "crowd_name")
MAX_CROWDS = 100_000
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


@dataclass(frozen=True, eq=False)
class CrowdAssignment:
    """``crowds`` crowds over ``respondents`` respondents with sizes ∝ rank^-exponent."""

    crowds: int
    respondents: int
    seed: int
    exponent: float = 1.0
    name: str = "crowd"

    def __post_init__(self) -> None:
        if not 1 <= self.crowds <= MAX_CROWDS:
            raise ValueError(f"population crowds must be in [1, {MAX_CROWDS}], got {self.crowds}")
        if self.respondents < 1:
            raise ValueError(f"crowds need respondents, got {self.respondents}")
        if not (math.isfinite(self.exponent) and self.exponent >= 0):
            raise ValueError(f"crowd_exponent must be finite and >= 0, got {self.exponent}")
        if not _NAME.match(self.name):
            raise ValueError(f"crowd_name must match {_NAME.pattern}, got {self.name!r}")

    @cached_property
    def sizes(self) -> np.ndarray:
        """Respondents per crowd, largest first, summing to ``respondents``."""
        ranks = np.arange(1, self.crowds + 1, dtype=np.float64)
        return apportion(ranks**-self.exponent, self.respondents)

    @cached_property
    def names(self) -> tuple[str, ...]:
        width = len(str(self.crowds - 1))
        return tuple(f"{self.name}-{index:0{width}d}" for index in range(self.crowds))

    @cached_property
    def _cumulative(self) -> np.ndarray:
        return np.cumsum(self.sizes)

    @cached_property
    def _order(self) -> tuple[int, int]:
        return affine_permutation(self.respondents, self.seed, 0xC0D)

    def crowd_of(self, respondents: np.ndarray) -> np.ndarray:
        """The crowd index (into :attr:`names`) of each global respondent index."""
        r = np.asarray(respondents, dtype=np.int64)
        if r.size and (r.min() < 0 or r.max() >= self.respondents):
            raise ValueError(f"respondent outside [0, {self.respondents})")
        a, b = self._order
        positions = (r.astype(np.uint64) * np.uint64(a) + np.uint64(b)) % np.uint64(
            self.respondents
        )
        return np.searchsorted(self._cumulative, positions.astype(np.int64), side="right")


def split_crowd_keys(spec: str) -> tuple[str, dict[str, str]]:
    """``spec`` without its crowd keys, and those keys (module docstring)."""
    head, *parts = [part.strip() for part in spec.split(",")]
    kept, crowd = [head], {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep and key.strip() in CROWD_KEYS:
            if key.strip() in crowd:
                raise ValueError(f"population spec {spec!r} repeats {key.strip()}")
            crowd[key.strip()] = value.strip()
        else:
            kept.append(part)
    if crowd and "crowds" not in crowd:
        raise ValueError(f"population spec {spec!r}: {sorted(crowd)} need crowds=C")
    return ",".join(kept), crowd


def crowd_assignment(keys: dict[str, str], respondents: int, seed: int) -> CrowdAssignment | None:
    """The assignment the crowd keys describe (None without them)."""
    if not keys:
        return None
    try:
        crowds = int(keys["crowds"])
        exponent = float(keys.get("crowd_exponent", "1"))
    except ValueError:
        raise ValueError(
            f"population crowds must be an integer and crowd_exponent a number, got {keys}"
        ) from None
    return CrowdAssignment(
        crowds=crowds,
        respondents=respondents,
        seed=seed,
        exponent=exponent,
        name=keys.get("crowd_name", "crowd"),
    )

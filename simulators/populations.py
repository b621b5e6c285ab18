"""Where respondents' values come from: populations named by a spec string.

A population hands out the values of any respondent range ``[start, stop)`` deterministically from
its seed, without ever holding the whole population:

- *count populations* (``heavy-hitters``, ``image:NAME``) are a histogram of counts; respondent ``r``
  holds the value at position ``pi(r)`` of the cumulative counts (``np.searchsorted``), where ``pi``
  is a seeded affine permutation of ``[0, n)`` so that respondent order is not value order;
- *sampled populations* (``uniform``, ``zipf``) draw values iid, in fixed blocks of
  ``SAMPLING_BLOCK`` respondents, each block from its own ``SeedSequence`` child: a range gives the
  same values however the population is sharded;
- ``longitudinal`` users hold a boolean state over ``d`` periods that changes at most ``k`` times
  (amplification-by-shuffling Section 3, Algorithm 1).

Spec grammar: ``KIND[:VARIANT][,KEY=VALUE]...``, for example ``uniform``, ``zipf,exponent=1.2``,
``heavy-hitters,heavy=100``, ``image:horse``, ``image:disc,size=32x32``, ``longitudinal,changes=1``.
``values:PATH`` reads each respondent's value, in respondent order, from a 1-D integer ``.npy``
file (what devices answered to an interactive query, e.g. ``pipelines/interactive.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from simulators import images

SAMPLING_BLOCK = 1 << 16
MAX_RESPONDENTS = (1 << 32) - 1  # the affine respondent order multiplies in uint64

# Kind -> keys its spec accepts.
POPULATION_KEYS: dict[str, frozenset[str]] = {
    "uniform": frozenset({"domain"}),
    "zipf": frozenset({"domain", "exponent"}),
    "heavy-hitters": frozenset({"domain", "heavy", "exponent", "heavy_fraction"}),
    "image": frozenset({"size"}),
    "longitudinal": frozenset({"periods", "changes"}),
    "values": frozenset(),
}
POPULATION_KINDS = tuple(POPULATION_KEYS)

# esa-privacy-revisited Section VII-A, Table II: ~100 heavy hitters mixed with p(x) ~ x^-1.35.
PAPER_HEAVY_HITTERS = 100
PAPER_POWER_LAW_EXPONENT = 1.35
# The paper does not state the mixture weight; a quarter of the mass on the heavy hitters.
DEFAULT_HEAVY_FRACTION = 0.25
DEFAULT_ZIPF_EXPONENT = 1.1


@dataclass(frozen=True)
class PopulationSpec:
    """A parsed population spec string."""

    kind: str
    variant: str | None = None
    params: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in POPULATION_KEYS:
            raise ValueError(
                f"unknown population {self.kind!r}; choose from {', '.join(POPULATION_KINDS)}"
            )
        unknown = {key for key, _ in self.params} - POPULATION_KEYS[self.kind]
        if unknown:
            allowed = ", ".join(sorted(POPULATION_KEYS[self.kind])) or "none"
            raise ValueError(
                f"population {self.kind!r} does not take {', '.join(sorted(unknown))} "
                f"(allowed: {allowed})"
            )
        if self.kind == "image" and not self.variant:
            raise ValueError("population 'image' needs a name: image:NAME (e.g. image:horse)")
        if self.kind == "values" and not self.variant:
            raise ValueError("population 'values' needs a file: values:PATH.npy")
        if self.kind not in ("image", "values") and self.variant is not None:
            raise ValueError(f"population {self.kind!r} takes no ':{self.variant}' part")

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.params).get(key, default)

    def __str__(self) -> str:
        text = self.kind + (f":{self.variant}" if self.variant else "")
        return ",".join([text, *(f"{key}={value}" for key, value in self.params)])


def parse_population_spec(text: str) -> PopulationSpec:
    """Parse ``KIND[:VARIANT][,KEY=VALUE]...``."""
    parts = [part.strip() for part in text.split(",")]
    if not parts[0]:
        raise ValueError(f"empty population spec {text!r}")
    kind, _, variant = parts[0].partition(":")
    params = []
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"population spec part {part!r} must look like KEY=VALUE")
        params.append((key.strip(), value.strip()))
    if len({key for key, _ in params}) != len(params):
        raise ValueError(f"population spec {text!r} repeats a key")
    return PopulationSpec(kind.strip(), variant.strip() or None, tuple(params))


def block_generator(seed: int, block: int) -> np.random.Generator:
    """The generator of sampling block ``block``: an independent ``SeedSequence`` child of ``seed``."""
    return np.random.Generator(
        np.random.PCG64DXSM(np.random.SeedSequence(seed, spawn_key=(block,)))
    )


def affine_permutation(n: int, seed: int, stream: int) -> tuple[int, int]:
    """(a, b) of the permutation r -> (a r + b) mod n with gcd(a, n) = 1, drawn from ``seed``
    (``stream`` separates the permutations one seed draws for different purposes)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
    if n == 1:
        return 1, 0
    while True:
        a = int(rng.integers(1, n))
        if math.gcd(a, n) == 1:
            return a, int(rng.integers(0, n))


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts proportional to ``weights`` that sum to exactly ``total`` (largest remainder)."""
    weights = np.asarray(weights, dtype=np.float64)
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    mass = weights.sum()
    if weights.size == 0 or not np.isfinite(mass) or mass <= 0 or np.any(weights < 0):
        raise ValueError("weights must be non-negative, finite and not all zero")
    expected = weights * (total / mass)
    counts = np.floor(expected).astype(np.int64)
    remainder = expected - counts
    short = int(total - counts.sum())
    if short > 0:
        counts[np.argpartition(-remainder, short - 1)[:short]] += 1
    elif (
        short < 0
    ):  # float rounding pushed floors over the total: take from the smallest remainders
        candidates = np.flatnonzero(counts > 0)
        counts[candidates[np.argsort(remainder[candidates])[:-short]]] -= 1
    return counts


def heavy_hitter_counts(
    domain_size: int,
    respondents: int,
    seed: int,
    heavy_hitters: int = PAPER_HEAVY_HITTERS,
    exponent: float = PAPER_POWER_LAW_EXPONENT,
    heavy_fraction: float = DEFAULT_HEAVY_FRACTION,
) -> np.ndarray:
    """Counts of the heavy-hitter shape (esa-privacy-revisited Section VII-A, Table II).

    A power law p(rank) ∝ rank^-exponent over the whole domain, mixed with ``heavy_fraction`` of
    the mass spread evenly over its ``heavy_hitters`` top ranks; a seeded permutation maps ranks to
    values. O(domain) work: the paper's 203,950,512 respondents over 1,778,120 values take well
    under a second.
    """
    if domain_size < 1:
        raise ValueError(f"domain_size must be >= 1, got {domain_size}")
    if not 0 <= heavy_hitters <= domain_size:
        raise ValueError(f"heavy must be in [0, domain size {domain_size}], got {heavy_hitters}")
    if not exponent > 0:
        raise ValueError(f"exponent must be > 0, got {exponent}")
    if not 0 <= heavy_fraction < 1 or (heavy_hitters == 0 and heavy_fraction > 0):
        raise ValueError(
            f"heavy_fraction must be in [0, 1) (and 0 without heavy hitters), got {heavy_fraction}"
        )
    ranks = np.arange(1, domain_size + 1, dtype=np.float64)
    by_rank = ranks**-exponent
    by_rank *= (1.0 - heavy_fraction) / by_rank.sum()
    if heavy_hitters:
        by_rank[:heavy_hitters] += heavy_fraction / heavy_hitters
    weights = np.empty(domain_size)
    weights[np.random.default_rng(np.random.SeedSequence(seed)).permutation(domain_size)] = by_rank
    return apportion(weights, respondents)


def image_counts(luminosity: np.ndarray, respondents: int | None = None) -> np.ndarray:
    """Respondents per pixel: one per unit of luminosity (esa-privacy-revisited Section VII-B), in
    row-major pixel order; scaled to ``respondents`` in total when given (like the paper's 2.5x Map)."""
    counts = np.asarray(luminosity, dtype=np.int64).ravel()
    if counts.sum() == 0:
        raise ValueError("the image is entirely black: it has no respondents")
    return counts if respondents is None else apportion(counts, respondents)


class Population:
    """Values of respondents ``[0, size)`` over ``[0, domain_size)``, handed out by range."""

    spec: str
    size: int
    domain_size: int
    #: Shape of one respondent's value: ``()`` for a category, ``(d,)`` for d boolean periods.
    value_shape: tuple[int, ...] = ()

    def values(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def exact_counts(self) -> np.ndarray | None:
        """The true histogram when the population is one (count populations), else ``None``."""
        return None

    def _check_range(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.size:
            raise ValueError(f"respondent range [{start}, {stop}) is outside [0, {self.size})")


@dataclass(frozen=True, eq=False)
class CountsPopulation(Population):
    """A histogram of counts; respondent r holds the value at position pi(r) of the cumulative counts."""

    counts: np.ndarray
    seed: int
    spec: str = "counts"

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts)
        if counts.ndim != 1 or counts.size == 0 or not np.issubdtype(counts.dtype, np.integer):
            raise ValueError("counts must be a non-empty 1-D integer array")
        if np.any(counts < 0):
            raise ValueError("counts must be >= 0")
        if not 1 <= int(counts.sum()) <= MAX_RESPONDENTS:
            raise ValueError(f"counts must total between 1 and {MAX_RESPONDENTS} respondents")
        object.__setattr__(self, "counts", counts.astype(np.int64, copy=False))

    @property
    def size(self) -> int:
        return int(self.cumulative[-1])

    @property
    def domain_size(self) -> int:
        return int(self.counts.size)

    @cached_property
    def cumulative(self) -> np.ndarray:
        return np.cumsum(self.counts)

    @cached_property
    def _order(self) -> tuple[int, int]:
        return affine_permutation(self.size, self.seed, 0xA11)

    def values(self, start: int, stop: int) -> np.ndarray:
        self._check_range(start, stop)
        a, b = self._order
        respondents = np.arange(start, stop, dtype=np.uint64)
        positions = (respondents * np.uint64(a) + np.uint64(b)) % np.uint64(self.size)
        return np.searchsorted(self.cumulative, positions.astype(np.int64), side="right")

    def exact_counts(self) -> np.ndarray:
        return self.counts


@dataclass(frozen=True, eq=False)
class ValuesPopulation(Population):
    """Respondent r holds ``values[r]``: answers that devices computed themselves, in order."""

    values_array: np.ndarray
    domain_size: int
    spec: str = "values"

    def __post_init__(self) -> None:
        values = np.asarray(self.values_array)
        if values.ndim != 1 or values.size == 0 or not np.issubdtype(values.dtype, np.integer):
            raise ValueError("values must be a non-empty 1-D integer array")
        if values.size > MAX_RESPONDENTS:
            raise ValueError(f"values must hold at most {MAX_RESPONDENTS} respondents")
        if values.min() < 0 or values.max() >= self.domain_size:
            raise ValueError(f"values must lie in [0, {self.domain_size})")
        object.__setattr__(self, "values_array", values.astype(np.int64, copy=False))

    @property
    def size(self) -> int:
        return int(self.values_array.size)

    def values(self, start: int, stop: int) -> np.ndarray:
        self._check_range(start, stop)
        return self.values_array[start:stop]

    def exact_counts(self) -> np.ndarray:
        return np.bincount(self.values_array, minlength=self.domain_size)


@dataclass(frozen=True, eq=False)
class _SampledPopulation(Population):
    domain_size: int
    size: int
    seed: int
    spec: str

    def __post_init__(self) -> None:
        if self.domain_size < 1:
            raise ValueError(f"domain_size must be >= 1, got {self.domain_size}")
        if not 1 <= self.size <= MAX_RESPONDENTS:
            raise ValueError(f"respondents must be in [1, {MAX_RESPONDENTS}], got {self.size}")

    def _draw_block(self, rng: np.random.Generator, count: int) -> np.ndarray:
        raise NotImplementedError

    def values(self, start: int, stop: int) -> np.ndarray:
        self._check_range(start, stop)
        if start == stop:
            return self._draw_block(block_generator(self.seed, 0), 0)
        first, last = start // SAMPLING_BLOCK, (stop - 1) // SAMPLING_BLOCK
        blocks = [
            self._draw_block(
                block_generator(self.seed, block),
                min(SAMPLING_BLOCK, self.size - block * SAMPLING_BLOCK),
            )
            for block in range(first, last + 1)
        ]
        offset = first * SAMPLING_BLOCK
        return np.concatenate(blocks)[start - offset : stop - offset]


@dataclass(frozen=True, eq=False)
class UniformPopulation(_SampledPopulation):
    """Values iid uniform over the domain (a flat population)."""

    spec: str = "uniform"

    def _draw_block(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.integers(0, self.domain_size, size=count, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class ZipfPopulation(_SampledPopulation):
    """Values iid from a Zipf law truncated to the domain: p(x) ∝ (x + 1)^-exponent."""

    exponent: float = DEFAULT_ZIPF_EXPONENT
    spec: str = "zipf"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (np.isfinite(self.exponent) and self.exponent > 0):
            raise ValueError(f"exponent must be > 0, got {self.exponent}")

    @cached_property
    def probabilities(self) -> np.ndarray:
        weights = np.arange(1, self.domain_size + 1, dtype=np.float64) ** -self.exponent
        return weights / weights.sum()

    @cached_property
    def _cdf(self) -> np.ndarray:
        cdf = np.cumsum(self.probabilities)
        cdf[-1] = 1.0
        return cdf

    def _draw_block(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.searchsorted(self._cdf, rng.random(count), side="right").astype(np.int64)


@dataclass(frozen=True, eq=False)
class LongitudinalPopulation(_SampledPopulation):
    """Boolean state over ``periods`` periods that changes at most ``max_changes`` times.

    As in amplification-by-shuffling Algorithm 1, the state before period 1 is False, so a user
    who is True at period 1 has used one change. Each user picks a number of changes uniformly in
    ``[0, min(max_changes, periods)]`` and places them at distinct uniformly random periods.
    """

    periods: int = 1
    max_changes: int = 0
    spec: str = "longitudinal"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.periods < 1:
            raise ValueError(f"periods must be >= 1, got {self.periods}")
        if self.max_changes < 0:
            raise ValueError(f"changes must be >= 0, got {self.max_changes}")

    @property
    def value_shape(self) -> tuple[int, ...]:
        return (self.periods,)

    def _draw_block(self, rng: np.random.Generator, count: int) -> np.ndarray:
        d = self.periods
        changes = rng.integers(0, min(self.max_changes, d) + 1, size=count)
        # Change points: the `changes` smallest of d iid keys mark distinct random periods.
        ranks = np.argsort(np.argsort(rng.random((count, d)), axis=1), axis=1)
        flips = ranks < changes[:, None]
        return np.cumsum(flips, axis=1) % 2 == 1


def true_counts(values: np.ndarray, domain_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse truth of a batch of values as ``(period, bucket, count)`` arrays (non-zero rows).

    Categorical values count into period 0; an ``(n, d)`` boolean array counts, per period, the
    users in state False (bucket 0) and True (bucket 1).
    """
    values = np.asarray(values)
    if values.ndim == 1:
        buckets, counts = np.unique(values.astype(np.int64), return_counts=True)
        return np.zeros(buckets.size, dtype=np.int32), buckets, counts.astype(np.int64)
    trues = values.sum(axis=0).astype(np.int64)
    periods = np.repeat(np.arange(values.shape[1], dtype=np.int32), 2)
    buckets = np.tile(np.array([0, 1], dtype=np.int64), values.shape[1])
    counts = np.stack([values.shape[0] - trues, trues], axis=1).ravel()
    keep = counts > 0
    return periods[keep], buckets[keep], counts[keep]


@dataclass(frozen=True)
class PopulationContext:
    """What the recipe fixes about a population: its domain, grid and longitudinal shape."""

    domain_size: int
    grid_shape: tuple[int, int] | None = None
    periods: int | None = None
    max_changes: int | None = None

    def __post_init__(self) -> None:
        if self.domain_size < 1:
            raise ValueError(f"domain_size must be >= 1, got {self.domain_size}")
        if self.grid_shape is not None and math.prod(self.grid_shape) != self.domain_size:
            raise ValueError(
                f"grid_shape {self.grid_shape} does not cover domain_size {self.domain_size}"
            )


def build_population(
    spec: str | PopulationSpec,
    context: PopulationContext,
    respondents: int | None,
    seed: int,
) -> Population:
    """The population a spec names, fitted to the recipe's ``context``.

    ``respondents`` is required except for images, whose natural size is their total luminosity
    (when given, the image's counts are scaled to it).
    """
    parsed = parse_population_spec(spec) if isinstance(spec, str) else spec
    text = str(parsed)
    if respondents is not None and not 1 <= respondents <= MAX_RESPONDENTS:
        raise ValueError(f"respondents must be in [1, {MAX_RESPONDENTS}], got {respondents}")
    if parsed.kind == "values":
        try:
            loaded = np.load(parsed.variant, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise ValueError(f"population values: cannot read {parsed.variant}: {error}") from None
        if respondents is not None and respondents != loaded.size:
            raise ValueError(
                f"population values holds {loaded.size} respondents, not {respondents}"
            )
        return ValuesPopulation(loaded, domain_size=context.domain_size, spec=text)
    if parsed.kind == "image":
        shape = _image_shape(parsed, context)
        luminosity = images.load_image(parsed.variant, shape)
        return CountsPopulation(image_counts(luminosity, respondents), seed=seed, spec=text)
    if respondents is None:
        raise ValueError(f"population {parsed.kind!r} needs a number of respondents")
    if parsed.kind == "longitudinal":
        return _longitudinal(parsed, context, respondents, seed, text)
    domain = _int_param(parsed, "domain", context.domain_size)
    if domain != context.domain_size:
        raise ValueError(
            f"population domain {domain} does not match the recipe's domain {context.domain_size}"
        )
    if parsed.kind == "uniform":
        return UniformPopulation(domain_size=domain, size=respondents, seed=seed, spec=text)
    if parsed.kind == "zipf":
        exponent = _float_param(parsed, "exponent", DEFAULT_ZIPF_EXPONENT)
        return ZipfPopulation(
            domain_size=domain, size=respondents, seed=seed, spec=text, exponent=exponent
        )
    counts = heavy_hitter_counts(
        domain,
        respondents,
        seed,
        heavy_hitters=_int_param(parsed, "heavy", min(PAPER_HEAVY_HITTERS, domain)),
        exponent=_float_param(parsed, "exponent", PAPER_POWER_LAW_EXPONENT),
        heavy_fraction=_float_param(parsed, "heavy_fraction", DEFAULT_HEAVY_FRACTION),
    )
    return CountsPopulation(counts, seed=seed, spec=text)


def _image_shape(parsed: PopulationSpec, context: PopulationContext) -> tuple[int, int]:
    size = parsed.get("size")
    if size is not None:
        shape = images.parse_grid(size)
    elif context.grid_shape is not None:
        shape = context.grid_shape
    else:
        side = math.isqrt(context.domain_size)
        if side * side != context.domain_size:
            raise ValueError(
                f"the recipe's domain {context.domain_size} is not a square grid: "
                f"give the grid as image:{parsed.variant},size=ROWSxCOLS"
            )
        shape = (side, side)
    if shape[0] * shape[1] != context.domain_size:
        raise ValueError(
            f"image grid {shape[0]}x{shape[1]} has {shape[0] * shape[1]} pixels but the recipe's "
            f"domain has {context.domain_size} buckets"
        )
    return shape


def _longitudinal(
    parsed: PopulationSpec, context: PopulationContext, respondents: int, seed: int, text: str
) -> LongitudinalPopulation:
    periods = _int_param(parsed, "periods", context.periods)
    if periods is None:
        raise ValueError("population 'longitudinal' needs periods (from the recipe or periods=D)")
    if context.periods is not None and periods != context.periods:
        raise ValueError(f"periods={periods} does not match the recipe's {context.periods} periods")
    changes = _int_param(parsed, "changes", context.max_changes)
    if changes is None:
        raise ValueError("population 'longitudinal' needs changes=K (at most K changes per user)")
    if context.max_changes is not None and changes > context.max_changes:
        raise ValueError(
            f"changes={changes} exceeds the {context.max_changes} changes the recipe allows"
        )
    return LongitudinalPopulation(
        domain_size=periods,
        size=respondents,
        seed=seed,
        spec=text,
        periods=periods,
        max_changes=changes,
    )


def _int_param(parsed: PopulationSpec, key: str, default: Any) -> Any:
    value = parsed.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"population parameter {key} must be an integer, got {value!r}") from None


def _float_param(parsed: PopulationSpec, key: str, default: float) -> float:
    value = parsed.get(key)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"population parameter {key} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"population parameter {key} must be finite, got {value!r}")
    return number

"""Exact noise and secure permutations for decisions that release data.

Randomized report deletion (Algorithm 3, esa-privacy-revisited) adds Laplace noise to crowd sizes.
Floating-point Laplace samplers leak through the gaps in their output (Mironov 2012), so the
shuffler uses the discrete Laplace (two-sided geometric) distribution instead, sampled exactly
from uniform random integers with the algorithms of Canonne, Kamath and Steinke 2020, "The Discrete
Gaussian for Differential Privacy":

* Algorithm 1 (CKS20): Bernoulli(exp(-gamma)) for rational gamma >= 0, using only
  Bernoulli(num/den) draws, i.e. uniform integers below ``den``;
* Algorithm 2 (CKS20): discrete Laplace with rational scale t/s, P[X = x] proportional to
  exp(-|x| * s / t) exactly.

No floating-point number enters any decision: every scale is a ``fractions.Fraction`` (a float is
converted exactly, ``Fraction(0.3)`` is the binary value of 0.3, not 3/10; pass ``Fraction(3, 10)``
or the string ``"3/10"`` for the decimal value) and every comparison is between integers.

Randomness comes from a :class:`RandomSource`, an object with ``random_bytes(n) -> bytes``:
:func:`os_random_source` reads the operating system's CSPRNG (``os.urandom``) and is the only
source production code should use; :func:`seeded_random_source` is a reproducible source for tests.

Permutations and samples without replacement (:func:`secure_permutation`,
:func:`secure_sample_without_replacement`) tag every element with an independent uniform 64-bit key
from the source and sort by key. Conditioned on the keys being distinct, the order is a uniformly
random permutation (the keys are exchangeable); ties are detected and all keys are redrawn, so the
result is exactly uniform. This was chosen over Fisher-Yates (sequential, one Python call per
element) and over a numpy Generator seeded with 256 secure bits (fast, but its output is a
deterministic function of a state that is not a cryptographic generator's): sorting keys is
vectorized and every bit comes from the CSPRNG.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from typing import Protocol, overload

import numpy as np

__all__ = [
    "RandomSource",
    "os_random_source",
    "seeded_random_source",
    "as_fraction",
    "uniform_below",
    "bernoulli",
    "bernoulli_exp",
    "sample_discrete_laplace",
    "discrete_laplace_scale",
    "discrete_laplace_pmf",
    "secure_permutation",
    "secure_sample_without_replacement",
]

_U64_MAX = np.uint64(2**64 - 1)
# Largest denominator the vectorized paths handle in uint64 arithmetic; larger ones (and the
# astronomically rare loop counters that would overflow) continue in exact Python integers.
_VECTOR_DENOMINATOR_LIMIT = 2**63


class RandomSource(Protocol):
    """Where uniformly random bytes come from."""

    def random_bytes(self, n: int) -> bytes:
        """``n`` independent uniformly random bytes."""
        ...


class _OsRandomSource:
    """The operating system's CSPRNG (``os.urandom``, ``getrandom(2)`` on Linux)."""

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)

    def __repr__(self) -> str:
        return "os_random_source()"


class _SeededRandomSource:
    """Reproducible bytes from a seeded PCG64DXSM stream: for tests and simulations only."""

    _CHUNK = 1 << 16

    def __init__(self, seed: int) -> None:
        self._generator = np.random.Generator(np.random.PCG64DXSM(seed))
        self._seed = seed
        self._buffer = b""
        self._position = 0

    def random_bytes(self, n: int) -> bytes:
        # Served from a buffer: numpy's per-call overhead would dominate small scalar draws.
        if n > self._CHUNK:
            head = self._buffer[self._position :]
            self._buffer, self._position = b"", 0
            return head + self._generator.bytes(n - len(head))
        if self._position + n > len(self._buffer):
            self._buffer = self._buffer[self._position :] + self._generator.bytes(self._CHUNK)
            self._position = 0
        chunk = self._buffer[self._position : self._position + n]
        self._position += n
        return chunk

    def __repr__(self) -> str:
        return f"seeded_random_source({self._seed})"


def os_random_source() -> RandomSource:
    """The production source: the operating system's CSPRNG."""
    return _OsRandomSource()


def seeded_random_source(seed: int) -> RandomSource:
    """A reproducible, NOT secure source for tests (fixed seed, same bytes every run)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return _SeededRandomSource(seed)


def as_fraction(value: int | float | str | Fraction, name: str = "value") -> Fraction:
    """``value`` as an exact rational: floats convert exactly, strings like ``"20/3"`` parse."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        return Fraction(value)
    if isinstance(value, str):
        try:
            return Fraction(value)
        except (ValueError, ZeroDivisionError) as error:
            raise ValueError(f"{name} is not a rational number: {value!r}") from error
    if isinstance(value, np.integer):
        return Fraction(int(value))
    if isinstance(value, np.floating):
        return as_fraction(float(value), name)
    raise ValueError(f"{name} must be an int, float, str or Fraction, got {type(value).__name__}")


# ---------------------------------------------------------------------------------------------
# Uniform integers
# ---------------------------------------------------------------------------------------------


def _uniform_below_scalar(n: int, source: RandomSource) -> int:
    """Exactly uniform on {0, ..., n-1}: draw ceil(log2 n) bits, reject values >= n."""
    if n == 1:
        return 0
    bits = (n - 1).bit_length()
    n_bytes = (bits + 7) // 8
    mask = (1 << bits) - 1
    while True:
        candidate = int.from_bytes(source.random_bytes(n_bytes), "little") & mask
        if candidate < n:
            return candidate


def _random_u64(count: int, source: RandomSource) -> np.ndarray:
    return np.frombuffer(source.random_bytes(8 * count), dtype="<u8").astype(np.uint64)


def _uniform_below_u64(bounds: np.ndarray, source: RandomSource) -> np.ndarray:
    """Exactly uniform integers in {0, ..., bounds[i]-1} for uint64 ``bounds`` in [1, 2**63].

    A 64-bit word r is accepted when r < 2**64 - (2**64 mod d), a multiple of d, so r mod d is
    uniform; each word is rejected with probability < d / 2**64 <= 1/2.
    """
    bounds = np.asarray(bounds, dtype=np.uint64)
    # 2**64 mod d, computed as (2**64 - d) mod d in wrapping uint64 arithmetic.
    remainder = (np.zeros_like(bounds) - bounds) % bounds
    largest_accepted = _U64_MAX - remainder
    result = np.empty(bounds.shape, dtype=np.uint64)
    pending = np.arange(bounds.size)
    while pending.size:
        words = _random_u64(pending.size, source)
        accepted = words <= largest_accepted[pending]
        chosen = pending[accepted]
        result[chosen] = words[accepted] % bounds[chosen]
        pending = pending[~accepted]
    return result


def _uniform_below_power_of_two(n: int, size: int, source: RandomSource) -> np.ndarray:
    """Exactly uniform integers in {0, ..., n-1} for ``n`` = 2**k <= 2**16: the low k bits of
    one little-endian byte (k <= 8) or two per value. Every value of the bytes is kept, so the
    draw is uniform with no rejection, and it reads 1 or 2 bytes of ``source`` per value where
    the general path reads 8 (the shuffler scatters every released message into 2**k slots)."""
    width = 1 if n <= 1 << 8 else 2
    words = np.frombuffer(
        source.random_bytes(width * size), dtype=np.uint8 if width == 1 else "<u2"
    )
    return (words & (n - 1)).astype(np.int64)


@overload
def uniform_below(n: int, source: RandomSource, size: None = None) -> int: ...
@overload
def uniform_below(n: int, source: RandomSource, size: int) -> np.ndarray: ...


def uniform_below(n: int, source: RandomSource, size: int | None = None) -> int | np.ndarray:
    """Exactly uniform integer(s) in {0, ..., n-1} from ``source``.

    With ``size`` an int64 array (``n <= 2**63``); without it a Python int (any ``n``).
    """
    if not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    n = int(n)
    if size is None:
        return _uniform_below_scalar(n, source)
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if n > _VECTOR_DENOMINATOR_LIMIT:
        raise ValueError(f"n must be <= 2**63 when size is given, got {n}")
    if n == 1:
        return np.zeros(size, dtype=np.int64)
    if n & (n - 1) == 0 and n <= 1 << 16:
        return _uniform_below_power_of_two(n, size, source)
    bounds = np.full(size, n, dtype=np.uint64)
    return _uniform_below_u64(bounds, source).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Bernoulli draws
# ---------------------------------------------------------------------------------------------


def _bernoulli_scalar(numerator: int, denominator: int, source: RandomSource) -> bool:
    """Bernoulli(numerator/denominator), 0 <= numerator <= denominator, exactly."""
    return _uniform_below_scalar(denominator, source) < numerator


def _bernoulli_exp_unit_scalar(
    numerator: int, denominator: int, source: RandomSource, k: int = 1
) -> bool:
    """Algorithm 1 (CKS20) for gamma = numerator/denominator in [0, 1], continued from K = k.

    K <- 1; while Bernoulli(gamma/K): K <- K + 1; return K odd. P[K odd] = exp(-gamma).
    """
    while _bernoulli_scalar(numerator, denominator * k, source):
        k += 1
    return k % 2 == 1


def _bernoulli_exp_scalar(gamma: Fraction, source: RandomSource) -> bool:
    """Bernoulli(exp(-gamma)) for rational gamma >= 0 (Algorithm 1, CKS20, with gamma > 1 split
    into floor(gamma) independent Bernoulli(exp(-1)) draws and one for the fractional part)."""
    whole = gamma.numerator // gamma.denominator
    for _ in range(whole):
        if not _bernoulli_exp_unit_scalar(1, 1, source):
            return False
    fractional = gamma - whole
    return _bernoulli_exp_unit_scalar(fractional.numerator, fractional.denominator, source)


def _bernoulli_exp_unit_vector(
    numerators: np.ndarray, denominator: int, source: RandomSource
) -> np.ndarray:
    """Vectorized Algorithm 1 (CKS20): Bernoulli(exp(-numerators[i]/denominator)) for
    0 <= numerators[i] <= denominator; all arithmetic in exact integers."""
    numerators = np.asarray(numerators, dtype=np.uint64)
    size = numerators.size
    loop_counter = np.ones(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        k = loop_counter[pending]
        # Beyond this K the denominator den*K no longer fits uint64 arithmetic; such elements
        # (probability about 1/K! each) continue in Python integers below.
        in_range = k <= (_VECTOR_DENOMINATOR_LIMIT // denominator)
        for index in pending[~in_range]:
            loop_counter[index] = (
                1
                if _bernoulli_exp_unit_scalar(
                    int(numerators[index]), denominator, source, int(loop_counter[index])
                )
                else 2
            )
        pending = pending[in_range]
        if not pending.size:
            break
        bounds = np.uint64(denominator) * loop_counter[pending].astype(np.uint64)
        draws = _uniform_below_u64(bounds, source)
        continues = draws < numerators[pending]
        loop_counter[pending[continues]] += 1
        pending = pending[continues]
    return loop_counter % 2 == 1


@overload
def bernoulli(
    probability: Fraction | int | str, source: RandomSource, size: None = None
) -> bool: ...
@overload
def bernoulli(probability: Fraction | int | str, source: RandomSource, size: int) -> np.ndarray: ...


def bernoulli(
    probability: Fraction | int | float | str, source: RandomSource, size: int | None = None
) -> bool | np.ndarray:
    """Exact Bernoulli(p) for rational p in [0, 1]: uniform_below(den) < num."""
    p = as_fraction(probability, "probability")
    if not 0 <= p <= 1:
        raise ValueError(f"probability must be in [0, 1], got {p}")
    if size is None:
        return _bernoulli_scalar(p.numerator, p.denominator, source)
    if p.denominator > _VECTOR_DENOMINATOR_LIMIT:
        return np.array(
            [_bernoulli_scalar(p.numerator, p.denominator, source) for _ in range(size)]
        )
    return uniform_below(p.denominator, source, size) < p.numerator


@overload
def bernoulli_exp(gamma: Fraction | int | str, source: RandomSource, size: None = None) -> bool: ...
@overload
def bernoulli_exp(gamma: Fraction | int | str, source: RandomSource, size: int) -> np.ndarray: ...


def bernoulli_exp(
    gamma: Fraction | int | float | str, source: RandomSource, size: int | None = None
) -> bool | np.ndarray:
    """Exact Bernoulli(exp(-gamma)) for rational gamma >= 0 (Algorithm 1, CKS20)."""
    g = as_fraction(gamma, "gamma")
    if g < 0:
        raise ValueError(f"gamma must be >= 0, got {g}")
    if size is None:
        return _bernoulli_exp_scalar(g, source)
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    whole = g.numerator // g.denominator
    fractional = g - whole
    result = np.ones(size, dtype=bool)
    alive = np.arange(size)
    for _ in range(whole):
        passed = _bernoulli_exp_unit_vector(np.ones(alive.size, dtype=np.uint64), 1, source)
        result[alive[~passed]] = False
        alive = alive[passed]
    if fractional and alive.size:
        numerators = np.full(alive.size, fractional.numerator, dtype=np.uint64)
        if fractional.denominator > _VECTOR_DENOMINATOR_LIMIT:
            passed = np.array(
                [_bernoulli_exp_scalar(fractional, source) for _ in range(alive.size)], dtype=bool
            )
        else:
            passed = _bernoulli_exp_unit_vector(numerators, fractional.denominator, source)
        result[alive[~passed]] = False
    return result


# ---------------------------------------------------------------------------------------------
# Discrete Laplace
# ---------------------------------------------------------------------------------------------


def discrete_laplace_scale(epsilon: int | float | str | Fraction, sensitivity: int = 1) -> Fraction:
    """The scale ``sensitivity / epsilon`` (exact) of the discrete Laplace mechanism that is
    epsilon-DP for integer queries of the given sensitivity: the pmf ratio of neighbouring outputs
    is exp(sensitivity / scale) = exp(epsilon)."""
    eps = as_fraction(epsilon, "epsilon")
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    if not isinstance(sensitivity, int) or sensitivity < 1:
        raise ValueError(f"sensitivity must be a positive int, got {sensitivity!r}")
    return Fraction(sensitivity) / eps


def discrete_laplace_pmf(
    values: np.ndarray | int, scale: int | float | str | Fraction
) -> np.ndarray:
    """P[X = x] = (1 - q) / (1 + q) * q**|x| with q = exp(-1/scale) (floating point: for tests
    and reports only, never for sampling)."""
    b = float(as_fraction(scale, "scale"))
    q = math.exp(-1.0 / b)
    magnitude = np.abs(np.asarray(values, dtype=np.float64))
    return (1.0 - q) / (1.0 + q) * np.exp(-magnitude / b)


def _discrete_laplace_scalar(t: int, s: int, source: RandomSource) -> int:
    """Algorithm 2 (CKS20): one sample with P[Z = z] proportional to exp(-|z| * s / t)."""
    while True:
        u = _uniform_below_scalar(t, source)
        if not _bernoulli_exp_unit_scalar(u, t, source):
            continue
        v = 0
        while _bernoulli_exp_unit_scalar(1, 1, source):
            v += 1
        y = (u + t * v) // s
        negative = _uniform_below_scalar(2, source) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def _discrete_laplace_vector(t: int, s: int, size: int, source: RandomSource) -> np.ndarray:
    """Vectorized Algorithm 2 (CKS20): every round runs all steps for the samples not yet
    accepted; rejected samples restart from scratch, exactly as in the scalar loop."""
    result = np.zeros(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        u = _uniform_below_u64(np.full(pending.size, t, dtype=np.uint64), source)
        keep = _bernoulli_exp_unit_vector(u, t, source)
        slots, u = pending[keep], u[keep]
        # V: number of successes of Bernoulli(exp(-1)) before the first failure (geometric).
        v = np.zeros(slots.size, dtype=np.int64)
        counting = np.arange(slots.size)
        while counting.size:
            success = _bernoulli_exp_unit_vector(np.ones(counting.size, dtype=np.uint64), 1, source)
            v[counting[success]] += 1
            counting = counting[success]
        negative = _uniform_below_u64(np.full(slots.size, 2, dtype=np.uint64), source) == 1
        y = np.empty(slots.size, dtype=np.int64)
        # X = U + t*V must fit in uint64; V > 2**63/t - 1 has probability about exp(-2**63/t).
        fits = v < (_VECTOR_DENOMINATOR_LIMIT // t) - 1
        x = u[fits] + np.uint64(t) * v[fits].astype(np.uint64)
        y[fits] = (x // np.uint64(s)).astype(np.int64)
        for index in np.flatnonzero(~fits):
            y[index] = (int(u[index]) + t * int(v[index])) // s
        accepted = ~(negative & (y == 0))
        signed = np.where(negative, -y, y)
        result[slots[accepted]] = signed[accepted]
        done = np.zeros(size, dtype=bool)
        done[slots[accepted]] = True
        pending = pending[~done[pending]]
    return result


@overload
def sample_discrete_laplace(
    scale: int | float | str | Fraction, source: RandomSource, size: None = None
) -> int: ...
@overload
def sample_discrete_laplace(
    scale: int | float | str | Fraction, source: RandomSource, size: int
) -> np.ndarray: ...


def sample_discrete_laplace(
    scale: int | float | str | Fraction, source: RandomSource, size: int | None = None
) -> int | np.ndarray:
    """Exact discrete Laplace samples: P[X = x] = (1 - q)/(1 + q) q**|x|, q = exp(-1/scale).

    Algorithm 2 of Canonne, Kamath and Steinke 2020 with scale t/s (rational, > 0). Returns a
    Python int, or an int64 array of ``size`` samples (vectorized over samples).
    """
    b = as_fraction(scale, "scale")
    if b <= 0:
        raise ValueError(f"scale must be > 0, got {b}")
    t, s = b.numerator, b.denominator
    if size is None:
        return _discrete_laplace_scalar(t, s, source)
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if t > _VECTOR_DENOMINATOR_LIMIT // 4 or s > _VECTOR_DENOMINATOR_LIMIT:
        return np.array(
            [_discrete_laplace_scalar(t, s, source) for _ in range(size)], dtype=np.int64
        )
    return _discrete_laplace_vector(t, s, size, source)


# ---------------------------------------------------------------------------------------------
# Permutations and samples without replacement
# ---------------------------------------------------------------------------------------------


def secure_permutation(n: int, source: RandomSource) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` (int64), every bit from ``source``.

    Sorting by i.i.d. uniform 64-bit keys; if any two keys tie (probability < n**2 / 2**65), all
    keys are redrawn, so the permutation is exactly uniform.
    """
    if not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    n = int(n)
    while True:
        keys = _random_u64(n, source)
        order = np.argsort(keys)  # any sort: the order is unique once no two keys tie
        sorted_keys = keys[order]
        if n < 2 or not np.any(sorted_keys[1:] == sorted_keys[:-1]):
            return order.astype(np.int64)


def secure_sample_without_replacement(n: int, m: int, source: RandomSource) -> np.ndarray:
    """``m`` distinct indices drawn uniformly from ``range(n)`` (sorted int64 array).

    The m elements with the smallest uniform 64-bit keys; keys are redrawn when the m-th and
    (m+1)-th smallest tie, so every m-subset is exactly equally likely.
    """
    if not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not isinstance(m, int | np.integer) or not 0 <= m <= n:
        raise ValueError(f"m must be an int in [0, n={n}], got {m!r}")
    n, m = int(n), int(m)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if m == n:
        return np.arange(n, dtype=np.int64)
    while True:
        keys = _random_u64(n, source)
        partitioned = np.argpartition(keys, m)
        largest_chosen = keys[partitioned[:m]].max()
        if keys[partitioned[m:]].min() != largest_chosen:
            return np.sort(partitioned[:m]).astype(np.int64)

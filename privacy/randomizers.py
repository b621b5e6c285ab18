"""Local randomizers: how a device turns its value into randomized messages.

Each randomizer is a frozen, validated dataclass that states the local ε it meets (removal or
replacement LDP, Definitions II.2 and II.4 of esa-privacy-revisited), randomizes many respondents at
once into a :class:`~privacy.messages.MessageBatch`, and de-biases released bucket sums into a
:class:`~privacy.estimators.HistogramEstimate`.

One-hot randomizers emit only the indices of set bits, and their cost is proportional to the bits
emitted, not to the domain size: per respondent, a Binomial(d - 1, p_zero) number of false set bits
is drawn, then that many distinct uniform indices other than the true one (Section II-B,
esa-privacy-revisited: "only the indices of p(d - 1) + (1 - p) bits need be sent").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, ClassVar, Literal

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
    count_mean_sketch_collision_moment,
    count_mean_sketch_estimate,
    debias_one_hot,
    debias_report_fragments,
    debias_zero_sum,
    longitudinal_marginals,
    theorem6_error_bound,
    tree_node_offsets,
)
from privacy.messages import MessageBatch

LdpKind = Literal["removal", "replacement"]
_MESSAGE_COLUMNS = ("respondent", "bucket", "sign", "fragment", "period")

# Per-bit flip probabilities at or above this (or tiny widths) are sampled as dense bit matrices.
_DENSE_FLIP_PROBABILITY = 1 / 16
_DENSE_MAX_WIDTH = 32
# Dense bit matrices are generated in chunks of about this many cells.
_DENSE_CHUNK_CELLS = 1 << 22


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _check_int(obj: object, name: str, minimum: int) -> int:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    _set(obj, name, value)
    return value


def _check_epsilon(obj: object, name: str) -> float:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    _set(obj, name, value)
    return value


def _keep_probability(epsilon: float) -> float:
    """e^ε / (1 + e^ε): randomized response keeps a bit with this probability (Algorithm 1)."""
    return 1.0 / (1.0 + math.exp(-epsilon))


def _flip_probability(epsilon: float) -> float:
    """1 / (1 + e^ε), computed without cancellation for large ε."""
    return 1.0 / (1.0 + math.exp(epsilon))


def _check_values(values: np.ndarray, domain_size: int) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"values must be a 1-D array, got shape {array.shape}")
    if array.size and not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        raise ValueError(f"values must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if array.size and (array.min() < 0 or array.max() >= domain_size):
        raise ValueError(
            f"values must lie in [0, {domain_size}), got [{array.min()}, {array.max()}]"
        )
    return array


def _check_true_counts(true_counts: np.ndarray, domain_size: int) -> np.ndarray:
    counts = np.asarray(true_counts)
    if counts.shape != (domain_size,):
        raise ValueError(f"true_counts must have shape ({domain_size},), got {counts.shape}")
    if counts.size and not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(f"true_counts must be integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64, copy=False)
    if counts.size and counts.min() < 0:
        raise ValueError("true_counts must be non-negative")
    return counts


def _batch(
    respondent: np.ndarray,
    bucket: np.ndarray,
    sign: np.ndarray | None = None,
    fragment: int | np.ndarray = 0,
    period: int | np.ndarray = 0,
) -> MessageBatch:
    size = respondent.size
    return MessageBatch(
        respondent=respondent.astype(np.int64, copy=False),
        bucket=bucket.astype(np.int64, copy=False),
        sign=np.ones(size, np.int8) if sign is None else sign.astype(np.int8, copy=False),
        fragment=np.broadcast_to(np.asarray(fragment, np.int16), (size,)).copy(),
        period=np.broadcast_to(np.asarray(period, np.int32), (size,)).copy(),
    )


# --------------------------------------------------------------------------------------------
# Sparse sampling of set bits
# --------------------------------------------------------------------------------------------


def _sample_distinct_keys(
    counts: np.ndarray, highs: np.ndarray, stride: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """For each row i, ``counts[i]`` distinct integers uniform over subsets of [0, highs[i]).

    Returns (row, key) with key = row * ``stride`` + value, sorted by key (so by row, then
    value). Values are drawn with replacement and duplicates within a row redrawn until none is
    left; the procedure commutes with every permutation of [0, high), so each row's set is
    uniform over all subsets of its size.
    """
    rows = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    if rows.size == 0:
        return rows, np.empty(0, dtype=np.int64)
    if counts.size * stride >= 2**62:
        raise ValueError(
            "too many respondents times domain size for one batch; use smaller batches"
        )
    high = int(highs.max())
    if high > stride:
        raise ValueError("highs must not exceed stride")
    if int(highs.min()) == high:
        keys = rng.integers(0, high, size=rows.size)
    else:
        keys = rng.integers(0, highs[rows])
    keys += rows * stride
    while True:
        keys.sort()
        duplicate = np.flatnonzero(keys[1:] == keys[:-1]) + 1
        if duplicate.size == 0:
            return rows, keys
        duplicate_rows = keys[duplicate] // stride
        keys[duplicate] = duplicate_rows * stride + rng.integers(0, highs[duplicate_rows])


def _bit_flip_messages(
    ones: np.ndarray,
    ones_per_row: np.ndarray,
    width: int,
    p_one: float,
    p_zero: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bit randomized response over ``width`` bits for each row; returns the set bits.

    Row i has the set bits ``ones[start_i : start_i + ones_per_row[i]]`` (ascending). A set bit is
    reported with probability ``p_one``, an unset one with ``p_zero``, independently. Returns
    (row, column) of the reported bits, sorted by row, then column. Cost is proportional to the
    bits reported: Binomial(width - |ones|, p_zero) flipped bits per row, placed uniformly
    without repetition among the unset bits.
    """
    rows = ones_per_row.size
    one_rows = np.repeat(np.arange(rows, dtype=np.int64), ones_per_row)
    if p_zero >= _DENSE_FLIP_PROBABILITY or width <= _DENSE_MAX_WIDTH:
        return _bit_flip_dense(ones, one_rows, rows, width, p_one, p_zero, rng)
    kept = rng.random(ones.size) < p_one
    zeros_per_row = width - ones_per_row
    if rows and int(zeros_per_row.min()) == int(zeros_per_row.max()):
        flips = rng.binomial(int(zeros_per_row[0]), p_zero, size=rows)
    else:
        flips = rng.binomial(zeros_per_row, p_zero)
    flip_rows, flip_keys = _sample_distinct_keys(flips.astype(np.int64), zeros_per_row, width, rng)
    # Map [0, width - |ones|) onto the unset bits: skip each set bit in ascending order (a
    # monotone bijection, so rows stay sorted).
    one_keys = one_rows * width + ones
    one_starts = np.cumsum(ones_per_row) - ones_per_row
    row_ends = np.arange(1, rows + 1, dtype=np.int64) * width
    for rank in range(int(ones_per_row.max()) if rows else 0):
        excluded = row_ends.copy()
        has = np.flatnonzero(ones_per_row > rank)
        excluded[has] = one_keys[one_starts[has] + rank]
        flip_keys += flip_keys >= excluded[flip_rows]
    # Both key arrays are sorted: the stable sort (a merge of two runs) combines them.
    keys = np.concatenate([flip_keys, one_keys[kept]])
    keys.sort(kind="stable")
    key_rows = keys // width  # division by a scalar is fast; numpy's % is not
    return key_rows, keys - key_rows * width


def _bit_flip_dense(
    ones: np.ndarray,
    one_rows: np.ndarray,
    rows: int,
    width: int,
    p_one: float,
    p_zero: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    chunk = max(1, _DENSE_CHUNK_CELLS // width)
    out_rows, out_columns = [], []
    one_bounds = np.searchsorted(one_rows, np.arange(0, rows + chunk, chunk))
    for index, start in enumerate(range(0, rows, chunk)):
        stop = min(rows, start + chunk)
        bits = rng.random((stop - start, width)) < p_zero
        low, high = one_bounds[index], one_bounds[index + 1]
        bits[one_rows[low:high] - start, ones[low:high]] = rng.random(high - low) < p_one
        row, column = np.nonzero(bits)
        out_rows.append(row + start)
        out_columns.append(column)
    if not out_rows:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return (
        np.concatenate(out_rows).astype(np.int64),
        np.concatenate(out_columns).astype(np.int64),
    )


def _one_hot_messages(
    columns: np.ndarray, width: int, p_one: float, p_zero: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_bit_flip_messages` for one-hot rows: row i has its single set bit at columns[i]."""
    return _bit_flip_messages(columns, np.ones(columns.size, np.int64), width, p_one, p_zero, rng)


def _randomized_response_sums(
    set_bits: np.ndarray,
    bits: int | np.ndarray,
    p_one: float,
    p_zero: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Sums of ``bits`` independently randomized bits of which ``set_bits`` are set, per entry:
    Binomial(set_bits, p_one) + Binomial(bits - set_bits, p_zero) (int64)."""
    return (rng.binomial(set_bits, p_one) + rng.binomial(bits - set_bits, p_zero)).astype(np.int64)


# --------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------


class LocalRandomizer:
    """Common surface of all randomizers (see the module docstring)."""

    name: ClassVar[str]
    payload_kind: ClassVar[str]
    ldp_kind: ClassVar[LdpKind]

    @property
    def epsilon_local(self) -> float:
        raise NotImplementedError

    @property
    def message_domain_size(self) -> int:
        raise NotImplementedError

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        raise NotImplementedError

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        raise NotImplementedError

    def to_params(self) -> dict[str, Any]:
        """Constructor parameters as plain Python values; ``build_randomizer`` inverts this."""
        return {field.name: getattr(self, field.name) for field in fields(self)}  # type: ignore[arg-type]

    def _check_bucket_sums(self, bucket_sums: np.ndarray) -> np.ndarray:
        sums = np.asarray(bucket_sums)
        if sums.shape != (self.message_domain_size,):
            raise ValueError(
                f"bucket_sums must have shape ({self.message_domain_size},), got {sums.shape}"
            )
        return sums


class _EpsilonRandomizedResponse(LocalRandomizer):
    """Bits kept with probability e^ε/(1+e^ε) and flipped otherwise (Algorithm 1,
    esa-privacy-revisited): a set bit is reported with ``p_one``, an unset one with ``p_zero``."""

    epsilon: float

    @property
    def epsilon_local(self) -> float:
        return self.epsilon

    @property
    def p_one(self) -> float:
        """Probability that a set bit (the respondent's own) is reported set."""
        return _keep_probability(self.epsilon)

    @property
    def p_zero(self) -> float:
        """Probability that an unset bit is reported set."""
        return _flip_probability(self.epsilon)


@dataclass(frozen=True)
class _OneHotBitFlip(_EpsilonRandomizedResponse):
    """Per-bit randomized response on the one-hot vector of a value, emitting set-bit indices."""

    domain_size: int
    epsilon: float

    payload_kind: ClassVar[str] = "bucket"

    def __post_init__(self) -> None:
        _check_int(self, "domain_size", 1)
        _check_epsilon(self, "epsilon")

    @property
    def message_domain_size(self) -> int:
        return self.domain_size

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        values = _check_values(values, self.domain_size)
        return _batch(*_one_hot_messages(values, self.domain_size, self.p_one, self.p_zero, rng))

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        return debias_one_hot(
            self._check_bucket_sums(bucket_sums), respondents, self.p_one, self.p_zero
        )

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Released bucket sums drawn from their exact distribution, without making messages.

        S_j = Binomial(c_j, p_one) + Binomial(n - c_j, p_zero), independent across buckets.
        """
        counts = _check_true_counts(true_counts, self.domain_size)
        return _randomized_response_sums(counts, int(counts.sum()), self.p_one, self.p_zero, rng)

    def expected_messages_per_respondent(self) -> float:
        """p_one + (d - 1) p_zero set bits (Section II-B, esa-privacy-revisited)."""
        return self.p_one + (self.domain_size - 1) * self.p_zero


# --------------------------------------------------------------------------------------------
# Randomizers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BinaryRandomizedResponse(_EpsilonRandomizedResponse):
    """Randomized response on one boolean (values 0 = false, 1 = true; domain_size 2).

    The randomized bit is 1 with probability e^ε/(1+e^ε) if the value is 1 and 1/(1+e^ε) if it is
    0. It is sent as a one-hot vector over a single bucket: a message (bucket 0) only when the
    randomized bit is 1, nothing otherwise, so message_domain_size is 1. Replacement ε-LDP.
    """

    epsilon: float

    name: ClassVar[str] = "binary_rr"
    payload_kind: ClassVar[str] = "bucket"
    ldp_kind: ClassVar[LdpKind] = "replacement"

    def __post_init__(self) -> None:
        _check_epsilon(self, "epsilon")

    @property
    def domain_size(self) -> int:
        return 2

    @property
    def message_domain_size(self) -> int:
        return 1

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        values = _check_values(values, 2)
        probability = np.where(values == 1, self.p_one, self.p_zero)
        respondents = np.flatnonzero(rng.random(values.size) < probability)
        return _batch(respondents, np.zeros(respondents.size, np.int64))

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        """Counts of [false, true]: ĉ_1 from the one bucket (Section III), ĉ_0 = n - ĉ_1."""
        ones = debias_one_hot(
            self._check_bucket_sums(bucket_sums), respondents, self.p_one, self.p_zero
        )
        n = ones.respondents
        return HistogramEstimate(
            np.array([n - ones.estimate[0], ones.estimate[0]]),
            np.repeat(ones.stderr, 2),
            n,
        )

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The one bucket sum, Binomial(c_1, p_one) + Binomial(c_0, p_zero); true_counts = [c_0, c_1]."""
        counts = _check_true_counts(true_counts, 2)
        return _randomized_response_sums(
            counts[1:], int(counts.sum()), self.p_one, self.p_zero, rng
        )

    def expected_messages_per_respondent(self, fraction_true: float) -> float:
        """Messages per respondent when a fraction ``fraction_true`` of them holds 1."""
        if not (0.0 <= fraction_true <= 1.0):
            raise ValueError(f"fraction_true must be in [0, 1], got {fraction_true}")
        return self.p_zero + (self.p_one - self.p_zero) * fraction_true


@dataclass(frozen=True)
class OneHotRappor(_OneHotBitFlip):
    """att-frag(R_k-RAPPOR), Algorithm 1 (esa-privacy-revisited).

    Every bit of the one-hot vector goes through randomized response that keeps it with
    probability e^ε/(1+e^ε); each set bit is sent as its own message. Removal ε-LDP with respect to
    the randomized all-zeros vector (Theorem III.1).
    """

    name: ClassVar[str] = "one_hot_rappor"
    ldp_kind: ClassVar[LdpKind] = "removal"


@dataclass(frozen=True)
class SymmetricOneHot(_OneHotBitFlip):
    """Symmetric private one-hot encoding, Algorithm 3 / Theorem C.1 (samplable-anonymous-aggregation).

    Each coordinate is kept with probability e^ε/(1+e^ε): ε-LDP in the deletion (removal) model,
    2ε in the replacement model. The server side is Algorithm 4 (Theorem C.2).
    """

    name: ClassVar[str] = "symmetric_one_hot"
    ldp_kind: ClassVar[LdpKind] = "removal"

    @property
    def replacement_epsilon(self) -> float:
        """2ε: the replacement-model guarantee noted after Theorem C.1."""
        return 2 * self.epsilon


@dataclass(frozen=True)
class AsymmetricOneHot(_OneHotBitFlip):
    """Asymmetric private one-hot encoding, Algorithm 1 / Theorem A.1 (samplable-anonymous-aggregation).

    The respondent's own coordinate is reported set with probability 1/2, every other one with
    1/(e^ε+1): replacement ε-LDP. The server side is Algorithm 2 (Theorem A.2: variance
    n 4e^ε/(e^ε-1)^2 + f(d)).
    """

    name: ClassVar[str] = "asymmetric_one_hot"
    ldp_kind: ClassVar[LdpKind] = "replacement"

    @property
    def p_one(self) -> float:
        return 0.5


_MASK32 = np.uint64(0xFFFFFFFF)


def _splitmix64(state: np.ndarray) -> np.ndarray:
    """SplitMix64 output for each uint64 state (stable across platforms and numpy versions)."""
    z = state + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _fmix32(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer: a bijection of [0, 2^32) that scrambles nearby keys."""
    h = values.astype(np.uint64) & _MASK32
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & _MASK32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & _MASK32
    h ^= h >> np.uint64(16)
    return h


@dataclass(frozen=True)
class SketchHashes:
    """The k = ``num_hashes`` hash functions of a count-mean sketch of ``width`` columns.

    Row j hashes v with h_j(v) = ((a_j x + b_j) mod 2^64) >> (64 - log2 width), x = fmix32(v),
    a strongly universal multiply-add-shift family on 32-bit keys (Dietzfelbinger) whose 64-bit
    a_j, b_j come from SplitMix64 seeded by ``hash_seed``: devices, analyzer and the exact
    sketch simulator (``simulators.experiments``) agree on it. Scrambling the keys first matters:
    whether two keys collide under multiply-add-shift depends only on their difference, so on
    consecutive keys (pixels) the collisions of many pairs would move together.

    Hashing many values into every row (estimation, simulation): scramble them once with
    :meth:`keys`, then :meth:`row_columns` costs a multiply, an add and a shift per value and row.
    """

    num_hashes: int
    width: int
    hash_seed: int

    def __post_init__(self) -> None:
        _check_int(self, "num_hashes", 1)
        width = _check_int(self, "width", 2)
        if width & (width - 1) or width > 2**32:
            raise ValueError(f"width must be a power of two <= 2^32, got {width}")
        seed = _check_int(self, "hash_seed", 0)
        if seed >= 2**64:
            raise ValueError(f"hash_seed must be < 2^64, got {seed}")

    @cached_property
    def _row_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(a_j, b_j) for every row j: SplitMix64 of a counter started from ``hash_seed``."""
        start = np.uint64((self.hash_seed * 0xD1B54A32D192ED03) % 2**64)
        steps = np.arange(2 * self.num_hashes, dtype=np.uint64)
        keys = _splitmix64(start + steps * np.uint64(0x9E3779B97F4A7C15))
        return keys[0::2], keys[1::2]

    @property
    def _shift(self) -> np.uint64:
        return np.uint64(64 - (self.width.bit_length() - 1))

    def keys(self, values: np.ndarray) -> np.ndarray:
        """The scrambled keys x = fmix32(v) of integer values in [0, 2^32) (uint64)."""
        return _fmix32(_check_values(values, 2**32))

    def columns(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Column h_row(value) for each (value, row) pair (int64)."""
        keys = self.keys(values)
        rows = np.asarray(rows, dtype=np.int64)
        if rows.shape != keys.shape:
            raise ValueError(f"rows shape {rows.shape} differs from values {keys.shape}")
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_hashes):
            raise ValueError(f"rows must lie in [0, {self.num_hashes})")
        multipliers, offsets = self._row_keys
        with np.errstate(over="ignore"):
            mixed = multipliers[rows] * keys + offsets[rows]
        return (mixed >> self._shift).view(np.int64)

    def row_columns(self, row: int, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Column h_row(v) for every scrambled key of ``keys`` (from :meth:`keys`), as int64.

        ``out``: a uint64 buffer of the keys' shape to compute in (returned, viewed as int64),
        so that hashing every row allocates nothing.
        """
        if not 0 <= row < self.num_hashes:
            raise ValueError(f"row must lie in [0, {self.num_hashes}), got {row}")
        if keys.dtype != np.uint64:
            raise ValueError(f"keys must be the uint64 keys of SketchHashes.keys, got {keys.dtype}")
        multipliers, offsets = self._row_keys
        with np.errstate(over="ignore"):
            out = np.multiply(keys, multipliers[row], out=out)
            np.add(out, offsets[row], out=out)
        np.right_shift(out, self._shift, out=out)
        return out.view(np.int64)


@dataclass(frozen=True)
class CountMeanSketch(_EpsilonRandomizedResponse):
    """Count-mean sketch with one hash row per respondent (Section II-B and VII-A, esa-privacy-revisited).

    A respondent picks one of ``num_hashes`` rows uniformly, hashes its value to a column of that
    row (:class:`SketchHashes` seeded by ``hash_seed``) and reports one-hot randomized response
    (keep probability e^ε/(1+e^ε), as Algorithm 1) over the ``width`` bits of the row; each set
    bit is a message with bucket = row * width + column. Removal ε-LDP with respect to a
    uniformly chosen row of randomized zeros. Table I/III use 1,024 rows of width 65,536.
    """

    num_hashes: int
    width: int
    epsilon: float
    hash_seed: int
    domain_size: int

    name: ClassVar[str] = "count_mean_sketch"
    payload_kind: ClassVar[str] = "sketch"
    ldp_kind: ClassVar[LdpKind] = "removal"

    def __post_init__(self) -> None:
        hashes = SketchHashes(self.num_hashes, self.width, self.hash_seed)  # checks all three
        for name in ("num_hashes", "width", "hash_seed"):
            _set(self, name, getattr(hashes, name))
        _check_epsilon(self, "epsilon")
        domain_size = _check_int(self, "domain_size", 1)
        if domain_size > 2**32:
            raise ValueError(f"domain_size must be <= 2^32 for the sketch hash, got {domain_size}")

    @cached_property
    def hashes(self) -> SketchHashes:
        """The sketch's hash functions: :meth:`SketchHashes.row_columns` hashes a row at a time."""
        return SketchHashes(self.num_hashes, self.width, self.hash_seed)

    @property
    def message_domain_size(self) -> int:
        return self.num_hashes * self.width

    def hash_columns(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Column h_row(value) for each (value, row) pair (int64)."""
        return self.hashes.columns(_check_values(values, self.domain_size), rows)

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        values = _check_values(values, self.domain_size)
        rows = rng.integers(0, self.num_hashes, size=values.size)
        columns = self.hash_columns(values, rows)
        respondent, column = _one_hot_messages(columns, self.width, self.p_one, self.p_zero, rng)
        return _batch(respondent, rows[respondent] * self.width + column)

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        return self.estimate_values(
            bucket_sums, respondents, np.arange(self.domain_size, dtype=np.int64)
        )

    def estimate_values(
        self, bucket_sums: np.ndarray, respondents: float, values: np.ndarray
    ) -> HistogramEstimate:
        """Count-mean-sketch estimates for ``values`` only (decoding costs num_hashes per value)."""
        sketch = self._check_bucket_sums(bucket_sums).astype(np.float64)
        sketch = sketch.reshape(self.num_hashes, self.width)
        # Σ_j S[j, h_j(v)], one row at a time: the scrambled keys are computed once.
        keys = self.hashes.keys(_check_values(values, self.domain_size))
        buffer = np.empty_like(keys)
        hashed = np.zeros(keys.size, dtype=np.float64)
        for row in range(self.num_hashes):
            hashed += sketch[row].take(self.hashes.row_columns(row, keys, buffer))
        moment = count_mean_sketch_collision_moment(sketch, respondents, self.p_one, self.p_zero)
        return count_mean_sketch_estimate(
            hashed,
            respondents,
            self.num_hashes,
            self.width,
            self.p_one,
            self.p_zero,
            moment,
        )

    def expected_messages_per_respondent(self) -> float:
        """p_one + (width - 1) p_zero set bits (the #bits_sketch of Tables I and III)."""
        return self.p_one + (self.width - 1) * self.p_zero


@dataclass(frozen=True)
class ZeroSumHistogram(LocalRandomizer):
    """P_hist (Figure 2, shuffled-model-histograms): P_zsum run on every coordinate of the one-hot vector.

    For each bucket j a respondent sends x_j + z_j copies of the message j, z_j ~ Ber(p) with
    p = 1 - 50 ln(2/δ) / (ε^2 n) (Figure 1). Theorem 3.2 needs ε, δ ∈ (0, 1] and
    n >= 100 ln(2/δ) / ε^2, and gives (2ε, 2δ)-DP in the shuffled model. Every message is an
    identical copy of j (no sign): that is what makes the shuffled output equivalent to a noisy
    count; a respondent's own messages are not locally private (two copies of j reveal x = j), so
    ``epsilon_local`` is infinite. Expect about 1 + d p messages per respondent.
    """

    domain_size: int
    epsilon: float
    delta: float
    respondents: int

    name: ClassVar[str] = "zero_sum_histogram"
    payload_kind: ClassVar[str] = "bucket"
    ldp_kind: ClassVar[LdpKind] = "replacement"

    def __post_init__(self) -> None:
        _check_int(self, "domain_size", 1)
        epsilon = _check_epsilon(self, "epsilon")
        delta = _check_epsilon(self, "delta")
        if epsilon > 1:
            raise ValueError(f"epsilon must be in (0, 1] (Theorem 3.2), got {epsilon}")
        if delta > 1:
            raise ValueError(f"delta must be in (0, 1] (Theorem 3.2), got {delta}")
        respondents = _check_int(self, "respondents", 1)
        needed = 100 / epsilon**2 * math.log(2 / delta)
        if respondents < needed:
            raise ValueError(
                f"respondents must be >= 100 ln(2/δ)/ε^2 = {needed:.1f} (Theorem 3.2), "
                f"got {respondents}"
            )

    @property
    def p(self) -> float:
        """Probability of the extra copy per bucket: 1 - 50 ln(2/δ) / (ε^2 n) (Figure 1)."""
        return 1 - 50 / (self.epsilon**2 * self.respondents) * math.log(2 / self.delta)

    @property
    def epsilon_local(self) -> float:
        return math.inf

    @property
    def central_epsilon(self) -> float:
        """2ε: the shuffled-model guarantee of Theorem 3.2 (i)."""
        return 2 * self.epsilon

    @property
    def central_delta(self) -> float:
        """2δ: the shuffled-model guarantee of Theorem 3.2 (i)."""
        return 2 * self.delta

    @property
    def message_domain_size(self) -> int:
        return self.domain_size

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        values = _check_values(values, self.domain_size)
        d = self.domain_size
        chunk = max(1, _DENSE_CHUNK_CELLS // d)
        respondent_parts, bucket_parts = [], []
        for start in range(0, values.size, chunk):
            stop = min(values.size, start + chunk)
            copies = (rng.random((stop - start, d)) < self.p).astype(np.int64)
            copies[np.arange(stop - start), values[start:stop]] += 1
            cells = np.repeat(np.arange(copies.size, dtype=np.int64), copies.ravel())
            cell_rows = cells // d
            respondent_parts.append(cell_rows + start)
            bucket_parts.append(cells - cell_rows * d)
        if not respondent_parts:
            return MessageBatch.empty()
        return _batch(np.concatenate(respondent_parts), np.concatenate(bucket_parts))

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        """Unbiased ĉ_j = S_j - n p (variance n p (1-p))."""
        return debias_zero_sum(self._check_bucket_sums(bucket_sums), respondents, self.p)

    def estimate_with_support_threshold(
        self, bucket_sums: np.ndarray, respondents: float
    ) -> HistogramEstimate:
        """The analyzer A_hist of Figure 2 as counts: S_j - n p where S_j > n, else 0 (biased).

        Buckets nobody holds receive at most n messages and are reported as exactly 0
        (Theorem 3.1 iii); labelled "support_threshold".
        """
        unbiased = self.estimate(bucket_sums, respondents)
        sums = np.asarray(bucket_sums, dtype=np.float64)
        return HistogramEstimate(
            np.where(sums > unbiased.respondents, unbiased.estimate, 0.0),
            unbiased.stderr,
            unbiased.respondents,
            postprocessing="support_threshold",
        )

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """S_j = c_j + Binomial(n, p), independent across buckets."""
        counts = _check_true_counts(true_counts, self.domain_size)
        total = int(counts.sum())
        return (counts + rng.binomial(total, self.p, size=counts.size)).astype(np.int64)

    def expected_messages_per_respondent(self) -> float:
        return 1 + self.domain_size * self.p


@dataclass(frozen=True)
class ReportFragmented(LocalRandomizer):
    """r-frag(att-frag(R_k-RAPPOR), τ): Algorithm 2 applied to each bit of the one-hot vector.

    A backstop x' keeps each bit with probability e^ε_b/(1+e^ε_b) (removal ε_b, Theorem III.1);
    each of τ fragments then re-randomizes every bit of x' with keep probability
    e^ε_f/(1+e^ε_f) and sends the indices of its set bits with its fragment index i ∈ [τ].
    Theorem IV.1/IV.2 (esa-privacy-revisited): an adversary seeing t fragments faces removal
    ln((e^(ε_b + t ε_f) + 1) / (e^ε_b + e^(t ε_f)))-LDP; ``epsilon_local`` is t = τ (ε_ℓ∞).
    The backstop is a permanent randomized response: a device that reports the same value again
    keeps its backstop (:meth:`backstop`) and draws fresh fragments (:meth:`fragment`).
    """

    backstop_epsilon: float
    fragment_epsilon: float
    fragments: int
    domain_size: int

    name: ClassVar[str] = "report_fragmented"
    payload_kind: ClassVar[str] = "fragment_bucket"
    ldp_kind: ClassVar[LdpKind] = "removal"

    def __post_init__(self) -> None:
        _check_epsilon(self, "backstop_epsilon")
        _check_epsilon(self, "fragment_epsilon")
        fragments = _check_int(self, "fragments", 1)
        if fragments >= 2**15:
            raise ValueError(f"fragments must be < 32768, got {fragments}")
        _check_int(self, "domain_size", 1)

    @property
    def backstop_keep(self) -> float:
        return _keep_probability(self.backstop_epsilon)

    @property
    def fragment_keep(self) -> float:
        return _keep_probability(self.fragment_epsilon)

    def epsilon_for_fragments(self, observed: int) -> float:
        """Theorem IV.1: the LDP ε against an adversary who sees ``observed`` of the τ fragments."""
        if not (1 <= observed <= self.fragments):
            raise ValueError(f"observed must be in [1, {self.fragments}], got {observed}")
        eb, ef = self.backstop_epsilon, observed * self.fragment_epsilon
        return float(np.logaddexp(eb + ef, 0.0) - np.logaddexp(eb, ef))

    @property
    def epsilon_local(self) -> float:
        """ε_ℓ∞ = Theorem IV.1 with t = τ (all fragments observed)."""
        return self.epsilon_for_fragments(self.fragments)

    @property
    def epsilon_single_fragment(self) -> float:
        """ε_ℓ1 = Theorem IV.1 with t = 1."""
        return self.epsilon_for_fragments(1)

    @property
    def message_domain_size(self) -> int:
        return self.domain_size

    def backstop(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        """x' = R_b(x; ε_b) (Step 1 of Algorithm 2): set bits of the backstop, fragment 0."""
        values = _check_values(values, self.domain_size)
        keep = self.backstop_keep
        return _batch(*_one_hot_messages(values, self.domain_size, keep, 1 - keep, rng))

    def fragment(
        self, backstop: MessageBatch, respondents: int, rng: np.random.Generator
    ) -> MessageBatch:
        """y_i = R_f(x'; ε_f) for i ∈ [τ] (Steps 2-5), from the backstops of ``respondents``."""
        keys = backstop.respondent * self.domain_size + backstop.bucket
        if np.any(keys[1:] <= keys[:-1]):
            order = np.argsort(keys, kind="stable")
            if np.any(np.diff(keys[order]) == 0):
                raise ValueError("backstop repeats a bucket for one respondent")
            backstop = MessageBatch(*(getattr(backstop, name)[order] for name in _MESSAGE_COLUMNS))
        if len(backstop) and (
            backstop.bucket.max() >= self.domain_size or np.any(backstop.fragment)
        ):
            raise ValueError("backstop must hold fragment-0 buckets of this randomizer's domain")
        per_row = backstop.messages_per_respondent(respondents)
        keep = self.fragment_keep
        parts = []
        for index in range(1, self.fragments + 1):
            rows, columns = _bit_flip_messages(
                backstop.bucket, per_row, self.domain_size, keep, 1 - keep, rng
            )
            parts.append(_batch(rows, columns, fragment=index))
        return MessageBatch.concatenate(parts)

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        values = _check_values(values, self.domain_size)
        return self.fragment(self.backstop(values, rng), values.size, rng)

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        """De-bias bucket sums added over all τ fragments (respondents = n)."""
        return debias_report_fragments(
            self._check_bucket_sums(bucket_sums),
            respondents,
            self.backstop_keep,
            self.fragment_keep,
            self.fragments,
        )

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Bucket sums over all fragments from their exact distribution.

        B_j = Bin(c_j, a) + Bin(n - c_j, 1 - a) backstops hold bit j; then
        S_j = Bin(τ B_j, r) + Bin(τ (n - B_j), 1 - r).
        """
        counts = _check_true_counts(true_counts, self.domain_size)
        total = int(counts.sum())
        a, r, tau = self.backstop_keep, self.fragment_keep, self.fragments
        backstop_ones = _randomized_response_sums(counts, total, a, 1 - a, rng)
        return _randomized_response_sums(tau * backstop_ones, tau * total, r, 1 - r, rng)

    def expected_messages_per_respondent(self) -> float:
        a, r = self.backstop_keep, self.fragment_keep
        own = a * r + (1 - a) * (1 - r)
        other = (1 - a) * r + a * (1 - r)
        return self.fragments * (own + (self.domain_size - 1) * other)


@dataclass(frozen=True, eq=False)
class LongitudinalState:
    """Per-client state of Algorithm 1 (amplification-by-shuffling), one entry per client.

    chosen_change: i* ∈ [k]; level: h* ∈ [log2(d) + 1]; changes_seen: the counter i;
    pending: the counter c ∈ {-1, 0, 1}; period: the last period processed (0 before the first).
    """

    chosen_change: np.ndarray
    level: np.ndarray
    changes_seen: np.ndarray
    pending: np.ndarray
    period: int

    def __post_init__(self) -> None:
        size = np.asarray(self.chosen_change).shape
        for name in ("level", "changes_seen", "pending"):
            if np.asarray(getattr(self, name)).shape != size:
                raise ValueError(f"{name} must have the shape of chosen_change {size}")
        if self.period < 0:
            raise ValueError(f"period must be >= 0, got {self.period}")


@dataclass(frozen=True)
class LongitudinalClient(LocalRandomizer):
    """A_client, Algorithm 1 (amplification-by-shuffling): a boolean tracked over d periods.

    Input: an (n, d) boolean array of states, the state before period 1 being 0; a state may
    change at most k = ``max_changes`` times. Each client samples the change i* ∈ [k] it will
    report and a tree level h* ∈ [log2(d) + 1]; at every period t divisible by 2^(h*-1) it sends
    (h*, t, u) for tree node [h*, t / 2^(h*-1)], u = ±1: randomized response on the i*-th change if
    it fell into that node, a fair coin otherwise. Messages carry the period t, the node's flat
    index as bucket (:func:`~privacy.estimators.tree_node_offsets`) and u as sign.

    Calibration: the selected change is non-zero in exactly one node per level, so two inputs
    differ in at most two nodes of the reported level, one of them 0 in each input; the exact
    worst-case likelihood ratio is the node bias itself (checked in the tests). Algorithm 1 uses
    node bias e^(ε/2) and claims ε; here the bias is e^ε, which meets replacement ε-LDP exactly.
    The domain is the d periods: :meth:`estimate` returns the marginals f̃_1..f̃_d (Algorithm 2).
    """

    periods: int
    max_changes: int
    epsilon: float

    name: ClassVar[str] = "longitudinal"
    payload_kind: ClassVar[str] = "tree_node"
    ldp_kind: ClassVar[LdpKind] = "replacement"

    def __post_init__(self) -> None:
        periods = _check_int(self, "periods", 1)
        if periods & (periods - 1) or periods > 2**30:
            raise ValueError(f"periods must be a power of two <= 2^30, got {periods}")
        _check_int(self, "max_changes", 1)
        _check_epsilon(self, "epsilon")

    @property
    def epsilon_local(self) -> float:
        return self.epsilon

    @property
    def levels(self) -> int:
        """L = log2(d) + 1 tree levels."""
        return self.periods.bit_length()

    @property
    def node_keep(self) -> float:
        """Probability that a node holding the change reports its sign: e^ε/(1+e^ε)."""
        return _keep_probability(self.epsilon)

    @property
    def domain_size(self) -> int:
        return self.periods

    @property
    def message_domain_size(self) -> int:
        return 2 * self.periods - 1

    def start(self, respondents: int, rng: np.random.Generator) -> LongitudinalState:
        """SETUP(d, k) for ``respondents`` clients: i* ~ U[k], h* ~ U[log2(d) + 1]."""
        if respondents < 0:
            raise ValueError(f"respondents must be >= 0, got {respondents}")
        return LongitudinalState(
            chosen_change=rng.integers(1, self.max_changes + 1, size=respondents),
            level=rng.integers(1, self.levels + 1, size=respondents),
            changes_seen=np.zeros(respondents, np.int64),
            pending=np.zeros(respondents, np.int64),
            period=0,
        )

    def update(
        self, state: LongitudinalState, changes: np.ndarray, rng: np.random.Generator
    ) -> tuple[LongitudinalState, MessageBatch]:
        """UPDATE(t, x_t, ε) for period t = state.period + 1; ``changes`` x_t ∈ {-1, 0, 1} per client."""
        t = state.period + 1
        if t > self.periods:
            raise ValueError(f"all {self.periods} periods were already processed")
        changes = np.asarray(changes)
        if changes.shape != state.pending.shape:
            raise ValueError(f"changes must have shape {state.pending.shape}, got {changes.shape}")
        if changes.size and not np.isin(changes, (-1, 0, 1)).all():
            raise ValueError("changes must be -1, 0 or +1")
        changes = changes.astype(np.int64)
        changed = changes != 0
        seen = state.changes_seen + changed
        pending = np.where(changed & (seen == state.chosen_change), changes, state.pending)
        stride = np.left_shift(1, state.level - 1)
        reporters = np.flatnonzero(t % stride == 0)
        held = pending[reporters]
        coin = np.where(rng.random(reporters.size) < 0.5, 1, -1)
        faithful = np.where(rng.random(reporters.size) < self.node_keep, 1, -1)
        signs = np.where(held == 0, coin, faithful * held)
        pending[reporters] = 0
        levels = state.level[reporters]
        buckets = tree_node_offsets(self.periods)[levels - 1] + (t >> (levels - 1)) - 1
        new_state = LongitudinalState(state.chosen_change, state.level, seen, pending, period=t)
        return new_state, _batch(reporters, buckets, sign=signs, period=t)

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        states = np.asarray(values)
        if states.ndim != 2 or states.shape[1] != self.periods:
            raise ValueError(f"values must have shape (n, {self.periods}), got {states.shape}")
        if states.size and not (states.dtype == np.bool_ or np.isin(states, (0, 1)).all()):
            raise ValueError("values must be boolean states")
        states = states.astype(np.int64)
        changes = np.diff(states, axis=1, prepend=0)
        too_many = np.count_nonzero(changes, axis=1) > self.max_changes
        if too_many.any():
            raise ValueError(
                f"{int(too_many.sum())} respondents change state more than "
                f"max_changes={self.max_changes} times"
            )
        state = self.start(states.shape[0], rng)
        batches = []
        for period in range(self.periods):
            state, batch = self.update(state, changes[:, period], rng)
            batches.append(batch)
        return MessageBatch.concatenate(batches)

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        """Algorithm 2: estimated number of clients in state 1 at each period t = 1..d."""
        return longitudinal_marginals(
            self._check_bucket_sums(bucket_sums),
            respondents,
            self.periods,
            self.max_changes,
            self.node_keep,
        )

    def error_bound(self, respondents: float, failure_probability: float = 1 / 3) -> float:
        """Theorem 6 with explicit constants (:func:`~privacy.estimators.theorem6_error_bound`)."""
        return theorem6_error_bound(
            respondents, self.periods, self.max_changes, self.epsilon, failure_probability
        )

    def expected_messages_per_respondent(self) -> float:
        """Σ_h d / 2^(h-1) / L = (2d - 1) / L reports over the d periods."""
        return (2 * self.periods - 1) / self.levels


RANDOMIZERS: dict[str, type[LocalRandomizer]] = {
    cls.name: cls
    for cls in (
        BinaryRandomizedResponse,
        OneHotRappor,
        AsymmetricOneHot,
        SymmetricOneHot,
        CountMeanSketch,
        ZeroSumHistogram,
        ReportFragmented,
        LongitudinalClient,
    )
}


def build_randomizer(name: str, params: Mapping[str, Any]) -> LocalRandomizer:
    """The randomizer registered as ``name`` built from ``params`` (as ``to_params`` returns)."""
    if name not in RANDOMIZERS:
        raise ValueError(f"unknown randomizer {name!r}; known: {sorted(RANDOMIZERS)}")
    cls = RANDOMIZERS[name]
    expected = {field.name for field in fields(cls)}  # type: ignore[arg-type]
    given = set(params)
    if given != expected:
        missing, unknown = sorted(expected - given), sorted(given - expected)
        raise ValueError(
            f"parameters for {name!r} must be {sorted(expected)}; "
            f"missing {missing}, unknown {unknown}"
        )
    return cls(**params)

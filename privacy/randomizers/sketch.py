"""Count-mean sketch (heavy hitters over large domains, Table II of esa-privacy-revisited)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
    count_mean_sketch_collision_moment,
    count_mean_sketch_estimate,
)
from privacy.messages import MessageBatch
from privacy.randomizers.base import (
    LdpKind,
    _batch,
    _check_epsilon,
    _check_int,
    _check_values,
    _EpsilonRandomizedResponse,
    _one_hot_messages,
    _set,
)

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

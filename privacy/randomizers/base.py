"""Shared machinery of the local randomizers: validation, bit flipping, the common base class."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, ClassVar, Literal

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
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

"""Randomized messages as columns: what a local randomizer emits for a batch of respondents.

One respondent's randomized value usually becomes several messages (one per set bit with attribute
fragmentation, Section III of esa-privacy-revisited; τ fragments with report fragmentation,
Section IV; one tree node per reporting period in the longitudinal protocol of
amplification-by-shuffling). A :class:`MessageBatch` holds the messages of many respondents as
parallel numpy columns, sorted by respondent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_COLUMN_DTYPES: dict[str, type[np.integer]] = {
    "respondent": np.int64,
    "bucket": np.int64,
    "sign": np.int8,
    "fragment": np.int16,
    "period": np.int32,
}


def _as_column(name: str, values: object) -> np.ndarray:
    """``values`` as a 1-D array of the column's dtype; rejects non-integers and lossy casts."""
    dtype = _COLUMN_DTYPES[name]
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if array.dtype == dtype:
        return array
    if array.size and not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    converted = array.astype(dtype)
    if array.size and not np.array_equal(converted, array):
        raise ValueError(f"{name} has values outside the range of {np.dtype(dtype).name}")
    return converted


@dataclass(frozen=True, eq=False)
class MessageBatch:
    """Messages of a batch of respondents, one row per message, sorted by respondent.

    respondent: index of the sender within the randomized input batch (int64, non-decreasing).
    bucket: index in the randomizer's message domain, ``0..message_domain_size-1`` (int64).
    sign: +1 or -1 (int8); +1 for randomizers whose messages carry no sign.
    fragment: report-fragment index i ∈ [τ] (Algorithm 2, esa-privacy-revisited), 0 otherwise.
    period: longitudinal period t ∈ [d] (Algorithm 1, amplification-by-shuffling), 0 otherwise.
    """

    respondent: np.ndarray
    bucket: np.ndarray
    sign: np.ndarray
    fragment: np.ndarray
    period: np.ndarray

    def __post_init__(self) -> None:
        for name in _COLUMN_DTYPES:
            object.__setattr__(self, name, _as_column(name, getattr(self, name)))
        length = self.respondent.size
        for name in _COLUMN_DTYPES:
            if getattr(self, name).size != length:
                raise ValueError(
                    f"{name} has {getattr(self, name).size} entries, respondent has {length}"
                )
        if length == 0:
            return
        if self.respondent[0] < 0:
            raise ValueError("respondent indices must be non-negative")
        if np.any(self.respondent[1:] < self.respondent[:-1]):
            raise ValueError("respondent must be sorted (messages are grouped by respondent)")
        if self.bucket.min() < 0:
            raise ValueError("bucket indices must be non-negative")
        if np.any(np.abs(self.sign) != 1):
            raise ValueError("sign must be +1 or -1")
        if self.fragment.min() < 0:
            raise ValueError("fragment indices must be non-negative (0 means no fragment)")
        if self.period.min() < 0:
            raise ValueError("period must be non-negative (0 means not longitudinal)")

    def __len__(self) -> int:
        return int(self.respondent.size)

    @classmethod
    def empty(cls) -> MessageBatch:
        """A batch without messages."""
        return cls(**{name: np.empty(0, dtype=dtype) for name, dtype in _COLUMN_DTYPES.items()})

    @classmethod
    def concatenate(cls, batches: Sequence[MessageBatch]) -> MessageBatch:
        """All messages of ``batches`` (respondent indices in one numbering), sorted by respondent.

        The sort is stable: a respondent's messages keep the order of ``batches`` (for example
        fragment 1 before fragment 2) and, within one batch, their own order.
        """
        batches = list(batches)
        if not batches:
            return cls.empty()
        if not all(isinstance(batch, MessageBatch) for batch in batches):
            raise ValueError("batches must all be MessageBatch instances")
        columns = {
            name: np.concatenate([getattr(batch, name) for batch in batches])
            for name in _COLUMN_DTYPES
        }
        order = np.argsort(columns["respondent"], kind="stable")
        return cls(**{name: column[order] for name, column in columns.items()})

    def bucket_sums(self, message_domain_size: int) -> np.ndarray:
        """Sum of ``sign`` per bucket (int64, length ``message_domain_size``): the estimators' input."""
        if message_domain_size < 1:
            raise ValueError(f"message_domain_size must be >= 1, got {message_domain_size}")
        if len(self) and self.bucket.max() >= message_domain_size:
            raise ValueError(
                f"bucket {int(self.bucket.max())} is outside a message domain of size "
                f"{message_domain_size}"
            )
        positive = self.sign > 0
        plus = np.bincount(self.bucket[positive], minlength=message_domain_size)
        minus = np.bincount(self.bucket[~positive], minlength=message_domain_size)
        return (plus - minus).astype(np.int64)

    def messages_per_respondent(self, respondents: int) -> np.ndarray:
        """How many messages each of ``respondents`` respondents sent (int64)."""
        if len(self) and self.respondent[-1] >= respondents:
            raise ValueError(f"respondent {int(self.respondent[-1])} >= respondents={respondents}")
        return np.bincount(self.respondent, minlength=respondents).astype(np.int64)

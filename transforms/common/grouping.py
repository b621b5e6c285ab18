"""Grouping rows of column batches by key, without per-row Python (shared by the shuffler, which
groups reports into crowds, and the analyzer, which groups released messages into crowds)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _codes(column: pa.Array) -> np.ndarray:
    """Integer codes of a column's values (nulls get -1) for sorting and grouping."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_integer(column.type):
        column = pc.dictionary_encode(column).indices
    if column.null_count:
        column = column.fill_null(-1)
    return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _dense_ranks(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Order-preserving ranks 0..k-1 of integer codes and k."""
    low, high = (int(codes.min()), int(codes.max())) if codes.size else (0, 0)
    if high - low < 1 << 20:
        return codes - low, high - low + 1
    values, ranks = np.unique(codes, return_inverse=True)
    return ranks.reshape(-1), int(values.size)


def group_rows(
    key_columns: Sequence[pa.Array], tiebreak: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sort rows by their key columns (then ``tiebreak``) and find the groups of equal keys.

    Returns ``(order, starts)``: rows ``order[starts[i]:starts[i+1]]`` share one key, with
    ``starts`` ending in the row count. Vectorized, no per-row Python: the key columns'
    order-preserving ranks are combined into one integer key (mixed radix) where it fits in 62
    bits, so the sort has one key (two with ``tiebreak``) whatever the number of columns.
    """
    codes = [_codes(column) for column in key_columns]
    rows = len(codes[0]) if codes else (0 if tiebreak is None else len(tiebreak))
    if rows == 0:
        return np.arange(0), np.zeros(1, dtype=np.int64)
    combined = np.zeros(rows, dtype=np.int64)
    radix = 1
    for code in codes:
        ranks, cardinality = _dense_ranks(code)
        radix *= cardinality
        if radix >= 1 << 62:
            break
        combined = combined * cardinality + ranks
    else:
        codes = [combined]
    sort_keys = ([tiebreak] if tiebreak is not None else []) + codes[::-1]
    if tiebreak is None and len(codes) == 1 and radix <= 1 << 16:
        # One small key (the common case: a few crowds or buckets per batch): numpy sorts
        # 16-bit keys stably by radix, several times faster than lexsort's merge sort.
        order = np.argsort(codes[0].astype(np.uint16), kind="stable")
    else:
        order = np.lexsort(sort_keys) if sort_keys else np.arange(rows)
    changed = np.zeros(rows, dtype=bool)
    changed[0] = True
    for code in codes:
        ordered = code[order]
        changed[1:] |= ordered[1:] != ordered[:-1]
    starts = np.append(np.flatnonzero(changed), rows).astype(np.int64)
    return order, starts


def group_rows_by_hash(
    key_columns: Sequence[pa.Array], hashes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`group_rows` with ``tiebreak=hashes`` (same groups, rows sorted by hash within a
    group), in two cheap sorts: all rows by hash, then a stable radix sort by dense group number
    (16 bits while there are at most 65536 groups)."""
    grouped, starts = group_rows(key_columns)
    groups = starts.size - 1
    if groups > 1 << 16:
        return group_rows(key_columns, tiebreak=hashes)
    group_of_row = np.empty(grouped.size, dtype=np.uint16)
    group_of_row[grouped] = np.repeat(np.arange(groups, dtype=np.uint16), np.diff(starts))
    by_hash = np.argsort(hashes)
    order = by_hash[np.argsort(group_of_row[by_hash], kind="stable")]
    return order, starts


def count_distinct(values: pa.Array) -> int:
    """Exact number of distinct values (hash-based, in Arrow)."""
    return len(pc.unique(values))

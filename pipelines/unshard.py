"""``esa unshard``: the analyzer of a prio3 recipe: two aggregators' shares in, histograms out.

    esa unshard --aggregates DIR_0 --aggregates DIR_1 --key-ring ANALYZER_KEYS --output OUT
        [--truth SIMULATION_DIR]

Reads ``aggregate.json`` of both aggregators (``esa aggregate --phase finish``), opens and adds
their aggregate shares per window and crowd, de-biases the sums at n, the valid reports both
summed, and states the aggregate-model guarantee at that n (``transforms/analyzer/unshard.py``).
Writes ``OUT/histograms.parquet`` (window_start, window_end, crowd_id, bucket, estimate, stderr,
raw_count, n, truth when given) and ``OUT/summary.json`` (per crowd: n, the guarantee, or why it
was refused; with ``--truth``, the root mean square of (estimate - truth) / stderr, which is
about 1 when the stated standard errors are right).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.commandline.main import UsageError
from schemas.crypto.analyzer_keys import KeyError_, KeyRing
from schemas.crypto.commit_signing import SignatureError, verify_commit
from schemas.crypto.signing_keys import load_shuffler_keys
from transforms.analyzer.unshard import (
    CrowdResult,
    UnshardError,
    read_aggregate_record,
    unshard_aggregates,
)

__all__ = ["register", "run"]

AGGREGATE_FILE = "aggregate.json"
HISTOGRAMS_FILE = "histograms.parquet"
SUMMARY_FILE = "summary.json"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "unshard",
        help="Analyzer of a prio3 recipe: add the two aggregators' shares, de-bias, report.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--aggregates", action="append", required=True, help="Twice.")
    parser.add_argument("--key-ring", required=True, help="The analyzer's private key(s).")
    parser.add_argument("--output", required=True)
    parser.add_argument("--truth", help="A simulation directory (its truth.parquet).")
    parser.add_argument(
        "--aggregator-keys",
        help="The aggregators' public signing keys (a file or directory): both aggregate.json "
        "must carry a valid signature of its aggregator's key. Default: read unauthenticated.",
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    summary = run(args.aggregates, args.key_ring, args.output, args.truth, args.aggregator_keys)
    print(json.dumps({k: v for k, v in summary.items() if k != "crowds"}, indent=2))
    return 0


def _truth(directory: str | None) -> dict[int, np.ndarray] | None:
    """Window start (ms) -> true counts per bucket, from a simulation's truth.parquet."""
    if directory is None:
        return None
    path = Path(directory) / "truth.parquet"
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as error:
        raise UsageError(f"--truth {path}: cannot be read: {error}") from None
    starts = table.column("window_start").cast(pa.int64()).to_numpy()
    buckets, counts = table.column("bucket").to_numpy(), table.column("count").to_numpy()
    truth: dict[int, np.ndarray] = {}
    for start in np.unique(starts).tolist():
        rows = starts == start
        size = int(buckets[rows].max()) + 1
        truth[start] = np.bincount(buckets[rows], weights=counts[rows], minlength=size)
    return truth


def _crowd_summary(result: CrowdResult, truth: np.ndarray | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "window_start": result.window_start,
        "window_end": result.window_end,
        "crowd_id": result.crowd_id,
        "n": result.reports,
    }
    if result.refused is not None:
        return entry | {"refused": result.refused}
    entry["privacy"] = dict(result.guarantee or {})
    if truth is not None:
        assert result.estimate is not None and result.stderr is not None
        full = np.zeros(result.estimate.size)
        full[: min(truth.size, full.size)] = truth[: full.size]
        z = (result.estimate - full) / np.where(result.stderr > 0, result.stderr, np.nan)
        entry["truth_respondents"] = int(full.sum())
        entry["rms_z"] = float(np.sqrt(np.nanmean(z**2)))
    return entry


def run(
    aggregates: list[str],
    key_ring: str,
    output: str,
    truth_dir: str | None = None,
    aggregator_keys: str | None = None,
) -> dict[str, Any]:
    if len(aggregates) != 2:
        raise UsageError(f"give --aggregates twice (both aggregators), got {len(aggregates)}")
    trusted = None
    if aggregator_keys is not None:
        try:
            trusted = load_shuffler_keys(aggregator_keys)
        except KeyError_ as error:
            raise UsageError(str(error)) from None
    records = []
    for directory in aggregates:
        path = Path(directory) / AGGREGATE_FILE
        try:
            text = path.read_text()
        except OSError as error:
            raise UsageError(f"{path}: cannot be read: {error.strerror}") from None
        record = read_aggregate_record(text, str(path))
        if trusted is not None:
            if record.get("instance") != record.get("aggregator"):
                raise UsageError(f"refusing {path}: unsigned or signed for another aggregator")
            try:
                verify_commit(record, trusted)
            except (SignatureError, KeyError, TypeError, ValueError) as error:
                raise UsageError(f"refusing {path}: {error}") from None
        records.append(record)
    try:
        ring = KeyRing.load(key_ring)
        results = unshard_aggregates(records, ring)
    except (KeyError_, UnshardError) as error:
        raise UsageError(str(error)) from None
    truth = _truth(truth_dir)
    rows: dict[str, list[Any]] = {
        name: []
        for name in (
            "window_start",
            "window_end",
            "crowd_id",
            "bucket",
            "estimate",
            "stderr",
            "raw_count",
            "n",
        )
    }
    crowds = []
    for result in results:
        crowds.append(
            _crowd_summary(result, None if truth is None else truth.get(result.window_start))
        )
        if result.refused is not None:
            continue
        size = result.estimate.size
        rows["window_start"] += [result.window_start] * size
        rows["window_end"] += [result.window_end] * size
        rows["crowd_id"] += [result.crowd_id] * size
        rows["bucket"] += list(range(size))
        rows["estimate"] += result.estimate.tolist()
        rows["stderr"] += result.stderr.tolist()
        rows["raw_count"] += result.raw_counts.tolist()
        rows["n"] += [result.reports] * size
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "window_start": pa.array(rows["window_start"], pa.int64()),
                "window_end": pa.array(rows["window_end"], pa.int64()),
                "crowd_id": pa.array(rows["crowd_id"], pa.string()),
                "bucket": pa.array(rows["bucket"], pa.int64()),
                "estimate": pa.array(rows["estimate"], pa.float64()),
                "stderr": pa.array(rows["stderr"], pa.float64()),
                "raw_count": pa.array(rows["raw_count"], pa.int64()),
                "n": pa.array(rows["n"], pa.int64()),
            }
        ),
        out / HISTOGRAMS_FILE,
    )
    z = [c["rms_z"] for c in crowds if "rms_z" in c and math.isfinite(c["rms_z"])]
    summary = {
        "aggregation": "prio3",
        "run_id": records[0].get("run_id"),
        "signed": trusted is not None,
        "recipe_id": records[0].get("recipe_id"),
        "crowds_estimated": sum(1 for c in crowds if "refused" not in c),
        "crowds_refused": sum(1 for c in crowds if "refused" in c),
        "respondents": sum(c["n"] for c in crowds if "refused" not in c),
        "rms_z": float(np.sqrt(np.mean(np.square(z)))) if z else None,
        "crowds": crowds,
        "output": str(out),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary

"""The analyzer's arithmetic without Beam, one module per job:

* ``accumulate``: bucket sums and per-crowd accumulators, the recipes the analyzer accepts;
* ``batches``: one batch of shuffled messages -> partial accumulators and dead-letter reasons;
* ``estimate``: n_eff and the de-biased histograms and longitudinal marginals;
* ``report``: privacy summary, truth, per-crowd report entries and notes.

``transforms/aggregate.py`` and ``transforms/analyze.py`` are thin Beam composites over them;
this package re-exports their names (``from transforms import analyze_core as core``).
"""

from __future__ import annotations

from transforms.analyze_core.accumulate import (
    DENSE_LIMIT,
    HISTOGRAM,
    LONGITUDINAL,
    SPARSE_PENDING_LIMIT,
    Accumulator,
    BucketCounts,
    CrowdAccumulator,
    CrowdKey,
    LongitudinalAccumulator,
    RecipeBook,
    decode_limits,
    is_longitudinal,
    merge_accumulators,
    merge_any,
)
from transforms.analyze_core.batches import (
    BAD_WINDOW,
    CENSUS_NOT_COUNTED,
    CRC_MISMATCH,
    MESSAGE_COLUMNS,
    MISSING_FIELD,
    RECIPE_CHANNEL_MISMATCH,
    TREE_NODE_MISMATCH,
    UNKNOWN_RECIPE,
    UNKNOWN_SCHEMA_VERSION,
    BatchAggregate,
    aggregate_batch,
    crowd_key,
    payloads_subset,
    respondent_accumulators,
    tree_node_matches_period,
)
from transforms.analyze_core.estimate import (
    MATERIALIZE_LIMIT,
    POSTPROCESSING,
    HistogramResult,
    LongitudinalResult,
    effective_respondents,
    estimate_histogram,
    estimate_longitudinal,
    histogram_accuracy,
    node_periods,
    sparse_truth,
    values_at,
)
from transforms.analyze_core.report import (
    ALGORITHM_3,
    THEOREM_3_2,
    Truth,
    amplification_respondents,
    histogram_report,
    key_fields,
    longitudinal_report,
    missing_instance_note,
    privacy_summary,
    withheld_notes,
)

__all__ = [
    "ALGORITHM_3",
    "Accumulator",
    "BAD_WINDOW",
    "BatchAggregate",
    "BucketCounts",
    "CENSUS_NOT_COUNTED",
    "CRC_MISMATCH",
    "CrowdAccumulator",
    "CrowdKey",
    "DENSE_LIMIT",
    "HISTOGRAM",
    "HistogramResult",
    "LONGITUDINAL",
    "LongitudinalAccumulator",
    "LongitudinalResult",
    "MATERIALIZE_LIMIT",
    "MESSAGE_COLUMNS",
    "MISSING_FIELD",
    "POSTPROCESSING",
    "RECIPE_CHANNEL_MISMATCH",
    "RecipeBook",
    "SPARSE_PENDING_LIMIT",
    "THEOREM_3_2",
    "TREE_NODE_MISMATCH",
    "Truth",
    "UNKNOWN_RECIPE",
    "UNKNOWN_SCHEMA_VERSION",
    "aggregate_batch",
    "amplification_respondents",
    "crowd_key",
    "decode_limits",
    "effective_respondents",
    "estimate_histogram",
    "estimate_longitudinal",
    "histogram_accuracy",
    "histogram_report",
    "is_longitudinal",
    "key_fields",
    "longitudinal_report",
    "merge_accumulators",
    "merge_any",
    "missing_instance_note",
    "node_periods",
    "payloads_subset",
    "privacy_summary",
    "respondent_accumulators",
    "sparse_truth",
    "tree_node_matches_period",
    "values_at",
    "withheld_notes",
]

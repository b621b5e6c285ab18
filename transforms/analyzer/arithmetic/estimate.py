"""De-biasing: histogram estimates with standard errors and longitudinal marginals.

Counting respondents across K shuffler instances. A respondent sends each randomized message to
one instance ``u`` drawn from the recipe's ``instance_weights`` π. Shuffler ``u`` may withhold a
crowd or delete whole respondents (Algorithm 3, esa-privacy-revisited, on distinct origins), so
the instances' surviving populations differ. With ``n_u`` the respondents instance ``u`` states
it released for a crowd (its commit record), the expected bucket sums over all instances are
``Σ_u π_u Σ_{i alive in u} E[message counts of i]``, so the estimators are unbiased with the
effective respondent count ``n_eff = Σ_u π_u n_u``: the π-weighted surviving population (it
equals ``n`` when nothing was deleted or withheld).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
    clip_nonnegative,
    debias_one_hot,
    debias_report_fragments,
    debias_zero_sum,
    norm_sub,
    norm_sub_rows,
    one_hot_rows,
    report_fragment_rows,
    tree_node_offsets,
    zero_sum_rows,
)
from privacy.randomizers import (
    AsymmetricOneHot,
    BinaryRandomizedResponse,
    OneHotRappor,
    ReportFragmented,
    SymmetricOneHot,
    ZeroSumHistogram,
)
from schemas.recipes import Recipe
from transforms.analyzer.arithmetic.accumulate import (
    CrowdAccumulator,
    CrowdKey,
    LongitudinalAccumulator,
)


def effective_respondents(
    respondents: Mapping[int, int], instance_weights: Iterable[float]
) -> float:
    """``n_eff = Σ_u π_u n_u``: the respondent count the de-biasing estimators need.

    ``respondents[u]`` is ``respondents_released`` of the crowd in instance ``u``'s commit
    record and π the recipe's ``instance_weights`` (see the module docstring for why this keeps
    the estimators unbiased when shufflers withhold crowds or delete respondents).
    """
    weights = np.asarray(list(instance_weights), dtype=np.float64)
    if weights.ndim != 1 or weights.size == 0:
        raise ValueError("instance_weights must be a non-empty 1-D sequence")
    if np.any(weights < 0) or not math.isclose(float(weights.sum()), 1.0, abs_tol=1e-9):
        raise ValueError(f"instance_weights must be >= 0 and sum to 1, got {weights.tolist()}")
    n_eff = 0.0
    for instance, count in respondents.items():
        if not 0 <= int(instance) < weights.size:
            raise ValueError(
                f"respondents from shuffler instance {instance}, but the recipe has "
                f"{weights.size} instances"
            )
        if int(count) < 0:
            raise ValueError(f"respondent count for instance {instance} is negative: {count}")
        n_eff += float(weights[int(instance)]) * int(count)
    return n_eff


# ---------------------------------------------------------------------------------------------
# De-biasing
# ---------------------------------------------------------------------------------------------

POSTPROCESSING = ("none", "clip_nonnegative", "norm_sub")
# Sparse sums are expanded to a dense array for estimators that need the whole vector (sketches,
# binary randomized response) up to this many buckets (1 GiB of int64).
MATERIALIZE_LIMIT = 1 << 27


@dataclass(frozen=True, eq=False)
class HistogramResult:
    """The de-biased histogram of one crowd.

    ``estimate`` is unbiased (Invariant 6); ``postprocessed`` (labelled by ``postprocessing``) is
    the optional biased clean-up. Dense results cover every bucket of the randomizer's domain;
    sparse ones (domains above the dense limit) list the buckets that received messages, and
    every other bucket has the estimate ``unobserved_estimate`` with ``unobserved_stderr``.
    ``raw_count`` is the bucket sum behind each estimate when buckets and messages coincide.
    """

    key: CrowdKey
    domain_size: int
    buckets: np.ndarray
    estimate: np.ndarray
    stderr: np.ndarray
    raw_count: np.ndarray | None
    respondents: float
    respondents_by_instance: Mapping[int, int]
    messages: int
    postprocessing: str = "none"
    postprocessed: np.ndarray | None = None
    unobserved_estimate: float | None = None
    unobserved_stderr: float | None = None

    @property
    def dense(self) -> bool:
        return self.unobserved_estimate is None


def _elementwise_estimate(randomizer: Any, sums: np.ndarray, n: float) -> HistogramEstimate | None:
    """Estimates of randomizers whose bucket j depends only on S_j and n, for any subset of
    buckets (the same formulas as their ``estimate``); None for the others."""
    if isinstance(randomizer, ReportFragmented):
        return debias_report_fragments(
            sums, n, randomizer.backstop_keep, randomizer.fragment_keep, randomizer.fragments
        )
    if isinstance(randomizer, ZeroSumHistogram):
        return debias_zero_sum(sums, n, randomizer.p)
    if isinstance(randomizer, OneHotRappor | SymmetricOneHot | AsymmetricOneHot):
        return debias_one_hot(sums, n, randomizer.p_one, randomizer.p_zero)
    return None


def estimate_histogram(
    recipe: Recipe,
    key: CrowdKey,
    accumulator: CrowdAccumulator,
    postprocessing: str = "none",
) -> HistogramResult:
    """De-bias one crowd with the recipe's estimator at ``n_eff`` (:func:`effective_respondents`).

    Raises ValueError when no respondent was counted (nothing can be de-biased).
    """
    if postprocessing not in POSTPROCESSING:
        raise ValueError(f"postprocessing must be one of {POSTPROCESSING}, got {postprocessing!r}")
    randomizer = recipe.build_randomizer()
    n_eff = effective_respondents(accumulator.respondents, recipe.instance_weights)
    if n_eff <= 0:
        raise ValueError(f"{key}: no commit record states respondents, nothing to de-bias with")
    counts = accumulator.counts
    common = {
        "key": key,
        "respondents": n_eff,
        "respondents_by_instance": dict(sorted(accumulator.respondents.items())),
        "messages": accumulator.messages,
    }
    if not counts.is_dense:
        keys, values = counts.sparse()
        sparse = _elementwise_estimate(randomizer, np.append(values, 0), n_eff)
        if sparse is not None:
            return HistogramResult(
                domain_size=counts.domain_size,
                buckets=keys,
                estimate=sparse.estimate[:-1],
                stderr=sparse.stderr[:-1],
                raw_count=values,
                unobserved_estimate=float(sparse.estimate[-1]),
                unobserved_stderr=float(sparse.stderr[-1]),
                **common,
            )
        if counts.domain_size > MATERIALIZE_LIMIT:
            raise ValueError(
                f"{key}: {recipe.randomizer} over {counts.domain_size} buckets has no sparse "
                f"estimator and is too large to expand (limit {MATERIALIZE_LIMIT})"
            )
    sums = counts.dense()
    result = randomizer.estimate(sums, n_eff)
    postprocessed = None
    if postprocessing == "clip_nonnegative":
        postprocessed = clip_nonnegative(result).estimate
    elif postprocessing == "norm_sub":
        postprocessed = norm_sub(result).estimate
    return HistogramResult(
        domain_size=len(result),
        buckets=np.arange(len(result), dtype=np.int64),
        estimate=result.estimate,
        stderr=result.stderr,
        raw_count=sums if sums.size == len(result) else None,
        postprocessing=postprocessing,
        postprocessed=postprocessed,
        **common,
    )


# ---------------------------------------------------------------------------------------------
# Many crowds of one recipe at once
# ---------------------------------------------------------------------------------------------


def _row_estimate(
    randomizer: Any, sums: np.ndarray, n: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """(estimates, standard errors) of crowds stacked as rows of ``sums`` (float64, one row per
    crowd over the message domain) at ``n`` (a column of their n_eff), for the randomizers whose
    estimator is linear in the bucket sums with a standard error element-wise in (S_j, n): the
    same functions their one-crowd ``estimate`` calls (``privacy.estimators``), so each row is
    the one-crowd result to the last bit. None for the others (sketches, longitudinal clients)."""
    if isinstance(randomizer, ReportFragmented):
        return report_fragment_rows(
            sums, n, randomizer.backstop_keep, randomizer.fragment_keep, randomizer.fragments
        )
    if isinstance(randomizer, ZeroSumHistogram):
        return zero_sum_rows(sums, n, randomizer.p)
    if isinstance(randomizer, OneHotRappor | SymmetricOneHot | AsymmetricOneHot):
        return one_hot_rows(sums, n, randomizer.p_one, randomizer.p_zero)
    if isinstance(randomizer, BinaryRandomizedResponse):
        # [ĉ_0, ĉ_1] = [n - ĉ_1, ĉ_1] from the one bucket, both with ĉ_1's standard error
        # (BinaryRandomizedResponse.estimate, Section III of esa-privacy-revisited).
        ones, stderr = one_hot_rows(sums, n, randomizer.p_one, randomizer.p_zero)
        return np.concatenate([n - ones, ones], axis=1), np.repeat(stderr, 2, axis=1)
    return None


_ROW_RANDOMIZERS = (
    ReportFragmented,
    ZeroSumHistogram,
    OneHotRappor,
    SymmetricOneHot,
    AsymmetricOneHot,
    BinaryRandomizedResponse,
)


def estimates_rows(randomizer: Any) -> bool:
    """Whether :func:`estimate_histogram_rows` can de-bias crowds of ``randomizer`` together."""
    return isinstance(randomizer, _ROW_RANDOMIZERS)


@dataclass(frozen=True, eq=False)
class HistogramRows:
    """The de-biased histograms of crowds of one recipe over its dense domain, one row each.

    Row i is what :func:`estimate_histogram` makes of crowd ``keys[i]`` (:meth:`result` gives it
    as a :class:`HistogramResult`): ``estimate``, ``stderr`` and ``postprocessed`` are
    (crowds, domain) float64 matrices, ``raw_count`` the (crowds, message domain) int64 sums
    (None where the two domains differ), ``respondents`` the n_eff of each crowd.
    """

    keys: list[CrowdKey]
    estimate: np.ndarray
    stderr: np.ndarray
    raw_count: np.ndarray | None
    respondents: np.ndarray
    respondents_by_instance: list[dict[int, int]]
    messages: np.ndarray
    postprocessing: str = "none"
    postprocessed: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def domain_size(self) -> int:
        return int(self.estimate.shape[1])

    def result(self, row: int) -> HistogramResult:
        """Crowd ``row`` as :func:`estimate_histogram` returns it."""
        domain = self.domain_size
        return HistogramResult(
            key=self.keys[row],
            domain_size=domain,
            buckets=np.arange(domain, dtype=np.int64),
            estimate=self.estimate[row],
            stderr=self.stderr[row],
            raw_count=None if self.raw_count is None else self.raw_count[row],
            respondents=float(self.respondents[row]),
            respondents_by_instance=self.respondents_by_instance[row],
            messages=int(self.messages[row]),
            postprocessing=self.postprocessing,
            postprocessed=None if self.postprocessed is None else self.postprocessed[row],
        )


def estimate_histogram_rows(
    recipe: Recipe,
    randomizer: Any,
    keys: list[CrowdKey],
    accumulators: list[CrowdAccumulator],
    respondents: np.ndarray,
    postprocessing: str = "none",
) -> tuple[HistogramRows, np.ndarray]:
    """De-bias crowds of one recipe together: :func:`estimate_sum_rows` of their dense bucket
    sums stacked into a (crowds, message domain) matrix.

    ``randomizer``: ``recipe.build_randomizer()`` (:func:`estimates_rows` true), each
    accumulator dense over its ``message_domain_size``."""
    domain = randomizer.message_domain_size
    sums = np.zeros((len(accumulators), domain), dtype=np.int64)
    for row, accumulator in enumerate(accumulators):
        if not accumulator.counts.is_dense or accumulator.counts.domain_size != domain:
            raise ValueError(f"{keys[row]}: counts must be dense over {domain} buckets")
        sums[row] = accumulator.counts.dense()
    return estimate_sum_rows(
        randomizer,
        keys,
        sums,
        respondents,
        [a.respondents for a in accumulators],
        np.array([a.messages for a in accumulators], dtype=np.int64),
        postprocessing,
    )


def estimate_sum_rows(
    randomizer: Any,
    keys: list[CrowdKey],
    sums: np.ndarray,
    respondents: np.ndarray,
    respondents_by_instance: list[Mapping[int, int]],
    messages: np.ndarray,
    postprocessing: str = "none",
) -> tuple[HistogramRows, np.ndarray]:
    """De-bias crowds of one recipe together: their bucket sums (``sums``, a (crowds, message
    domain) int64 matrix) de-biased at once with the recipe's estimator at each crowd's
    ``respondents`` (its n_eff, :func:`effective_respondents`, > 0), standard errors and
    post-processing row by row (``privacy.estimators``: ``one_hot_rows`` for Section III of
    esa-privacy-revisited, ``report_fragment_rows`` for its Algorithm 2, ``zero_sum_rows`` for
    Figure 2 of shuffled-model-histograms, ``norm_sub_rows``). ``respondents_by_instance`` and
    ``messages``: each crowd's respondents per instance and messages, as its report states them.

    ``randomizer``: the recipe's (:func:`estimates_rows` true). Returns the rows that
    :func:`estimate_histogram` would have accepted (each equal to its one-crowd result) and
    the indices of the others, whose estimate is not finite: the one-crowd call says why.
    """
    if postprocessing not in POSTPROCESSING:
        raise ValueError(f"postprocessing must be one of {POSTPROCESSING}, got {postprocessing!r}")
    domain = randomizer.message_domain_size
    sums = np.asarray(sums, dtype=np.int64)
    if sums.shape != (len(keys), domain):
        raise ValueError(f"sums must be a ({len(keys)}, {domain}) matrix, got {sums.shape}")
    n = np.asarray(respondents, dtype=np.float64)
    if n.shape != (len(keys),) or not np.all(n > 0) or not np.all(np.isfinite(n)):
        raise ValueError("respondents must hold one finite n_eff > 0 per crowd")
    messages = np.asarray(messages, dtype=np.int64)
    estimate, stderr = _row_estimate(randomizer, sums.astype(np.float64), n[:, np.newaxis])
    # What HistogramEstimate refuses for one crowd: a non-finite estimate or stderr.
    good = np.isfinite(estimate).all(axis=1) & (stderr >= 0).all(axis=1)
    refused = np.flatnonzero(~good)
    if refused.size:
        keep = np.flatnonzero(good)
        sums, estimate, stderr, n = sums[keep], estimate[keep], stderr[keep], n[keep]
        keys = [keys[row] for row in keep.tolist()]
        respondents_by_instance = [respondents_by_instance[row] for row in keep.tolist()]
        messages = messages[keep]
    postprocessed = None
    if postprocessing == "clip_nonnegative":
        postprocessed = np.maximum(estimate, 0.0)
    elif postprocessing == "norm_sub":
        postprocessed = norm_sub_rows(estimate, n)
    rows = HistogramRows(
        keys=keys,
        estimate=estimate,
        stderr=stderr,
        raw_count=sums if domain == estimate.shape[1] else None,
        respondents=n,
        respondents_by_instance=[_sorted_mapping(r) for r in respondents_by_instance],
        messages=messages,
        postprocessing=postprocessing,
        postprocessed=postprocessed,
    )
    return rows, refused


def _sorted_mapping(mapping: Mapping[int, int]) -> dict[int, int]:
    """``mapping`` as a dict in key order: a one-entry dict itself (already in order, and
    nothing changes a crowd's respondents after its estimate), else a sorted copy."""
    if len(mapping) == 1 and type(mapping) is dict:
        return mapping
    return dict(sorted(mapping.items()))


def sparse_truth(buckets: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique buckets with their summed counts."""
    keys, inverse = np.unique(np.asarray(buckets, dtype=np.int64), return_inverse=True)
    return keys, np.bincount(inverse, weights=np.asarray(counts, np.float64), minlength=keys.size)


def values_at(buckets: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` of sorted ``keys`` looked up at ``buckets`` (0 where a bucket has no key)."""
    if keys.size == 0:
        return np.zeros(len(buckets))
    position = np.clip(np.searchsorted(keys, buckets), 0, keys.size - 1)
    return np.where(keys[position] == buckets, values[position], 0.0)


def histogram_accuracy(
    result: HistogramResult, truth_buckets: np.ndarray, truth_counts: np.ndarray
) -> dict[str, float]:
    """RMSE of the estimate against the truth over all buckets, next to the root mean square
    of the reported standard errors (what the RMSE should be, Invariant 6).

    The estimate counts the n_eff respondents behind the release; when shufflers deleted or
    withheld some, the truth of the whole population is scaled to n_eff first (deletion is
    uniform over respondents, so the survivors' expected histogram is the scaled truth;
    ``truth_scale`` is 1 when nothing was lost). Sparse results are compared over the whole
    domain: buckets that received no message carry ``unobserved_estimate``. Also: the largest
    |error| / stderr and the RMSE of the post-processed values when present.
    """
    truth_buckets = np.asarray(truth_buckets, dtype=np.int64)
    truth_counts = np.asarray(truth_counts, dtype=np.float64)
    if truth_buckets.shape != truth_counts.shape:
        raise ValueError("truth_buckets and truth_counts must have one shape")
    if truth_buckets.size and (
        truth_buckets.min() < 0 or truth_buckets.max() >= result.domain_size
    ):
        raise ValueError(f"truth buckets outside the domain [0, {result.domain_size})")
    total = float(truth_counts.sum())
    scale = result.respondents / total if total > 0 else 1.0
    truth_counts = truth_counts * scale
    domain = result.domain_size
    out: dict[str, float] = {"truth_total": total, "truth_scale": scale}
    if result.dense:
        truth = np.zeros(domain)
        np.add.at(truth, truth_buckets, truth_counts)
        error = result.estimate - truth
        out["rmse"] = float(np.sqrt(np.mean(error**2)))
        out["stderr_rms"] = float(np.sqrt(np.mean(result.stderr**2)))
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(result.stderr > 0, np.abs(error) / result.stderr, 0.0)
        out["max_abs_z"] = float(z.max()) if z.size else 0.0
        if result.postprocessed is not None:
            out["rmse_postprocessed"] = float(np.sqrt(np.mean((result.postprocessed - truth) ** 2)))
        return out
    # Sparse: buckets observed (K), buckets with truth only (T \ K), and the rest at the default.
    keys, values = sparse_truth(truth_buckets, truth_counts)
    observed_truth = values_at(result.buckets, keys, values)
    squared = float(np.sum((result.estimate - observed_truth) ** 2))
    e0 = float(result.unobserved_estimate)
    truth_only = ~np.isin(keys, result.buckets)
    squared += float(np.sum((e0 - values[truth_only]) ** 2))
    rest = domain - result.buckets.size - int(truth_only.sum())
    squared += rest * e0**2
    variance = (
        float(np.sum(result.stderr**2))
        + (domain - result.buckets.size) * float(result.unobserved_stderr) ** 2
    )
    out["rmse"] = math.sqrt(squared / domain)
    out["stderr_rms"] = math.sqrt(variance / domain)
    return out


# ---------------------------------------------------------------------------------------------
# Longitudinal counters
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LongitudinalResult:
    """Marginals f̃_t, t = 1..d, of one round (Algorithm 2, amplification-by-shuffling).

    ``bound``: Theorem 6's error bound α with P(max_t |f̃_t - f_t| > α) <= ``failure_probability``
    at ``respondents`` clients. ``respondents_per_period``: n_eff of each period's window.
    ``messages``: tree-node messages of the crowd over all its rounds.
    """

    key: CrowdKey
    round_start: int
    window_ms: int
    estimate: np.ndarray
    stderr: np.ndarray
    respondents: float
    respondents_per_period: np.ndarray
    bound: float
    failure_probability: float
    messages: int
    notes: tuple[str, ...] = ()

    @property
    def periods(self) -> int:
        return int(self.estimate.size)

    def window_starts(self) -> np.ndarray:
        return self.round_start + np.arange(self.periods, dtype=np.int64) * self.window_ms


def node_periods(periods: int) -> np.ndarray:
    """The period t at which Algorithm 1 reports each flat tree node [h, j]: t = j 2^(h-1)."""
    offsets = tree_node_offsets(periods)
    node = np.arange(2 * periods - 1, dtype=np.int64)
    level = np.searchsorted(offsets, node, side="right")
    j = node - offsets[level - 1] + 1
    return j << (level - 1)


def estimate_longitudinal(
    recipe: Recipe,
    key: CrowdKey,
    accumulator: LongitudinalAccumulator,
    failure_probability: float = 0.05,
) -> list[LongitudinalResult]:
    """Algorithm 2 (A_server, amplification-by-shuffling) for every round in ``accumulator``.

    Each period's window has its own respondent counts, so its n_eff_t = Σ_u π_u n_u,t. Node sums reported in
    period t are scaled by n / n_eff_t with n = max_t n_eff_t before the tree sums: randomized
    deletion removes respondents uniformly, so this keeps f̃_t unbiased for the n clients
    (the factor is 1 when nothing was deleted). A period no instance released (withheld
    everywhere) cannot be rescaled; its nodes count as 0 and a note says so.
    """
    if not 0 < failure_probability < 1:
        raise ValueError(f"failure_probability must be in (0, 1), got {failure_probability}")
    randomizer = recipe.build_randomizer()
    periods = randomizer.periods
    weights = recipe.instance_weights
    reported_at = node_periods(periods)
    results = []
    for round_start in sorted(accumulator.nodes):
        windows = round_start + np.arange(periods, dtype=np.int64) * accumulator.window_ms
        per_period = np.array(
            [
                effective_respondents(
                    {u: c for (w, u), c in accumulator.respondents.items() if w == window}, weights
                )
                for window in windows.tolist()
            ]
        )
        n = float(per_period.max())
        notes = []
        if n <= 0:
            notes.append("no respondents released in any period: nothing to estimate")
            continue
        missing = np.flatnonzero(per_period <= 0) + 1
        if missing.size:
            notes.append(
                f"periods {missing.tolist()} have no respondents (withheld): their nodes count as 0"
            )
        scale = np.where(per_period > 0, n / np.where(per_period > 0, per_period, 1.0), 0.0)
        sums = accumulator.nodes[round_start].dense().astype(np.float64) * scale[reported_at - 1]
        result = randomizer.estimate(sums, n)
        results.append(
            LongitudinalResult(
                key=key,
                round_start=int(round_start),
                window_ms=accumulator.window_ms,
                estimate=result.estimate,
                stderr=result.stderr,
                respondents=n,
                respondents_per_period=per_period,
                bound=randomizer.error_bound(max(n, 1.0), failure_probability),
                failure_probability=failure_probability,
                messages=accumulator.messages,
                notes=tuple(notes),
            )
        )
    return results

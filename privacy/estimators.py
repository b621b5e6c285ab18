"""De-biasing estimators for the local randomizers, with their variances.

Every estimator here turns released bucket sums (sum of message signs per bucket) into an unbiased
estimate of the number of respondents holding each value, with a standard error from the exact
variance formula (plugging in the estimate where the variance depends on the unknown counts).
Post-processing that trades unbiasedness for plausibility (:func:`clip_nonnegative`,
:func:`norm_sub`) is never applied silently: it returns a new estimate whose ``postprocessing``
label says what was done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True, eq=False)
class HistogramEstimate:
    """Estimated count of respondents per value, with standard errors.

    estimate: float64 estimates, one per value of the domain (unbiased unless ``postprocessing``
        says otherwise).
    stderr: float64 standard errors of the unbiased estimate (post-processing does not change them).
    respondents: the number of respondents n the estimate was computed for.
    postprocessing: "none" for the unbiased estimate, otherwise the name of what was applied.
    """

    estimate: np.ndarray
    stderr: np.ndarray
    respondents: float
    postprocessing: str = "none"

    def __post_init__(self) -> None:
        estimate = np.asarray(self.estimate, dtype=np.float64)
        stderr = np.asarray(self.stderr, dtype=np.float64)
        if estimate.ndim != 1:
            raise ValueError(f"estimate must be a 1-D array, got shape {estimate.shape}")
        if stderr.shape != estimate.shape:
            raise ValueError(f"stderr shape {stderr.shape} differs from estimate {estimate.shape}")
        if not np.all(np.isfinite(estimate)):
            raise ValueError("estimate must be finite")
        if not np.all(stderr >= 0):
            raise ValueError("stderr must be non-negative and not NaN")
        respondents = float(self.respondents)
        if not (math.isfinite(respondents) and respondents >= 0):
            raise ValueError(f"respondents must be finite and >= 0, got {self.respondents}")
        if not isinstance(self.postprocessing, str) or not self.postprocessing:
            raise ValueError("postprocessing must be a non-empty string")
        object.__setattr__(self, "estimate", estimate)
        object.__setattr__(self, "stderr", stderr)
        object.__setattr__(self, "respondents", respondents)

    def __len__(self) -> int:
        return int(self.estimate.size)


def _checked_sums(bucket_sums: np.ndarray, expected_length: int, name: str = "bucket_sums"):
    sums = np.asarray(bucket_sums)
    if sums.ndim != 1 or sums.size != expected_length:
        raise ValueError(
            f"{name} must be a 1-D array of length {expected_length}, got {sums.shape}"
        )
    if sums.size and not np.all(np.isfinite(sums)):
        raise ValueError(f"{name} must be finite")
    return sums.astype(np.float64)


def _checked_respondents(respondents: float) -> float:
    value = float(respondents)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"respondents must be finite and >= 0, got {respondents}")
    return value


def _check_probabilities(p_one: float, p_zero: float) -> None:
    if not (0.0 <= p_zero < p_one <= 1.0):
        raise ValueError(f"need 0 <= p_zero < p_one <= 1, got p_one={p_one}, p_zero={p_zero}")


def debias_one_hot(
    bucket_sums: np.ndarray, respondents: float, p_one: float, p_zero: float
) -> HistogramEstimate:
    """Unbiased counts from per-bit randomized response on one-hot vectors.

    Each bit is reported as 1 with probability ``p_one`` if set and ``p_zero`` if not, so
    E[S_j] = c_j p_one + (n - c_j) p_zero and ĉ_j = (S_j - n p_zero) / (p_one - p_zero): the ĥ_j of
    Section III (esa-privacy-revisited) times n; Algorithm 2 / Theorem A.2 and Algorithm 4 /
    Theorem C.2 (samplable-anonymous-aggregation; Algorithm 2 there prints the offset n/(e^ε-1)
    where unbiasedness needs 2n/(e^ε-1)). Var ĉ_j = [c_j p_one(1-p_one)
    + (n-c_j) p_zero(1-p_zero)] / (p_one-p_zero)^2, with c_j clipped to [0, n] plugged in.
    """
    n = _checked_respondents(respondents)
    sums = np.asarray(bucket_sums, dtype=np.float64)
    if sums.ndim != 1:
        raise ValueError(f"bucket_sums must be a 1-D array, got shape {sums.shape}")
    return HistogramEstimate(*one_hot_rows(sums, n, p_one, p_zero), n)


def one_hot_rows(
    sums: np.ndarray, respondents: np.ndarray | float, p_one: float, p_zero: float
) -> tuple[np.ndarray, np.ndarray]:
    """(ĉ, standard error) of :func:`debias_one_hot` for float64 ``sums`` of any shape, with
    ``respondents`` broadcast against them: one crowd per row of a (crowds, buckets) matrix
    and its n as a (crowds, 1) column give, row by row, the very numbers of the one-crowd call
    (the same element-wise operations in the same order)."""
    _check_probabilities(p_one, p_zero)
    n = respondents
    gap = p_one - p_zero
    estimate = (sums - n * p_zero) / gap
    plugged = np.clip(estimate, 0.0, n)
    variance = (plugged * p_one * (1 - p_one) + (n - plugged) * p_zero * (1 - p_zero)) / gap**2
    return estimate, np.sqrt(variance)


def debias_report_fragments(
    bucket_sums: np.ndarray,
    respondents: float,
    backstop_keep: float,
    fragment_keep: float,
    fragments: int,
) -> HistogramEstimate:
    """Unbiased counts from r-frag(att-frag(k-RAPPOR), τ), bucket sums added over the τ fragments.

    Per bit (Algorithm 2, esa-privacy-revisited): x' keeps the bit with probability
    a = ``backstop_keep``, each fragment keeps x' with probability r = ``fragment_keep``. A set bit
    yields a 1 per fragment with probability a r + (1-a)(1-r), an unset one with
    (1-a) r + a(1-r); the difference is (2a-1)(2r-1). The τ fragments of one respondent share x',
    so the variance of their sum is τ r(1-r) + τ^2 (2r-1)^2 a(1-a), the same for set and unset bits:
    Var ĉ_j = n [τ r(1-r) + τ^2 (2r-1)^2 a(1-a)] / (τ (2a-1)(2r-1))^2, independent of the counts.
    """
    n = _checked_respondents(respondents)
    sums = np.asarray(bucket_sums, dtype=np.float64)
    if sums.ndim != 1:
        raise ValueError(f"bucket_sums must be a 1-D array, got shape {sums.shape}")
    return HistogramEstimate(
        *report_fragment_rows(sums, n, backstop_keep, fragment_keep, fragments), n
    )


def report_fragment_rows(
    sums: np.ndarray,
    respondents: np.ndarray | float,
    backstop_keep: float,
    fragment_keep: float,
    fragments: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(ĉ, standard error) of :func:`debias_report_fragments` for float64 ``sums`` of any shape
    with ``respondents`` broadcast against them (rows of crowds, as :func:`one_hot_rows`)."""
    if fragments < 1:
        raise ValueError(f"fragments must be >= 1, got {fragments}")
    if not (0.5 < backstop_keep <= 1 and 0.5 < fragment_keep <= 1):
        raise ValueError("backstop_keep and fragment_keep must be in (0.5, 1]")
    n = respondents
    a, r, tau = backstop_keep, fragment_keep, float(fragments)
    p_zero = (1 - a) * r + a * (1 - r)
    gap = (2 * a - 1) * (2 * r - 1)
    estimate = (sums / tau - n * p_zero) / gap
    per_respondent = tau * r * (1 - r) + tau**2 * (2 * r - 1) ** 2 * a * (1 - a)
    # sqrt is correctly rounded in math and numpy alike: the one-crowd and row numbers agree.
    stderr = np.broadcast_to(np.sqrt(n * per_respondent) / (tau * gap), sums.shape).copy()
    return estimate, stderr


def debias_zero_sum(bucket_sums: np.ndarray, respondents: float, p: float) -> HistogramEstimate:
    """Unbiased counts from P_hist (Figure 2, shuffled-model-histograms).

    Bucket j receives c_j + Bin(n, p) messages, so ĉ_j = S_j - n p with variance n p (1-p).
    """
    n = _checked_respondents(respondents)
    sums = np.asarray(bucket_sums, dtype=np.float64)
    if sums.ndim != 1:
        raise ValueError(f"bucket_sums must be a 1-D array, got shape {sums.shape}")
    return HistogramEstimate(*zero_sum_rows(sums, n, p), n)


def zero_sum_rows(
    sums: np.ndarray, respondents: np.ndarray | float, p: float
) -> tuple[np.ndarray, np.ndarray]:
    """(ĉ, standard error) of :func:`debias_zero_sum` for float64 ``sums`` of any shape with
    ``respondents`` broadcast against them (rows of crowds, as :func:`one_hot_rows`)."""
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"p must be in [0, 1], got {p}")
    n = respondents
    stderr = np.broadcast_to(np.sqrt(n * p * (1 - p)), sums.shape).copy()
    return sums - n * p, stderr


def count_mean_sketch_collision_moment(
    sketch_sums: np.ndarray, respondents: float, p_one: float, p_zero: float
) -> float:
    """Estimate of F2 = Σ_v f(v)^2 from a one-row-per-respondent count-mean sketch.

    ``sketch_sums`` is the (num_hashes, width) matrix of bucket sums. Cell (j, c) is unbiased for
    C_jc = #{i : h_j(v_i) = c} after ĉ = (k S - n p_zero)/(p_one - p_zero); Ĉ^2 minus its variance
    estimate is unbiased for C_jc^2, and E_h Σ_c C_jc^2 = F2 + (n^2 - F2)/m for a universal hash
    (Section II-B sketches, esa-privacy-revisited). Used only for the hash-collision variance.
    """
    _check_probabilities(p_one, p_zero)
    n = _checked_respondents(respondents)
    sums = np.asarray(sketch_sums, dtype=np.float64)
    if sums.ndim != 2:
        raise ValueError(f"sketch_sums must be 2-D (num_hashes, width), got {sums.shape}")
    k, m = sums.shape
    gap = p_one - p_zero
    per_row = np.empty(k, dtype=np.float64)
    for first in range(0, k, 64):  # blocks of rows bound the temporaries (1,024 x 65,536 sketches)
        cells = (k * sums[first : first + 64] - n * p_zero) / gap
        # Var S_jc = Σ_i ρ_i(1-ρ_i) with ρ_i = (p_zero + gap 1[h_j(v_i)=c]) / k: linear in C_jc.
        variance_of_sums = (n * p_zero + gap * cells) / k - (
            n * p_zero**2 + (2 * p_zero * gap + gap**2) * cells
        ) / k**2
        squares = cells**2 - (k / gap) ** 2 * variance_of_sums
        per_row[first : first + 64] = squares.sum(axis=1)
    if m == 1:
        return float(n * n)
    f2 = float(np.mean((m * per_row - n * n) / (m - 1)))
    return min(max(f2, 0.0), n * n)


def count_mean_sketch_estimate(
    hashed_sums: np.ndarray,
    respondents: float,
    num_hashes: int,
    width: int,
    p_one: float,
    p_zero: float,
    collision_moment: float,
) -> HistogramEstimate:
    """Count-mean-sketch estimate (Section II-B, esa-privacy-revisited) for one row per respondent.

    ``hashed_sums[v]`` = Σ_j S_{j, h_j(v)}. Each respondent reports one-hot RR over the ``width``
    bits of one uniformly chosen row, so E[S_jc] = (n p_zero + (p_one - p_zero) C_jc) / k and
    f̂(v) = m/(m-1) [ (Σ_j S_{j,h_j(v)} - n p_zero)/(p_one - p_zero) - n/m ],
    unbiased over the draw of a universal hash family. Its variance has the randomized-response
    and row-sampling part (exact up to the plug-in of f(v)) and the hash-collision part
    F2' / (k (m-1)) with F2' = ``collision_moment`` - f(v)^2.
    """
    _check_probabilities(p_one, p_zero)
    n = _checked_respondents(respondents)
    if num_hashes < 1 or width < 2:
        raise ValueError(f"need num_hashes >= 1 and width >= 2, got {num_hashes}, {width}")
    sums = np.asarray(hashed_sums, dtype=np.float64)
    if sums.ndim != 1:
        raise ValueError(f"hashed_sums must be a 1-D array, got shape {sums.shape}")
    k, m, gap = float(num_hashes), float(width), p_one - p_zero
    scale = m / (m - 1)
    estimate = scale * ((sums - n * p_zero) / gap - n / m)
    plugged = np.clip(estimate, 0.0, n)
    # Per respondent with v_i != v: X ~ Bernoulli(p_zero + gap g), g = fraction of rows where v_i
    # collides with v; E g = 1/m, E g^2 = (1/m)(1-1/m)/k + 1/m^2 over the hash draw.
    mean_g2 = (1 / m) * (1 - 1 / m) / k + 1 / m**2
    other = p_zero * (1 - p_zero) + gap * (1 - 2 * p_zero) / m - gap**2 * mean_g2
    rr_variance = scale**2 * (plugged * p_one * (1 - p_one) + (n - plugged) * other) / gap**2
    collision_variance = np.maximum(collision_moment - plugged**2, 0.0) / (k * (m - 1))
    return HistogramEstimate(estimate, np.sqrt(rr_variance + collision_variance), n)


def _tree_levels(periods: int) -> int:
    if periods < 1 or periods & (periods - 1):
        raise ValueError(f"periods must be a power of two, got {periods}")
    return periods.bit_length()


def tree_node_offsets(periods: int) -> np.ndarray:
    """First flat index of each tree level h = 1..log2(d)+1 (leaves first), length log2(d)+1.

    Level h has d / 2^(h-1) nodes [h, j], j = 1..d/2^(h-1) (notation of Section 3,
    amplification-by-shuffling); node [h, j] has flat index offsets[h-1] + j - 1, 2d - 1 in all.
    """
    levels = _tree_levels(periods)
    sizes = periods >> np.arange(levels)
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def longitudinal_marginals(
    node_sums: np.ndarray,
    respondents: float,
    periods: int,
    max_changes: int,
    node_keep: float,
) -> HistogramEstimate:
    """Algorithm 2 (A_server, amplification-by-shuffling): marginals f̃_t for t = 1..d.

    ``node_sums`` are the tree sums T_sum in flat order (:func:`tree_node_offsets`). The interval
    [1, t] is covered by the nodes [h, t >> (h-1)] for each set bit h-1 of t (Steps 6-9), and
    f̃_t = c k L Σ_C T_sum with c = 1/(2 ``node_keep`` - 1) and L = log2(d) + 1 levels: the client
    picks one of L levels (the paper writes log2(d); L keeps the estimate unbiased). Each client
    adds c k L u (u = ±1) for the node of its level in C, so Var f̃_t = (c k L)^2 n |C_t| / L - F_t
    for boolean states (F_t, the true count, clipped estimate plugged in).
    """
    n = _checked_respondents(respondents)
    levels = _tree_levels(periods)
    if max_changes < 1:
        raise ValueError(f"max_changes must be >= 1, got {max_changes}")
    if not (0.5 < node_keep <= 1):
        raise ValueError(f"node_keep must be in (0.5, 1], got {node_keep}")
    sums = _checked_sums(node_sums, 2 * periods - 1, "node_sums")
    offsets = tree_node_offsets(periods)
    t = np.arange(1, periods + 1, dtype=np.int64)
    covered = np.zeros(periods, dtype=np.float64)
    cover_size = np.zeros(periods, dtype=np.int64)
    for level in range(1, levels + 1):
        in_cover = ((t >> (level - 1)) & 1).astype(bool)
        node = offsets[level - 1] + (t[in_cover] >> (level - 1)) - 1
        covered[in_cover] += sums[node]
        cover_size += in_cover
    scale = max_changes * levels / (2 * node_keep - 1)
    estimate = scale * covered
    plugged = np.clip(estimate, 0.0, n)
    variance = np.maximum(scale**2 * n * cover_size / levels - plugged, 0.0)
    return HistogramEstimate(estimate, np.sqrt(variance), n)


def theorem6_error_bound(
    respondents: float,
    periods: int,
    max_changes: int,
    epsilon: float,
    failure_probability: float = 1 / 3,
) -> float:
    """Bound α with P(max_t |f̃_t - f_t| > α) <= ``failure_probability`` (Theorem 6).

    Theorem 6 (amplification-by-shuffling) is stated as O(c_ε (log d)^2 sqrt(n k)) for failure
    probability 1/3; this is the explicit bound its proof gives once the constants are kept. With
    c = (e^ε+1)/(e^ε-1) (node randomized response at ε, as :class:`LongitudinalClient`
    calibrates it) and L = log2(d) + 1, each client adds Z_i ∈ {0, ±c k L} to f̃_t, with
    |Z_i - E Z_i| <= c k L + 1 and Σ Var Z_i <= n (c k L)^2 max_t|C_t| / L. Bernstein's inequality
    per period and a union bound over the d periods give, with ℓ = ln(2d/β) and M = c k L + 1,
    α = M ℓ / 3 + sqrt((M ℓ / 3)^2 + 2 σ^2 ℓ). The leading term grows like k, not sqrt(k): every
    client's report is scaled by c k L whether or not it carries a change.
    """
    n = _checked_respondents(respondents)
    levels = _tree_levels(periods)
    if max_changes < 1:
        raise ValueError(f"max_changes must be >= 1, got {max_changes}")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
    if not (0 < failure_probability < 1):
        raise ValueError(f"failure_probability must be in (0, 1), got {failure_probability}")
    c = 1 / math.tanh(epsilon / 2)  # (e^ε + 1) / (e^ε - 1)
    scale = c * max_changes * levels
    largest_cover = max(1, levels - 1)
    variance = n * scale**2 * largest_cover / levels
    log_term = math.log(2 * periods / failure_probability)
    range_term = (scale + 1) * log_term / 3
    return range_term + math.sqrt(range_term**2 + 2 * variance * log_term)


def clip_nonnegative(estimate: HistogramEstimate) -> HistogramEstimate:
    """Negative estimates set to 0 (biased upward for small counts); labelled "clip_nonnegative"."""
    return replace(
        estimate,
        estimate=np.maximum(estimate.estimate, 0.0),
        postprocessing=_label(estimate, "clip_nonnegative"),
    )


def norm_sub(estimate: HistogramEstimate, total: float | None = None) -> HistogramEstimate:
    """Consistency projection: the closest non-negative vector summing to ``total`` (default n).

    This is Norm-Sub, max(ĉ_j - θ, 0) with θ chosen so the result sums to ``total``: the Euclidean
    projection onto the scaled simplex (sort-based, O(d log d)). Biased; labelled "norm_sub".
    """
    target = estimate.respondents if total is None else float(total)
    if not (math.isfinite(target) and target >= 0):
        raise ValueError(f"total must be finite and >= 0, got {total}")
    projected = norm_sub_rows(estimate.estimate[np.newaxis], np.array([target]))[0]
    return replace(estimate, estimate=projected, postprocessing=_label(estimate, "norm_sub"))


def norm_sub_rows(values: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """:func:`norm_sub` of every row of a (crowds, buckets) matrix, row i summing to
    ``totals[i]`` (>= 0): each row sorted, summed and thresholded as the one-row case would be."""
    values = np.asarray(values, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.float64)
    if values.ndim != 2 or totals.shape != values.shape[:1]:
        raise ValueError(f"values must be (rows, buckets) with one total per row, got "
                         f"{values.shape} and {totals.shape}")  # fmt: skip
    projected = np.zeros_like(values)
    live = np.flatnonzero(totals != 0) if values.shape[1] else np.zeros(0, np.intp)
    if live.size == 0:
        return projected
    rows, target = values[live], totals[live, np.newaxis]
    descending = np.sort(rows, axis=1)[:, ::-1]
    excess = np.cumsum(descending, axis=1) - target
    ranks = np.arange(1, rows.shape[1] + 1)
    positive = descending - excess / ranks > 0
    # The last positive rank of each row (the first is, but for rounding at huge values).
    support = rows.shape[1] - 1 - np.argmax(positive[:, ::-1], axis=1)
    support[~positive.any(axis=1)] = 0
    theta = excess[np.arange(live.size), support] / (support + 1)
    projected[live] = np.maximum(rows - theta[:, np.newaxis], 0.0)
    return projected


def _label(estimate: HistogramEstimate, step: str) -> str:
    return step if estimate.postprocessing == "none" else f"{estimate.postprocessing}+{step}"

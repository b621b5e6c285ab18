"""The zero-sum multi-message histogram protocol (P_hist of shuffled-model-histograms)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
    debias_zero_sum,
)
from privacy.messages import MessageBatch
from privacy.randomizers.base import (
    _DENSE_CHUNK_CELLS,
    LdpKind,
    LocalRandomizer,
    _batch,
    _check_epsilon,
    _check_int,
    _check_true_counts,
    _check_values,
)


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

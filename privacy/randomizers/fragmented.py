"""Report fragmentation: tau re-randomized fragments of a backstop report
(Section IV of esa-privacy-revisited)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
    debias_report_fragments,
)
from privacy.messages import MessageBatch
from privacy.randomizers.base import (
    _MESSAGE_COLUMNS,
    LdpKind,
    LocalRandomizer,
    _batch,
    _bit_flip_messages,
    _check_epsilon,
    _check_int,
    _check_true_counts,
    _check_values,
    _keep_probability,
    _one_hot_messages,
    _randomized_response_sums,
)


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

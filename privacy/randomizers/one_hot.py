"""One-hot randomized response: binary RR, k-RAPPOR, symmetric and asymmetric one-hot
(Algorithm 1 and Section II-B of esa-privacy-revisited)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
    debias_one_hot,
)
from privacy.messages import MessageBatch
from privacy.randomizers.base import (
    LdpKind,
    _batch,
    _check_epsilon,
    _check_int,
    _check_true_counts,
    _check_values,
    _EpsilonRandomizedResponse,
    _one_hot_messages,
    _randomized_response_sums,
)


@dataclass(frozen=True)
class _OneHotBitFlip(_EpsilonRandomizedResponse):
    """Per-bit randomized response on the one-hot vector of a value, emitting set-bit indices."""

    domain_size: int
    epsilon: float

    payload_kind: ClassVar[str] = "bucket"

    def __post_init__(self) -> None:
        _check_int(self, "domain_size", 1)
        _check_epsilon(self, "epsilon")

    @property
    def message_domain_size(self) -> int:
        return self.domain_size

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        values = _check_values(values, self.domain_size)
        return _batch(*_one_hot_messages(values, self.domain_size, self.p_one, self.p_zero, rng))

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        return debias_one_hot(
            self._check_bucket_sums(bucket_sums), respondents, self.p_one, self.p_zero
        )

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Released bucket sums drawn from their exact distribution, without making messages.

        S_j = Binomial(c_j, p_one) + Binomial(n - c_j, p_zero), independent across buckets.
        """
        counts = _check_true_counts(true_counts, self.domain_size)
        return _randomized_response_sums(counts, int(counts.sum()), self.p_one, self.p_zero, rng)

    def expected_messages_per_respondent(self) -> float:
        """p_one + (d - 1) p_zero set bits (Section II-B, esa-privacy-revisited)."""
        return self.p_one + (self.domain_size - 1) * self.p_zero


# --------------------------------------------------------------------------------------------
# Randomizers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BinaryRandomizedResponse(_EpsilonRandomizedResponse):
    """Randomized response on one boolean (values 0 = false, 1 = true; domain_size 2).

    The randomized bit is 1 with probability e^ε/(1+e^ε) if the value is 1 and 1/(1+e^ε) if it is
    0. It is sent as a one-hot vector over a single bucket: a message (bucket 0) only when the
    randomized bit is 1, nothing otherwise, so message_domain_size is 1. Replacement ε-LDP.
    """

    epsilon: float

    name: ClassVar[str] = "binary_rr"
    payload_kind: ClassVar[str] = "bucket"
    ldp_kind: ClassVar[LdpKind] = "replacement"

    def __post_init__(self) -> None:
        _check_epsilon(self, "epsilon")

    @property
    def domain_size(self) -> int:
        return 2

    @property
    def message_domain_size(self) -> int:
        return 1

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        values = _check_values(values, 2)
        probability = np.where(values == 1, self.p_one, self.p_zero)
        respondents = np.flatnonzero(rng.random(values.size) < probability)
        return _batch(respondents, np.zeros(respondents.size, np.int64))

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        """Counts of [false, true]: ĉ_1 from the one bucket (Section III), ĉ_0 = n - ĉ_1."""
        ones = debias_one_hot(
            self._check_bucket_sums(bucket_sums), respondents, self.p_one, self.p_zero
        )
        n = ones.respondents
        return HistogramEstimate(
            np.array([n - ones.estimate[0], ones.estimate[0]]),
            np.repeat(ones.stderr, 2),
            n,
        )

    def sample_bucket_sums(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The one bucket sum, Binomial(c_1, p_one) + Binomial(c_0, p_zero); true_counts = [c_0, c_1]."""
        counts = _check_true_counts(true_counts, 2)
        return _randomized_response_sums(
            counts[1:], int(counts.sum()), self.p_one, self.p_zero, rng
        )

    def expected_messages_per_respondent(self, fraction_true: float) -> float:
        """Messages per respondent when a fraction ``fraction_true`` of them holds 1."""
        if not (0.0 <= fraction_true <= 1.0):
            raise ValueError(f"fraction_true must be in [0, 1], got {fraction_true}")
        return self.p_zero + (self.p_one - self.p_zero) * fraction_true


@dataclass(frozen=True)
class OneHotRappor(_OneHotBitFlip):
    """att-frag(R_k-RAPPOR), Algorithm 1 (esa-privacy-revisited).

    Every bit of the one-hot vector goes through randomized response that keeps it with
    probability e^ε/(1+e^ε); each set bit is sent as its own message. Removal ε-LDP with respect to
    the randomized all-zeros vector (Theorem III.1).
    """

    name: ClassVar[str] = "one_hot_rappor"
    ldp_kind: ClassVar[LdpKind] = "removal"


@dataclass(frozen=True)
class SymmetricOneHot(_OneHotBitFlip):
    """Symmetric private one-hot encoding, Algorithm 3 / Theorem C.1 (samplable-anonymous-aggregation).

    Each coordinate is kept with probability e^ε/(1+e^ε): ε-LDP in the deletion (removal) model,
    2ε in the replacement model. The server side is Algorithm 4 (Theorem C.2).
    """

    name: ClassVar[str] = "symmetric_one_hot"
    ldp_kind: ClassVar[LdpKind] = "removal"

    @property
    def replacement_epsilon(self) -> float:
        """2ε: the replacement-model guarantee noted after Theorem C.1."""
        return 2 * self.epsilon


@dataclass(frozen=True)
class AsymmetricOneHot(_OneHotBitFlip):
    """Asymmetric private one-hot encoding, Algorithm 1 / Theorem A.1 (samplable-anonymous-aggregation).

    The respondent's own coordinate is reported set with probability 1/2, every other one with
    1/(e^ε+1): replacement ε-LDP. The server side is Algorithm 2 (Theorem A.2: variance
    n 4e^ε/(e^ε-1)^2 + f(d)).
    """

    name: ClassVar[str] = "asymmetric_one_hot"
    ldp_kind: ClassVar[LdpKind] = "replacement"

    @property
    def p_one(self) -> float:
        return 0.5

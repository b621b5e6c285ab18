"""Longitudinal client: d-period tree reports (Algorithm 1 and Theorem 6 of
amplification-by-shuffling)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from privacy.estimators import (
    HistogramEstimate,
    longitudinal_marginals,
    theorem6_error_bound,
    tree_node_offsets,
)
from privacy.messages import MessageBatch
from privacy.randomizers.base import (
    LdpKind,
    LocalRandomizer,
    _batch,
    _check_epsilon,
    _check_int,
    _keep_probability,
)


@dataclass(frozen=True, eq=False)
class LongitudinalState:
    """Per-client state of Algorithm 1 (amplification-by-shuffling), one entry per client.

    chosen_change: i* ∈ [k]; level: h* ∈ [log2(d) + 1]; changes_seen: the counter i;
    pending: the counter c ∈ {-1, 0, 1}; period: the last period processed (0 before the first).
    """

    chosen_change: np.ndarray
    level: np.ndarray
    changes_seen: np.ndarray
    pending: np.ndarray
    period: int

    def __post_init__(self) -> None:
        size = np.asarray(self.chosen_change).shape
        for name in ("level", "changes_seen", "pending"):
            if np.asarray(getattr(self, name)).shape != size:
                raise ValueError(f"{name} must have the shape of chosen_change {size}")
        if self.period < 0:
            raise ValueError(f"period must be >= 0, got {self.period}")


@dataclass(frozen=True)
class LongitudinalClient(LocalRandomizer):
    """A_client, Algorithm 1 (amplification-by-shuffling): a boolean tracked over d periods.

    Input: an (n, d) boolean array of states, the state before period 1 being 0; a state may
    change at most k = ``max_changes`` times. Each client samples the change i* ∈ [k] it will
    report and a tree level h* ∈ [log2(d) + 1]; at every period t divisible by 2^(h*-1) it sends
    (h*, t, u) for tree node [h*, t / 2^(h*-1)], u = ±1: randomized response on the i*-th change if
    it fell into that node, a fair coin otherwise. Messages carry the period t, the node's flat
    index as bucket (:func:`~privacy.estimators.tree_node_offsets`) and u as sign.

    Calibration: the selected change is non-zero in exactly one node per level, so two inputs
    differ in at most two nodes of the reported level, one of them 0 in each input; the exact
    worst-case likelihood ratio is the node bias itself (checked in the tests). Algorithm 1 uses
    node bias e^(ε/2) and claims ε; here the bias is e^ε, which meets replacement ε-LDP exactly.
    The domain is the d periods: :meth:`estimate` returns the marginals f̃_1..f̃_d (Algorithm 2).
    """

    periods: int
    max_changes: int
    epsilon: float

    name: ClassVar[str] = "longitudinal"
    payload_kind: ClassVar[str] = "tree_node"
    ldp_kind: ClassVar[LdpKind] = "replacement"

    def __post_init__(self) -> None:
        periods = _check_int(self, "periods", 1)
        if periods & (periods - 1) or periods > 2**30:
            raise ValueError(f"periods must be a power of two <= 2^30, got {periods}")
        _check_int(self, "max_changes", 1)
        _check_epsilon(self, "epsilon")

    @property
    def epsilon_local(self) -> float:
        return self.epsilon

    @property
    def levels(self) -> int:
        """L = log2(d) + 1 tree levels."""
        return self.periods.bit_length()

    @property
    def node_keep(self) -> float:
        """Probability that a node holding the change reports its sign: e^ε/(1+e^ε)."""
        return _keep_probability(self.epsilon)

    @property
    def domain_size(self) -> int:
        return self.periods

    @property
    def message_domain_size(self) -> int:
        return 2 * self.periods - 1

    def start(self, respondents: int, rng: np.random.Generator) -> LongitudinalState:
        """SETUP(d, k) for ``respondents`` clients: i* ~ U[k], h* ~ U[log2(d) + 1]."""
        if respondents < 0:
            raise ValueError(f"respondents must be >= 0, got {respondents}")
        return LongitudinalState(
            chosen_change=rng.integers(1, self.max_changes + 1, size=respondents),
            level=rng.integers(1, self.levels + 1, size=respondents),
            changes_seen=np.zeros(respondents, np.int64),
            pending=np.zeros(respondents, np.int64),
            period=0,
        )

    def update(
        self, state: LongitudinalState, changes: np.ndarray, rng: np.random.Generator
    ) -> tuple[LongitudinalState, MessageBatch]:
        """UPDATE(t, x_t, ε) for period t = state.period + 1; ``changes`` x_t ∈ {-1, 0, 1} per client."""
        t = state.period + 1
        if t > self.periods:
            raise ValueError(f"all {self.periods} periods were already processed")
        changes = np.asarray(changes)
        if changes.shape != state.pending.shape:
            raise ValueError(f"changes must have shape {state.pending.shape}, got {changes.shape}")
        if changes.size and not np.isin(changes, (-1, 0, 1)).all():
            raise ValueError("changes must be -1, 0 or +1")
        changes = changes.astype(np.int64)
        changed = changes != 0
        seen = state.changes_seen + changed
        pending = np.where(changed & (seen == state.chosen_change), changes, state.pending)
        stride = np.left_shift(1, state.level - 1)
        reporters = np.flatnonzero(t % stride == 0)
        held = pending[reporters]
        coin = np.where(rng.random(reporters.size) < 0.5, 1, -1)
        faithful = np.where(rng.random(reporters.size) < self.node_keep, 1, -1)
        signs = np.where(held == 0, coin, faithful * held)
        pending[reporters] = 0
        levels = state.level[reporters]
        buckets = tree_node_offsets(self.periods)[levels - 1] + (t >> (levels - 1)) - 1
        new_state = LongitudinalState(state.chosen_change, state.level, seen, pending, period=t)
        return new_state, _batch(reporters, buckets, sign=signs, period=t)

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch:
        states = np.asarray(values)
        if states.ndim != 2 or states.shape[1] != self.periods:
            raise ValueError(f"values must have shape (n, {self.periods}), got {states.shape}")
        if states.size and not (states.dtype == np.bool_ or np.isin(states, (0, 1)).all()):
            raise ValueError("values must be boolean states")
        states = states.astype(np.int64)
        changes = np.diff(states, axis=1, prepend=0)
        too_many = np.count_nonzero(changes, axis=1) > self.max_changes
        if too_many.any():
            raise ValueError(
                f"{int(too_many.sum())} respondents change state more than "
                f"max_changes={self.max_changes} times"
            )
        state = self.start(states.shape[0], rng)
        batches = []
        for period in range(self.periods):
            state, batch = self.update(state, changes[:, period], rng)
            batches.append(batch)
        return MessageBatch.concatenate(batches)

    def estimate(self, bucket_sums: np.ndarray, respondents: float) -> HistogramEstimate:
        """Algorithm 2: estimated number of clients in state 1 at each period t = 1..d."""
        return longitudinal_marginals(
            self._check_bucket_sums(bucket_sums),
            respondents,
            self.periods,
            self.max_changes,
            self.node_keep,
        )

    def error_bound(self, respondents: float, failure_probability: float = 1 / 3) -> float:
        """Theorem 6 with explicit constants (:func:`~privacy.estimators.theorem6_error_bound`)."""
        return theorem6_error_bound(
            respondents, self.periods, self.max_changes, self.epsilon, failure_probability
        )

    def expected_messages_per_respondent(self) -> float:
        """Σ_h d / 2^(h-1) / L = (2d - 1) / L reports over the d periods."""
        return (2 * self.periods - 1) / self.levels

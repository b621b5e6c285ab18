"""A simulated fleet of devices: the Encode step of ESA (esa-privacy-revisited Section II, Figure 1).

Per respondent and reporting round, vectorized over a batch of respondents, a device

1. verifies the recipe against its query class and charges its on-device budget
   (samplable-anonymous-aggregation Sections 4.2-4.3; ``privacy.budget.FleetBudget``), refusing —
   and counting the refusal — when a check fails;
2. randomizes its value with the recipe's local randomizer; the randomizer fragments the result
   into messages (one per set bit with attribute fragmentation, tau report fragments with report
   fragmentation: Algorithms 1-2 of esa-privacy-revisited);
3. sends each message to one shuffler instance drawn from the recipe's instance weights (a stated
   trust distribution; uniform by default), and one content-free presence message (empty payload)
   to every one of the K instances per crowd (window), so each shuffler counts the device as a
   respondent of the crowd even when none of its randomized messages went there; the shuffler
   never releases presence messages and states the respondents it released in its commit record,
   which is where the analyzer's n comes from (no message can move n by more than one);
4. stamps each message with its origin — a unique string per device derived from a secret key and
   the device's index, unlinkable to its value — and an event time uniform inside its window.

Nothing here encodes bytes or touches files: ``simulators.shards`` turns a ``FleetBatch`` into
Avro Report records.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

from privacy.accounting import randomizer_central
from privacy.budget import (
    AnalysisPolicy,
    CheckFailure,
    CohortBound,
    DataFieldPolicy,
    DevicePolicy,
    FleetBudget,
    Query,
    QueryClass,
)
from privacy.messages import MessageBatch
from simulators.populations import true_counts

DAY_MS = 86_400_000
DEFAULT_START = "2024-01-01T00:00:00+00:00"
DEFAULT_START_MS = int(datetime.fromisoformat(DEFAULT_START).timestamp() * 1000)
ORIGIN_HEX_DIGITS = 16


class RandomizerLike(Protocol):
    domain_size: int
    payload_kind: str

    def randomize(self, values: np.ndarray, rng: np.random.Generator) -> MessageBatch: ...


class RecipeLike(Protocol):
    """What the fleet reads from a recipe (``schemas.recipes.Recipe``; simulators do not import
    schemas)."""

    id: str
    randomizer: str
    channel: str
    query_class: str
    data_fields: Sequence[str]
    epsilon_local: float
    epsilon_central_target: float
    delta: float
    min_crowd_size: int
    shuffler_instances: int
    instance_weights: Sequence[float]
    window_seconds: int

    def build_randomizer(self) -> Any: ...

    def to_query(self) -> Query: ...


@dataclass(frozen=True)
class FleetConfig:
    """How the simulated fleet reports.

    ``rounds``: reporting rounds per device; round r covers windows ``[r p, (r + 1) p)`` where p is
    the number of periods one report covers (1, or d for longitudinal reports).
    ``start_ms``: event-time start of window 0; ``window_ms``: window length (default: the
    recipe's window).
    ``origin_key``: secret of the keyed origin hash (derive it from the simulation seed).
    ``instance_weights``: overrides the recipe's trust distribution over shuffler instances.
    ``enforce_budget``: False simulates devices without an on-device accountant (nothing is
    verified, charged or refused).
    """

    rounds: int = 1
    start_ms: int = DEFAULT_START_MS
    window_ms: int | None = None
    origin_key: int = 0
    instance_weights: tuple[float, ...] | None = None
    enforce_budget: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"FleetConfig.rounds must be an int >= 1, got {self.rounds!r}")
        if not isinstance(self.start_ms, int) or self.start_ms < 0:
            raise ValueError(f"FleetConfig.start_ms must be an int >= 0, got {self.start_ms!r}")
        if self.window_ms is not None and (
            not isinstance(self.window_ms, int) or self.window_ms < 1
        ):
            raise ValueError(f"FleetConfig.window_ms must be an int >= 1, got {self.window_ms!r}")
        if not isinstance(self.origin_key, int) or not 0 <= self.origin_key < 2**64:
            raise ValueError("FleetConfig.origin_key must be an int in [0, 2**64)")
        if self.instance_weights is not None:
            object.__setattr__(self, "instance_weights", tuple(self.instance_weights))
            _check_weights(self.instance_weights, "FleetConfig.instance_weights")


@dataclass
class FleetBatch:
    """Everything a batch of devices sent in all its rounds, as columns (no per-message objects).

    Message columns are aligned with ``messages``, whose ``respondent`` holds global respondent
    indices; presence columns describe the content-free presence messages. ``*_window`` are window
    indices (window w spans ``start_ms + w window_ms`` and one window length). Truth is sparse
    ``(window, bucket, count)`` over the devices that reported: for longitudinal values, bucket 1
    counts users in state True in that period and bucket 0 those in state False.
    """

    messages: MessageBatch
    message_instance: np.ndarray
    message_window: np.ndarray
    message_event_ms: np.ndarray
    message_origin: np.ndarray
    presence_instance: np.ndarray
    presence_window: np.ndarray
    presence_event_ms: np.ndarray
    presence_origin: np.ndarray
    presence_respondent: np.ndarray
    truth_window: np.ndarray
    truth_bucket: np.ndarray
    truth_count: np.ndarray
    device_rounds: int
    refusals: int

    @property
    def num_messages(self) -> int:
        return int(self.message_instance.size)

    @property
    def num_presence(self) -> int:
        return int(self.presence_instance.size)


_COLUMN_DTYPES = {
    "message_instance": np.int32,
    "message_window": np.int64,
    "message_event_ms": np.int64,
    "message_origin": np.uint64,
    "presence_instance": np.int32,
    "presence_window": np.int64,
    "presence_event_ms": np.int64,
    "presence_origin": np.uint64,
    "presence_respondent": np.int64,
    "truth_window": np.int64,
    "truth_bucket": np.int64,
    "truth_count": np.int64,
}


def recipe_cohort_bound(recipe: RecipeLike) -> CohortBound:
    """Check 3's central bound for ``recipe`` (samplable-anonymous-aggregation Section 4.3).

    A randomizer with its own central guarantee (the zero-sum protocol of shuffled-model-histograms,
    Theorem 3.2) states it; every other randomizer the bound the analyzer's privacy report states
    (``privacy.accounting.randomizer_central``: Theorem III.1 among the tightest valid bounds for
    attribute-fragmented one-hot reports, Theorem IV.2 for report fragments, the generic shuffle
    bound in the randomizer's own neighbouring model otherwise), so a device never charges less
    than the analyzer states. ``privacy.accounting.amplify`` refuses parameters outside a bound's
    range.
    """
    randomizer = recipe.build_randomizer()
    own_central = getattr(randomizer, "central_epsilon", None)
    if own_central is not None:
        central = float(own_central)
        return lambda epsilon_local, n, delta: central

    @functools.lru_cache(maxsize=64)  # every batch of devices asks again; the answer is fixed
    def bound(epsilon_local: float, n: int, delta: float) -> float:
        return randomizer_central(randomizer, n, delta, epsilon_local)[0].epsilon

    return bound


def device_policy_for(
    recipe: RecipeLike,
    budget_epsilon: float | Fraction | None = None,
    runs: int = 1,
    reports_allowed: int | None = None,
    query_class_fields: Sequence[str] | None = None,
    analysis_name: str = "simulation",
) -> DevicePolicy:
    """A device policy (samplable-anonymous-aggregation Table 1) that admits ``recipe`` as far as
    the given limits allow.

    ``budget_epsilon``: the cohort-aggregate epsilon the device allows the analysis and each of its
    data fields (default: exactly ``runs`` runs of the recipe, in exact arithmetic so that float
    rounding cannot refuse the last one). ``reports_allowed``: reports allowed per analysis
    and field (default: unlimited in practice; the epsilon budget binds). ``query_class_fields``:
    the data fields the device's query class allows (default: those the recipe reads). The local
    allowance is the recipe's own epsilon_local; a recipe without local privacy gets none.
    """
    if not isinstance(runs, int) or runs < 0:
        raise ValueError(f"runs must be an int >= 0, got {runs!r}")
    if budget_epsilon is None:
        budget_epsilon = runs * Fraction(Decimal(repr(float(recipe.epsilon_central_target))))
    if not (math.isfinite(budget_epsilon) and budget_epsilon >= 0):
        raise ValueError(f"device budget epsilon must be finite and >= 0, got {budget_epsilon}")
    if reports_allowed is None:
        reports_allowed = 2**62
    allowed = frozenset(recipe.data_fields if query_class_fields is None else query_class_fields)
    local_allowed = float(recipe.epsilon_local) if math.isfinite(recipe.epsilon_local) else 0.0
    return DevicePolicy(
        analyses=(
            AnalysisPolicy(
                name=analysis_name,
                epsilon_allowed=budget_epsilon,
                reports_allowed=reports_allowed,
                query_class=QueryClass(recipe.query_class, allowed),
            ),
        ),
        data_fields=tuple(
            DataFieldPolicy(
                name=name,
                epsilon_local_allowed=local_allowed,
                epsilon_allowed=budget_epsilon,
                reports_allowed=reports_allowed,
            )
            for name in sorted(allowed | set(recipe.data_fields))
        ),
    )


def origin_ids(respondents: np.ndarray, key: int) -> np.ndarray:
    """Keyed 64-bit bijection of respondent indices: unique per device, unrelated to its value.

    Two rounds of the splitmix64 finalizer, each after adding half of the key; every step is
    invertible, so distinct respondents get distinct origins. (A simulation stand-in for an
    authenticated device identity, not meant to resist cryptanalysis.)
    """
    x = np.asarray(respondents).astype(np.uint64)
    round_keys = (
        np.uint64((key & 0xFFFFFFFF) * 0x9E3779B97F4A7C15 % 2**64),
        np.uint64((key >> 32) ^ 0xD1B54A32D192ED03),
    )
    with np.errstate(over="ignore"):
        for round_key in round_keys:
            x = x + round_key
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
    return x


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_NIBBLE_SHIFTS = np.arange(4 * (ORIGIN_HEX_DIGITS - 1), -4, -4, dtype=np.uint64)


def format_origins(ids: np.ndarray) -> np.ndarray:
    """Origin ids as fixed-width lowercase hex: an ``(n, 16)`` uint8 array of ASCII digits."""
    ids = np.asarray(ids, dtype=np.uint64)
    return _HEX[((ids[:, None] >> _NIBBLE_SHIFTS) & np.uint64(0xF)).astype(np.intp)]


def origin_strings(ids: np.ndarray) -> list[str]:
    """Origin ids as Python strings (for readers and tests)."""
    return [row.tobytes().decode("ascii") for row in format_origins(ids)]


class DeviceFleet:
    """Devices that all hold the same policy and run the same recipe (see the module docstring)."""

    def __init__(
        self,
        recipe: RecipeLike,
        policy: DevicePolicy | None = None,
        config: FleetConfig | None = None,
        cohort_bound: CohortBound | None = None,
    ) -> None:
        self.recipe = recipe
        self.randomizer: RandomizerLike = recipe.build_randomizer()
        self.config = config or FleetConfig()
        self.policy = (
            policy if policy is not None else device_policy_for(recipe, runs=self.config.rounds)
        )
        self.cohort_bound = cohort_bound or recipe_cohort_bound(recipe)
        self.query = recipe.to_query()
        self.window_ms = self.config.window_ms or int(recipe.window_seconds) * 1000
        # Longitudinal reports cover d periods, numbered 1..d in their messages.
        self.longitudinal = self.randomizer.payload_kind == "tree_node"
        self.periods_per_round = int(self.randomizer.periods) if self.longitudinal else 1
        self.num_instances = int(recipe.shuffler_instances)
        weights = self.config.instance_weights or tuple(recipe.instance_weights)
        if len(weights) != self.num_instances:
            raise ValueError(
                f"{len(weights)} instance weights for {self.num_instances} shuffler instances"
            )
        _check_weights(weights, "instance weights")
        self.instance_weights = tuple(float(w) for w in weights)
        probabilities = np.asarray(weights, dtype=np.float64) / math.fsum(weights)
        uniform = np.all(probabilities == probabilities[0])
        self.instance_probabilities: np.ndarray | None = None if uniform else probabilities

    @property
    def value_shape(self) -> tuple[int, ...]:
        return (self.periods_per_round,) if self.longitudinal else ()

    def refusals_for_all(self) -> tuple[CheckFailure, ...]:
        """Why every device refuses the recipe (query class, local epsilon, Check 3, or a budget
        that cannot pay for one run); empty when a fresh device admits it."""
        if not self.config.enforce_budget:
            return ()
        budget = FleetBudget(self.policy, 1, self.cohort_bound)
        failures = budget.check_query(self.query)
        if failures:
            return failures
        if budget.charge(self.query)[0]:
            return (
                CheckFailure(
                    "budget_too_small",
                    "check1",
                    f"the device budget cannot pay for one run of recipe {self.recipe.id} "
                    f"(epsilon {self.query.epsilon_central})",
                ),
            )
        return ()

    def window_start_ms(self, window: np.ndarray | int) -> np.ndarray:
        """Event-time start (ms) of window indices."""
        return self.config.start_ms + np.asarray(window, dtype=np.int64) * self.window_ms

    def run(
        self, values: np.ndarray, first_respondent: int, rng: np.random.Generator
    ) -> FleetBatch:
        """All rounds of devices ``first_respondent + [0, len(values))`` holding ``values``."""
        values = np.asarray(values)
        if values.shape[1:] != self.value_shape:
            raise ValueError(
                f"recipe {self.recipe.id} needs values of shape (n, *{self.value_shape}), "
                f"got {values.shape}"
            )
        count = values.shape[0]
        respondents = np.arange(first_respondent, first_respondent + count, dtype=np.int64)
        origins = origin_ids(respondents, self.config.origin_key)
        budget = FleetBudget(self.policy, count, self.cohort_bound)
        parts: list[dict[str, Any]] = []
        refusals = 0
        for round_index in range(self.config.rounds):
            if self.config.enforce_budget:
                refused = budget.charge(self.query)
                refusals += int(refused.sum())
                reporting = np.flatnonzero(~refused)
            else:
                reporting = np.arange(count)
            if reporting.size:
                parts.append(self._round(values, reporting, respondents, origins, round_index, rng))
        return _assemble(parts, count * self.config.rounds, refusals)

    def _round(
        self,
        values: np.ndarray,
        reporting: np.ndarray,
        respondents: np.ndarray,
        origins: np.ndarray,
        round_index: int,
        rng: np.random.Generator,
    ) -> dict[str, Any]:
        held = values[reporting]
        batch = self.randomizer.randomize(held, rng)
        local = batch.respondent
        first_window = round_index * self.periods_per_round
        period_index = batch.period.astype(np.int64) - (1 if self.longitudinal else 0)
        message_window = first_window + period_index
        # Presence: every reporting device, every window of the round, every instance.
        k, p = self.num_instances, self.periods_per_round
        presence_device = np.repeat(reporting, p * k)
        presence_window = first_window + np.tile(
            np.repeat(np.arange(p, dtype=np.int64), k), reporting.size
        )
        presence_instance = np.tile(np.arange(k, dtype=np.int32), reporting.size * p)
        truth_window, truth_bucket, truth_count = true_counts(held, self.randomizer.domain_size)
        return {
            "messages": MessageBatch(
                respondent=respondents[reporting][local],
                bucket=batch.bucket,
                sign=batch.sign,
                fragment=batch.fragment,
                period=batch.period,
            ),
            "message_instance": self._instances(local.size, rng),
            "message_window": message_window,
            "message_event_ms": self._event_times(message_window, rng),
            "message_origin": origins[reporting][local],
            "presence_instance": presence_instance,
            "presence_window": presence_window,
            "presence_event_ms": self._event_times(presence_window, rng),
            "presence_origin": origins[presence_device],
            "presence_respondent": respondents[presence_device],
            "truth_window": first_window + truth_window.astype(np.int64),
            "truth_bucket": truth_bucket,
            "truth_count": truth_count,
        }

    def _instances(self, count: int, rng: np.random.Generator) -> np.ndarray:
        if self.instance_probabilities is None:
            return rng.integers(0, self.num_instances, size=count, dtype=np.int32)
        return rng.choice(self.num_instances, size=count, p=self.instance_probabilities).astype(
            np.int32
        )

    def _event_times(self, windows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        offsets = rng.integers(0, self.window_ms, size=windows.size, dtype=np.int64)
        return self.window_start_ms(windows) + offsets


def _assemble(parts: list[dict[str, Any]], device_rounds: int, refusals: int) -> FleetBatch:
    columns: dict[str, Any] = {
        name: np.concatenate([part[name] for part in parts]).astype(dtype, copy=False)
        if parts
        else np.zeros(0, dtype=dtype)
        for name, dtype in _COLUMN_DTYPES.items()
    }
    batches = [part["messages"] for part in parts]
    if len(batches) == 1:
        columns["messages"] = batches[0]
    elif batches:
        columns["messages"] = MessageBatch.concatenate(batches)  # stable: rounds stay in order
        order = np.argsort(np.concatenate([b.respondent for b in batches]), kind="stable")
        for name in ("message_instance", "message_window", "message_event_ms", "message_origin"):
            columns[name] = columns[name][order]
    else:
        columns["messages"] = MessageBatch.empty()
    return FleetBatch(**columns, device_rounds=device_rounds, refusals=refusals)


def _check_weights(weights: Sequence[float], name: str) -> None:
    if not weights or any(not (math.isfinite(w) and w >= 0) for w in weights) or sum(weights) <= 0:
        raise ValueError(f"{name} must be non-negative, finite and not all zero, got {weights}")

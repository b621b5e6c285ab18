"""The on-device privacy budget accountant of samplable-anonymous-aggregation, Section 4.

A device holds a fixed policy (shipped with the OS, Table 1 of samplable-anonymous-aggregation):
per analysis an allowed cohort-aggregate epsilon and an allowed number of reports, and per data
field an allowed local epsilon, an allowed cohort-aggregate epsilon and an allowed number of
reports. Each analysis has a query class: the data fields its queries may read (Section 4.2). A
query (one recipe) is run only if

* query class verification: every data field it reads is in its class (Section 4.2);
* Check 1: eps + eps_used <= eps_allowed and k_used + 1 <= k_allowed for the analysis;
* Check 2: for every data field read, eps0 <= eps_local_allowed, eps + eps_used <= eps_allowed
  and k_used + 1 <= k_allowed for the field;
* Check 3: the cohort guarantee eps is achieved by aggregating at least m eps0-DP local reports.

Then, and only then, the ledger is charged (basic composition, Section 4.3). Check-then-charge is
atomic: a refused query leaves the ledger exactly as it was.

Epsilons are kept as integer micro-epsilon: charges round up and allowances round down, so no
sequence of rounding errors can let the spent epsilon exceed what the policy allows. Floats are read
as the shortest decimal that round-trips (``0.1`` is one tenth, the value a JSON recipe states).

Check 3 needs a central-privacy bound, which lives in the accounting module; this module takes it
as a callable ``cohort_bound(epsilon_local, n, delta) -> epsilon_central`` (raise ``ValueError``
outside the bound's validity range) so that it depends on no accounting internals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType

import numpy as np

__all__ = [
    "MICRO_PER_EPSILON",
    "CohortBound",
    "micro_epsilon_charge",
    "micro_epsilon_allowance",
    "DataFieldPolicy",
    "QueryClass",
    "AnalysisPolicy",
    "DevicePolicy",
    "Query",
    "CheckFailure",
    "BudgetDecision",
    "ChargeEvent",
    "DeviceBudget",
    "FleetBudget",
]

MICRO_PER_EPSILON = 1_000_000

# Stands for an infinite local epsilon (a protocol without local privacy): above any allowance.
_NO_LOCAL_GUARANTEE = 2**62

CohortBound = Callable[[float, int, float], float]
"""(epsilon_local, n reports, delta) -> the central epsilon that aggregating n reports achieves."""


def _exact(value: float | int | str | Fraction, name: str) -> Fraction:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, Fraction | int):
        result = Fraction(value)
    elif isinstance(value, float | np.floating):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        result = Fraction(Decimal(repr(float(value))))
    elif isinstance(value, str):
        try:
            result = Fraction(value)
        except (ValueError, ZeroDivisionError) as error:
            raise ValueError(f"{name} is not a number: {value!r}") from error
    else:
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    if result < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return result


def micro_epsilon_charge(epsilon: float | int | str | Fraction, name: str = "epsilon") -> int:
    """``epsilon`` in integer micro-epsilon, rounded UP (what a query costs)."""
    return math.ceil(_exact(epsilon, name) * MICRO_PER_EPSILON)


def micro_epsilon_allowance(epsilon: float | int | str | Fraction, name: str = "epsilon") -> int:
    """``epsilon`` in integer micro-epsilon, rounded DOWN (what a policy allows)."""
    return math.floor(_exact(epsilon, name) * MICRO_PER_EPSILON)


def _check_name(value: str, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


def _check_count(value: int, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


@dataclass(frozen=True)
class DataFieldPolicy:
    """Per-data-field limits (Table 1b, samplable-anonymous-aggregation)."""

    name: str
    epsilon_local_allowed: float
    epsilon_allowed: float
    reports_allowed: int

    def __post_init__(self) -> None:
        _check_name(self.name, "DataFieldPolicy.name")
        micro_epsilon_allowance(self.epsilon_local_allowed, "DataFieldPolicy.epsilon_local_allowed")
        micro_epsilon_allowance(self.epsilon_allowed, "DataFieldPolicy.epsilon_allowed")
        _check_count(self.reports_allowed, "DataFieldPolicy.reports_allowed")

    @property
    def micro_epsilon_local_allowed(self) -> int:
        return micro_epsilon_allowance(self.epsilon_local_allowed)

    @property
    def micro_epsilon_allowed(self) -> int:
        return micro_epsilon_allowance(self.epsilon_allowed)


@dataclass(frozen=True)
class QueryClass:
    """A query class given by the data fields its queries may read (Section 4.2)."""

    name: str
    data_fields: frozenset[str]

    def __post_init__(self) -> None:
        _check_name(self.name, "QueryClass.name")
        if isinstance(self.data_fields, str) or not all(
            isinstance(f, str) and f for f in self.data_fields
        ):
            raise ValueError(
                f"QueryClass.data_fields must be field names, got {self.data_fields!r}"
            )
        object.__setattr__(self, "data_fields", frozenset(self.data_fields))

    def verify(self, data_fields: Iterable[str]) -> tuple[str, ...]:
        """The fields among ``data_fields`` this class does not allow (empty: verified)."""
        return tuple(sorted(set(data_fields) - self.data_fields))


@dataclass(frozen=True)
class AnalysisPolicy:
    """Per-analysis limits (Table 1a) and the analysis' query class."""

    name: str
    epsilon_allowed: float
    reports_allowed: int
    query_class: QueryClass

    def __post_init__(self) -> None:
        _check_name(self.name, "AnalysisPolicy.name")
        micro_epsilon_allowance(self.epsilon_allowed, "AnalysisPolicy.epsilon_allowed")
        _check_count(self.reports_allowed, "AnalysisPolicy.reports_allowed")
        if not isinstance(self.query_class, QueryClass):
            raise ValueError("AnalysisPolicy.query_class must be a QueryClass")

    @property
    def micro_epsilon_allowed(self) -> int:
        return micro_epsilon_allowance(self.epsilon_allowed)


@dataclass(frozen=True)
class DevicePolicy:
    """The immutable budget policy a device ships with."""

    analyses: tuple[AnalysisPolicy, ...]
    data_fields: tuple[DataFieldPolicy, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "analyses", tuple(self.analyses))
        object.__setattr__(self, "data_fields", tuple(self.data_fields))
        names = [a.name for a in self.analyses]
        if len(set(names)) != len(names):
            raise ValueError(f"DevicePolicy.analyses: duplicate analysis names in {names}")
        classes = [a.query_class.name for a in self.analyses]
        if len(set(classes)) != len(classes):
            raise ValueError(
                f"DevicePolicy.analyses: a query class belongs to one analysis: {classes}"
            )
        fields = [f.name for f in self.data_fields]
        if len(set(fields)) != len(fields):
            raise ValueError(f"DevicePolicy.data_fields: duplicate field names in {fields}")
        for analysis in self.analyses:
            unknown = analysis.query_class.data_fields - set(fields)
            if unknown:
                raise ValueError(
                    f"DevicePolicy.analyses[{analysis.name!r}].query_class names data fields "
                    f"without a DataFieldPolicy: {sorted(unknown)}"
                )

    def analysis_for(self, query_class: str) -> AnalysisPolicy | None:
        """The analysis whose query class is ``query_class`` (None if there is none)."""
        for analysis in self.analyses:
            if analysis.query_class.name == query_class:
                return analysis
        return None

    def field(self, name: str) -> DataFieldPolicy | None:
        for data_field in self.data_fields:
            if data_field.name == name:
                return data_field
        return None


@dataclass(frozen=True)
class Query:
    """What the device needs to know about one query (from its recipe) to admit it.

    ``epsilon_local`` is eps0 of Section 4.3 (``math.inf`` for a protocol without local privacy,
    which Check 2 then refuses); ``epsilon_central`` is the cohort-aggregate eps that is charged;
    ``min_crowd_size`` is m of Check 3.
    """

    query_id: str
    query_class: str
    data_fields: frozenset[str]
    epsilon_local: float
    epsilon_central: float
    delta: float
    min_crowd_size: int

    def __post_init__(self) -> None:
        _check_name(self.query_id, "Query.query_id")
        _check_name(self.query_class, "Query.query_class")
        if isinstance(self.data_fields, str) or not all(
            isinstance(f, str) and f for f in self.data_fields
        ):
            raise ValueError(f"Query.data_fields must be field names, got {self.data_fields!r}")
        object.__setattr__(self, "data_fields", frozenset(self.data_fields))
        if not self.data_fields:
            raise ValueError("Query.data_fields must name at least one field the query reads")
        if self.epsilon_local != math.inf:  # inf: no local guarantee (refused by Check 2)
            micro_epsilon_charge(self.epsilon_local, "Query.epsilon_local")
        if micro_epsilon_charge(self.epsilon_central, "Query.epsilon_central") <= 0:
            raise ValueError(f"Query.epsilon_central must be > 0, got {self.epsilon_central!r}")
        if not (isinstance(self.delta, int | float) and 0 <= self.delta < 1):
            raise ValueError(f"Query.delta must be in [0, 1), got {self.delta!r}")
        if not isinstance(self.min_crowd_size, int) or self.min_crowd_size < 1:
            raise ValueError(
                f"Query.min_crowd_size must be a positive int, got {self.min_crowd_size!r}"
            )

    @property
    def micro_epsilon_local(self) -> int:
        if self.epsilon_local == math.inf:
            return _NO_LOCAL_GUARANTEE
        return micro_epsilon_charge(self.epsilon_local)

    @property
    def micro_epsilon_central(self) -> int:
        return micro_epsilon_charge(self.epsilon_central)


@dataclass(frozen=True)
class CheckFailure:
    """Why a query was refused: a machine-readable reason, the check and a sentence."""

    reason: str
    check: str
    detail: str


@dataclass(frozen=True)
class BudgetDecision:
    query_id: str
    failures: tuple[CheckFailure, ...]

    @property
    def accepted(self) -> bool:
        return not self.failures

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(f.reason for f in self.failures)


@dataclass(frozen=True)
class ChargeEvent:
    """One admitted query, as recorded in the device's audit ledger (Section 4.4)."""

    query_id: str
    analysis: str
    data_fields: tuple[str, ...]
    micro_epsilon: int


def _query_level_failures(
    policy: DevicePolicy, query: Query, cohort_bound: CohortBound
) -> tuple[AnalysisPolicy | None, list[CheckFailure]]:
    """Query class verification, the local part of Check 2 and Check 3: everything that does not
    depend on what a device has spent."""
    failures: list[CheckFailure] = []
    analysis = policy.analysis_for(query.query_class)
    if analysis is None:
        failures.append(
            CheckFailure(
                "unknown_query_class",
                "query_class",
                f"no analysis on this device has query class {query.query_class!r}",
            )
        )
    else:
        outside = analysis.query_class.verify(query.data_fields)
        if outside:
            failures.append(
                CheckFailure(
                    "field_not_in_query_class",
                    "query_class",
                    f"query class {query.query_class!r} does not allow data fields {list(outside)}",
                )
            )
    for name in sorted(query.data_fields):
        data_field = policy.field(name)
        if data_field is None:
            failures.append(
                CheckFailure(
                    "unknown_data_field", "check2", f"no budget policy for data field {name!r}"
                )
            )
        elif query.micro_epsilon_local > data_field.micro_epsilon_local_allowed:
            failures.append(
                CheckFailure(
                    "field_epsilon_local_exceeded",
                    "check2",
                    f"epsilon_local {query.epsilon_local} exceeds the {data_field.epsilon_local_allowed} "
                    f"allowed for data field {name!r}",
                )
            )
    try:
        achieved = float(cohort_bound(query.epsilon_local, query.min_crowd_size, query.delta))
    except (ValueError, OverflowError) as error:
        failures.append(
            CheckFailure(
                "cohort_bound_invalid",
                "check3",
                f"no valid central bound for epsilon_local={query.epsilon_local}, "
                f"n={query.min_crowd_size}, delta={query.delta}: {error}",
            )
        )
    else:
        if not (math.isfinite(achieved) and achieved <= query.epsilon_central):
            failures.append(
                CheckFailure(
                    "cohort_guarantee_not_met",
                    "check3",
                    f"{query.min_crowd_size} reports of epsilon_local={query.epsilon_local} give "
                    f"epsilon_central={achieved}, above the {query.epsilon_central} requested",
                )
            )
    return analysis, failures


class DeviceBudget:
    """One device's ledger: remaining budgets and the audit trail of admitted queries."""

    def __init__(self, policy: DevicePolicy, cohort_bound: CohortBound) -> None:
        if not isinstance(policy, DevicePolicy):
            raise ValueError("policy must be a DevicePolicy")
        if not callable(cohort_bound):
            raise ValueError("cohort_bound must be callable (epsilon_local, n, delta) -> epsilon")
        self._policy = policy
        self._cohort_bound = cohort_bound
        self._analysis_micro_used = {a.name: 0 for a in policy.analyses}
        self._analysis_reports_used = {a.name: 0 for a in policy.analyses}
        self._field_micro_used = {f.name: 0 for f in policy.data_fields}
        self._field_reports_used = {f.name: 0 for f in policy.data_fields}
        self._events: list[ChargeEvent] = []

    @property
    def policy(self) -> DevicePolicy:
        return self._policy

    @property
    def events(self) -> tuple[ChargeEvent, ...]:
        return tuple(self._events)

    def used(self) -> Mapping[str, Mapping[str, int]]:
        """Read-only snapshot: micro-epsilon and reports used, per analysis and per data field."""
        return MappingProxyType(
            {
                "analysis_micro_epsilon": MappingProxyType(dict(self._analysis_micro_used)),
                "analysis_reports": MappingProxyType(dict(self._analysis_reports_used)),
                "field_micro_epsilon": MappingProxyType(dict(self._field_micro_used)),
                "field_reports": MappingProxyType(dict(self._field_reports_used)),
            }
        )

    def check(self, query: Query) -> BudgetDecision:
        """Query class verification and Checks 1-3 of Section 4.3; changes nothing."""
        analysis, failures = _query_level_failures(self._policy, query, self._cohort_bound)
        charge = query.micro_epsilon_central
        if analysis is not None:
            name = analysis.name
            if self._analysis_micro_used[name] + charge > analysis.micro_epsilon_allowed:
                failures.append(
                    CheckFailure(
                        "analysis_epsilon_exhausted",
                        "check1",
                        f"analysis {name!r}: {self._analysis_micro_used[name]} + {charge} micro-epsilon "
                        f"exceeds the {analysis.micro_epsilon_allowed} allowed",
                    )
                )
            if self._analysis_reports_used[name] + 1 > analysis.reports_allowed:
                failures.append(
                    CheckFailure(
                        "analysis_reports_exhausted",
                        "check1",
                        f"analysis {name!r} has used all {analysis.reports_allowed} reports",
                    )
                )
        for name in sorted(query.data_fields):
            data_field = self._policy.field(name)
            if data_field is None:
                continue
            if self._field_micro_used[name] + charge > data_field.micro_epsilon_allowed:
                failures.append(
                    CheckFailure(
                        "field_epsilon_exhausted",
                        "check2",
                        f"data field {name!r}: {self._field_micro_used[name]} + {charge} micro-epsilon "
                        f"exceeds the {data_field.micro_epsilon_allowed} allowed",
                    )
                )
            if self._field_reports_used[name] + 1 > data_field.reports_allowed:
                failures.append(
                    CheckFailure(
                        "field_reports_exhausted",
                        "check2",
                        f"data field {name!r} has used all {data_field.reports_allowed} reports",
                    )
                )
        return BudgetDecision(query.query_id, tuple(failures))

    def charge(self, query: Query) -> BudgetDecision:
        """Admit and charge ``query`` if every check passes; otherwise change nothing."""
        decision = self.check(query)
        if not decision.accepted:
            return decision
        analysis = self._policy.analysis_for(query.query_class)
        assert analysis is not None  # check() refuses unknown query classes
        charge = query.micro_epsilon_central
        self._analysis_micro_used[analysis.name] += charge
        self._analysis_reports_used[analysis.name] += 1
        for name in query.data_fields:
            self._field_micro_used[name] += charge
            self._field_reports_used[name] += 1
        self._events.append(
            ChargeEvent(query.query_id, analysis.name, tuple(sorted(query.data_fields)), charge)
        )
        return decision


@dataclass
class FleetBudget:
    """The same ledger for a simulated fleet of devices, as arrays (one column per device)."""

    policy: DevicePolicy
    num_devices: int
    cohort_bound: CohortBound
    analysis_micro_used: np.ndarray = field(init=False, repr=False)
    analysis_reports_used: np.ndarray = field(init=False, repr=False)
    field_micro_used: np.ndarray = field(init=False, repr=False)
    field_reports_used: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.policy, DevicePolicy):
            raise ValueError("FleetBudget.policy must be a DevicePolicy")
        _check_count(self.num_devices, "FleetBudget.num_devices")
        if not callable(self.cohort_bound):
            raise ValueError("FleetBudget.cohort_bound must be callable")
        shape_a = (len(self.policy.analyses), self.num_devices)
        shape_f = (len(self.policy.data_fields), self.num_devices)
        self.analysis_micro_used = np.zeros(shape_a, dtype=np.int64)
        self.analysis_reports_used = np.zeros(shape_a, dtype=np.int64)
        self.field_micro_used = np.zeros(shape_f, dtype=np.int64)
        self.field_reports_used = np.zeros(shape_f, dtype=np.int64)
        self._analysis_index = {a.name: i for i, a in enumerate(self.policy.analyses)}
        self._field_index = {f.name: i for i, f in enumerate(self.policy.data_fields)}

    def analysis_micro_remaining(self, analysis: str) -> np.ndarray:
        """Micro-epsilon each device has left for ``analysis`` (int64 per device)."""
        policy = self.policy.analyses[self._analysis_index[analysis]]
        return (
            policy.micro_epsilon_allowed - self.analysis_micro_used[self._analysis_index[analysis]]
        )

    def field_micro_remaining(self, data_field: str) -> np.ndarray:
        """Micro-epsilon each device has left for ``data_field`` (int64 per device)."""
        row = self._field_index[data_field]
        return self.policy.data_fields[row].micro_epsilon_allowed - self.field_micro_used[row]

    def check_query(self, query: Query) -> tuple[CheckFailure, ...]:
        """Failures that refuse ``query`` on every device (class, local epsilon, Check 3)."""
        return tuple(_query_level_failures(self.policy, query, self.cohort_bound)[1])

    def charge(self, query: Query, devices: np.ndarray | None = None) -> np.ndarray:
        """Run Checks 1-3 on ``devices`` (indices, default all) and charge those that pass.

        Returns the boolean mask (aligned with ``devices``) of devices that refused the query;
        refused devices' ledgers are unchanged.
        """
        if devices is None:
            devices = np.arange(self.num_devices)
        devices = np.asarray(devices)
        if devices.ndim != 1 or not np.issubdtype(devices.dtype, np.integer):
            raise ValueError("devices must be a 1-D array of device indices")
        if devices.size and (devices.min() < 0 or devices.max() >= self.num_devices):
            raise ValueError(f"devices must be in [0, {self.num_devices})")
        if np.unique(devices).size != devices.size:
            raise ValueError("devices must not repeat: a device answers a query once")
        analysis, failures = _query_level_failures(self.policy, query, self.cohort_bound)
        if failures or analysis is None:
            return np.ones(devices.size, dtype=bool)
        charge = query.micro_epsilon_central
        a = self._analysis_index[analysis.name]
        field_rows = np.array([self._field_index[name] for name in sorted(query.data_fields)])
        field_micro_allowed = np.array(
            [self.policy.data_fields[i].micro_epsilon_allowed for i in field_rows], dtype=np.int64
        )
        field_reports_allowed = np.array(
            [self.policy.data_fields[i].reports_allowed for i in field_rows], dtype=np.int64
        )
        ok = (self.analysis_micro_used[a, devices] + charge <= analysis.micro_epsilon_allowed) & (
            self.analysis_reports_used[a, devices] + 1 <= analysis.reports_allowed
        )
        rows = np.ix_(field_rows, devices)
        ok &= np.all(self.field_micro_used[rows] + charge <= field_micro_allowed[:, None], axis=0)
        ok &= np.all(self.field_reports_used[rows] + 1 <= field_reports_allowed[:, None], axis=0)
        admitted = devices[ok]
        self.analysis_micro_used[a, admitted] += charge
        self.analysis_reports_used[a, admitted] += 1
        admitted_rows = np.ix_(field_rows, admitted)
        self.field_micro_used[admitted_rows] += charge
        self.field_reports_used[admitted_rows] += 1
        return ~ok

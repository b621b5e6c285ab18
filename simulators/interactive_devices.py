"""Devices that answer interactive recipes (samplable-anonymous-aggregation Sections 4.1-4.4, App. B).

An :class:`InteractiveRecipe` is what the server sends for one round: the SQL query over the
device's streams, the data fields it reads (the query class) and the non-sensitive fields it may
also read (``keyboard.locale``, Section 4.1), the one-hot encoding scheme of Appendix B (n-grams
bucketed by a prefix tree and a list of known words; the recipe carries the tree and its sha256,
and a device refuses a tree that does not match its hash), and the ESA transport recipe
(``schemas.recipes.Recipe``: randomizer, requested local and cohort budgets, minimum crowd) whose
id is stamped on the reports and names the tree's hash.

A device's privacy policy is its own configuration (:class:`DeviceConfig`: the analysis' and
the field's budgets, the largest local epsilon one query may ask, the query limits), written
into its keystore when it is enrolled (:func:`create_fleet`) and read from there, never from a
recipe or a plan: a recipe asks for an epsilon, the device decides (Sections 4.3 and 5, "Local
privacy budgets are stored and enforced on-device").

A device (:func:`answer`), in this order:

1. verifies its audit log, which is its budget ledger, against the hash chain its keystore
   holds (``simulators.event_store``): a deleted, edited, reordered or truncated log refuses
   every query (``refused_ledger``, reason ``ledger_broken``) instead of starting again from a
   full budget;
2. rebuilds its budget ledger (``privacy.budget.DeviceBudget``) from the verified log, and runs
   query class verification and Checks 1-3 against its policy; a refused query sends nothing (a
   refusal depends on the ledger, never on the data);
3. runs the query in its event store under the SQLite authorizer, which allows only the approved
   fields, and within its query limits: a query reaching outside its class fails inside the
   database, one over a limit is aborted, and either is refused and counted (``refused_query``,
   with the reason);
4. encodes the answer: a uniformly chosen n-gram among those it typed that extend a leaf of the
   prefix tree; when it has none, a uniformly random bucket, since sending nothing would itself
   be disclosive (footnote 3);
5. charges the ledger and writes the audit entry: the query, the fields it read, the checks, the
   bucket it encoded. What then leaves the device (its Report messages, made by the fleet of
   ``esa simulate`` from this bucket) is added to the same entry by :func:`record_sent`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from privacy.budget import (
    AnalysisPolicy,
    CohortBound,
    DataFieldPolicy,
    DeviceBudget,
    DevicePolicy,
    Query,
    QueryClass,
)
from privacy.ngrams import NgramEncoding, sentence_ngrams, tokenize
from schemas.recipes import Recipe, recipe_from_dict
from simulators.event_store import (
    EventStore,
    LedgerBroken,
    QueryLimits,
    QueryRefused,
    device_path,
    keystore_path,
)
from simulators.fleet import origin_ids, origin_strings, recipe_cohort_bound

__all__ = [
    "KEYBOARD_QUERY",
    "NON_SENSITIVE_FIELDS",
    "InteractiveRecipe",
    "build_round_recipe",
    "keyboard_policy",
    "DeviceConfig",
    "Answer",
    "answer",
    "create_fleet",
    "answer_fleet",
    "record_sent",
    "read_audit",
    "dumps_audit",
]

KEYBOARD_QUERY = "SELECT text FROM keyboard WHERE locale LIKE 'en%'"
# Hard-coded in the device OS per analysis (Section 4.1): fields it deems non-sensitive.
NON_SENSITIVE_FIELDS: Mapping[str, frozenset[str]] = {
    "ngram_discovery": frozenset({"keyboard.locale"}),
}
STATUSES = ("answered", "random_answer", "refused_checks", "refused_query", "refused_ledger")


@dataclass(frozen=True)
class InteractiveRecipe:
    """One round's recipe: query, fields, encoding scheme and the ESA transport recipe."""

    analysis: str
    round_id: str
    query: str
    data_fields: tuple[str, ...]
    non_sensitive: tuple[str, ...]
    encoding: NgramEncoding
    recipe: Recipe

    def to_query(self) -> Query:
        """What the budget accountant checks (the transport recipe's budgets, our fields)."""
        base = self.recipe.to_query()
        return Query(
            query_id=self.recipe.id,
            query_class=base.query_class,
            data_fields=frozenset(self.data_fields),
            epsilon_local=base.epsilon_local,
            epsilon_central=base.epsilon_central,
            delta=base.delta,
            min_crowd_size=base.min_crowd_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "analysis": self.analysis,
            "round": self.round_id,
            "query": self.query,
            "data_fields": list(self.data_fields),
            "non_sensitive": list(self.non_sensitive),
            "encoding": self.encoding.to_dict(),
            "recipe": self.recipe.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InteractiveRecipe:
        encoding = NgramEncoding.from_dict(data["encoding"])
        recipe = recipe_from_dict(data["recipe"], source=f"round {data['round']}")
        if recipe.build_randomizer().domain_size != encoding.domain_size:
            raise ValueError("the transport recipe's domain does not match the encoding scheme")
        if encoding.tree.sha256()[:12] not in recipe.name:
            raise ValueError("the transport recipe's name does not carry the prefix tree hash")
        return cls(
            analysis=data["analysis"],
            round_id=data["round"],
            query=data["query"],
            data_fields=tuple(data["data_fields"]),
            non_sensitive=tuple(data["non_sensitive"]),
            encoding=encoding,
            recipe=recipe,
        )


def _round_up(value: float, places: int = 6) -> float:
    scale = 10**places
    return math.ceil(value * scale) / scale


def build_round_recipe(
    analysis: str,
    round_id: str,
    encoding: NgramEncoding,
    epsilon_local: float,
    min_crowd_size: int,
    delta: float,
    instances: int,
    query: str = KEYBOARD_QUERY,
) -> InteractiveRecipe:
    """The round's recipe with asymmetric one-hot encoding (Algorithm 1 / Theorem A.1) over the
    scheme's buckets; the requested cohort epsilon is what Check 3's bound gives for
    ``min_crowd_size`` reports, or the local epsilon where no amplification bound is valid."""
    tree_hash = encoding.tree.sha256()[:12]
    data = {
        "name": f"{analysis}-{round_id}-{tree_hash}",
        "version": 1,
        "description": f"{encoding.n}-grams extending a {len(encoding.tree.leaves)}-leaf prefix "
        f"tree (sha256 {encoding.tree.sha256()}), {len(encoding.known_words)} known words.",
        "channel": f"{analysis}_{encoding.n}grams",
        "randomizer": "asymmetric_one_hot",
        "randomizer_params": {"domain_size": encoding.domain_size, "epsilon": epsilon_local},
        "fragmentation": "attribute",
        "epsilon_local": epsilon_local,
        "epsilon_central_target": epsilon_local,
        "delta": delta,
        "min_crowd_size": min_crowd_size,
        "query_class": "keyboard_text",
        "data_fields": ["keyboard.text"],
        "shuffler_instances": instances,
        "window": "1d",
    }
    recipe = recipe_from_dict(data, source=round_id)
    try:
        central = recipe_cohort_bound(recipe)(epsilon_local, min_crowd_size, delta)
    except (ValueError, OverflowError):
        central = epsilon_local
    data["epsilon_central_target"] = min(epsilon_local, _round_up(central))
    return InteractiveRecipe(
        analysis=analysis,
        round_id=round_id,
        query=query,
        data_fields=("keyboard.text",),
        non_sensitive=("keyboard.locale",),
        encoding=encoding,
        recipe=recipe_from_dict(data, source=round_id),
    )


def keyboard_policy(
    analysis: str,
    analysis_epsilon: float,
    field_epsilon: float,
    local_epsilon: float,
    reports: int = 8,
) -> DevicePolicy:
    """The device policy (Table 1): the analysis' cohort budget and its query class
    ``keyboard_text = {keyboard.text}``, and per-field local and cohort budgets."""
    return DevicePolicy(
        analyses=(
            AnalysisPolicy(
                analysis, analysis_epsilon, reports, QueryClass("keyboard_text", {"keyboard.text"})
            ),
        ),
        data_fields=(
            DataFieldPolicy("keyboard.text", local_epsilon, field_epsilon, reports),
            DataFieldPolicy("contacts.phone", 0.0, 0.0, 0),
        ),
    )


MAX_DEVICE_EPSILON = 100.0
MAX_DEVICE_REPORTS = 1000


def _epsilon_in(value: Any, name: str) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_DEVICE_EPSILON
    ):
        raise ValueError(f"{name} must be a number in [0, {MAX_DEVICE_EPSILON:g}], got {value!r}")


@dataclass(frozen=True)
class DeviceConfig:
    """What a keyboard device ships with (Table 1 of samplable-anonymous-aggregation): the
    analysis' cohort budget ``analysis_epsilon`` and its ``reports_allowed``; for
    ``keyboard.text`` the largest local epsilon one query may ask (``local_epsilon_allowed``),
    the field's cohort budget ``field_epsilon`` and the same number of reports; and the limits
    of one on-device query. Written into each device's keystore at enrollment; epsilons in
    [0, 100], reports in [0, 1000]."""

    analysis: str = "ngram_discovery"
    analysis_epsilon: float = 1.6
    field_epsilon: float = 1.6
    local_epsilon_allowed: float = 6.0
    reports_allowed: int = 8
    query_limits: QueryLimits = field(default_factory=QueryLimits)

    def __post_init__(self) -> None:
        if not isinstance(self.analysis, str) or not 0 < len(self.analysis) <= 64:
            raise ValueError(
                f"analysis must be a name of 1 to 64 characters, got {self.analysis!r}"
            )
        for name in ("analysis_epsilon", "field_epsilon", "local_epsilon_allowed"):
            _epsilon_in(getattr(self, name), name)
        reports = self.reports_allowed
        if (
            not isinstance(reports, int)
            or isinstance(reports, bool)
            or not 0 <= reports <= MAX_DEVICE_REPORTS
        ):
            raise ValueError(
                f"reports_allowed must be an integer in [0, {MAX_DEVICE_REPORTS}], got {reports!r}"
            )
        if not isinstance(self.query_limits, QueryLimits):
            raise ValueError("query_limits must be QueryLimits")

    def policy(self) -> DevicePolicy:
        return keyboard_policy(
            self.analysis,
            self.analysis_epsilon,
            self.field_epsilon,
            self.local_epsilon_allowed,
            self.reports_allowed,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["query_limits"] = self.query_limits.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "device configuration") -> DeviceConfig:
        """From JSON (missing keys take the defaults; an unknown key is refused)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{source}: unknown key {unknown[0]!r} (known: {sorted(known)})")
        values = dict(data)
        limits = values.pop("query_limits", {})
        if not isinstance(limits, Mapping):
            raise ValueError(f"{source}: query_limits must be a JSON object")
        limit_keys = {f.name for f in fields(QueryLimits)}
        unknown = sorted(set(limits) - limit_keys)
        if unknown:
            raise ValueError(
                f"{source}: unknown query limit {unknown[0]!r} (known: {sorted(limit_keys)})"
            )
        try:
            return cls(**{**values, "query_limits": QueryLimits(**limits)})
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None


@dataclass(frozen=True)
class Answer:
    """A device's decision: ``status`` (one of :data:`STATUSES`), the bucket it encoded (None
    when it sends nothing), the reasons of a refusal (codes) and a sentence."""

    status: str
    bucket: int | None
    reasons: tuple[str, ...] = ()
    detail: str = ""


def _query_from(entry: Mapping[str, Any]) -> Query:
    q = entry["budget_query"]
    return Query(
        query_id=q["query_id"],
        query_class=q["query_class"],
        data_fields=frozenset(q["data_fields"]),
        epsilon_local=q["epsilon_local"],
        epsilon_central=q["epsilon_central"],
        delta=q["delta"],
        min_crowd_size=q["min_crowd_size"],
    )


def answer(
    store: EventStore,
    recipe: InteractiveRecipe,
    rng: np.random.Generator,
    cohort_bound: CohortBound | None = None,
) -> Answer:
    """Steps 1-5 of the module docstring for one device, under the configuration in its
    keystore; the audit entry is written here (except on a broken ledger, which takes no more).
    ``cohort_bound``: Check 3's bound (default the recipe's, ``recipe_cohort_bound``)."""
    query = recipe.to_query()
    try:
        entries = store.ledger()
        configuration = store.configuration()
    except LedgerBroken as broken:
        return Answer("refused_ledger", None, (LedgerBroken.reason,), str(broken))
    entry: dict[str, Any] = {
        "recipe_id": recipe.recipe.id,
        "query": recipe.query,
        "prefix_tree_sha256": recipe.encoding.tree.sha256(),
        "budget_query": {
            "query_id": query.query_id,
            "query_class": query.query_class,
            "data_fields": sorted(query.data_fields),
            "epsilon_local": query.epsilon_local,
            "epsilon_central": query.epsilon_central,
            "delta": query.delta,
            "min_crowd_size": query.min_crowd_size,
        },
    }
    if configuration is None:
        detail = "the device was enrolled without a configuration: it answers nothing"
        entry.update(status="refused_checks", reasons=["no_device_configuration"], sent=[])
        store.log(recipe.round_id, entry)
        return Answer("refused_checks", None, ("no_device_configuration",), detail)
    try:
        config = DeviceConfig.from_dict(configuration, source=f"{store.path} keystore")
    except ValueError as error:
        entry.update(status="refused_checks", reasons=["device_configuration_invalid"], sent=[])
        store.log(recipe.round_id, entry)
        return Answer("refused_checks", None, ("device_configuration_invalid",), str(error))
    policy = config.policy()
    # The ledger, replayed from the verified log: what this device has already spent.
    budget = DeviceBudget(policy, cohort_bound or recipe_cohort_bound(recipe.recipe))
    for previous in entries:
        if previous.get("status") in ("answered", "random_answer"):
            budget.charge(_query_from(previous))
    decision = budget.check(query)
    if not decision.accepted:
        entry.update(status="refused_checks", reasons=list(decision.reasons), sent=[])
        store.log(recipe.round_id, entry)
        detail = "; ".join(failure.detail for failure in decision.failures)
        return Answer("refused_checks", None, decision.reasons, detail)
    analysis = policy.analysis_for(query.query_class)
    assert analysis is not None  # check() refuses unknown classes
    approved = set(analysis.query_class.data_fields) & set(recipe.data_fields)
    approved |= NON_SENSITIVE_FIELDS.get(analysis.name, frozenset()) & set(recipe.non_sensitive)
    try:
        result = store.run_query(recipe.query, approved, limits=config.query_limits)
        if any(len(row) != 1 for row in result.rows):
            # The encoding scheme reads one text column (Section 4.1); anything else is not
            # this recipe's answer.
            raise QueryRefused(
                "query_shape: the query must return one column (the text to encode)",
                reason="query_shape",
            )
    except QueryRefused as refused:
        entry.update(
            status="refused_query",
            reasons=[refused.reason],
            detail=str(refused),
            denied=list(refused.denied),
            sent=[],
        )
        store.log(recipe.round_id, entry)
        return Answer("refused_query", None, (refused.reason,), str(refused))
    ngrams = [
        gram
        for (text,) in result.rows
        if isinstance(text, str)
        for gram in sentence_ngrams(tokenize(text), recipe.encoding.n)
    ]
    candidates = recipe.encoding.matching_buckets(ngrams)
    if candidates:
        status, bucket = "answered", int(candidates[int(rng.integers(len(candidates)))])
    else:
        status, bucket = "random_answer", int(rng.integers(recipe.encoding.domain_size))
    charged = budget.charge(query)
    assert charged.accepted  # nothing changed since check()
    entry.update(
        status=status,
        fields_read=sorted(result.fields_read),
        bucket=bucket,
        ngram=recipe.encoding.ngram(bucket),
        used={k: dict(v) for k, v in budget.used().items()},
    )
    store.log(recipe.round_id, entry)
    return Answer(status, bucket)


def create_fleet(
    directory: str | Path,
    typed: Sequence[Sequence[str]],
    now_ms: int,
    window_ms: int,
    rng: np.random.Generator,
    config: DeviceConfig | None = None,
    stale_fraction: float = 0.25,
) -> list[list[str]]:
    """Enroll one device per entry of ``typed``: its keystore (a fresh secret from the OS CSPRNG
    and ``config``, default :class:`DeviceConfig`) and its event store holding what its user typed: ``keyboard`` events within the
    last half window (so rounds in the next half window still see them), a share ``stale_fraction`` of them older than the window (retention deletes those
    before any query), and a ``contacts`` row no keyboard query may read. Returns per device the
    sentences inside the window (what its queries can see)."""
    configuration = (config or DeviceConfig()).to_dict()
    kept: list[list[str]] = []
    for device, sentences in enumerate(typed):
        path = device_path(directory, device)
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = rng.random(len(sentences)) < stale_fraction
        ages = rng.integers(0, window_ms // 2, size=len(sentences))
        ts = np.where(stale, now_ms - window_ms - 1 - ages, now_ms - ages)
        locale = "en_US" if device % 4 else "en_GB"
        with EventStore(path) as store:
            store.configure(configuration)
            store.append(
                "keyboard", [(int(t), locale, s) for t, s in zip(ts, sentences, strict=True)]
            )
            store.append("contacts", [(now_ms, f"contact {device}", f"+1555{device:07d}")])
        kept.append([s for s, old in zip(sentences, stale, strict=True) if not old])
    return kept


def answer_fleet(
    directory: str | Path,
    devices: int,
    recipe: InteractiveRecipe,
    seed: int,
    now_ms: int,
    window_ms: int,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Every device answers ``recipe`` under its own configuration: ``(buckets of the devices
    that answer, their device ids, counters)``; the counters count devices by status, events
    retention deleted and refusals by reason (``refusal_reasons``). A device whose storage is
    gone (database and keystore) refuses with ``ledger_broken``: it is never enrolled afresh."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x1A7,)))
    buckets: list[int] = []
    senders: list[int] = []
    counters: Counter[str] = Counter({status: 0 for status in STATUSES})
    counters["events_expired"] = 0
    reasons: Counter[str] = Counter()
    bound = functools.lru_cache(maxsize=64)(recipe_cohort_bound(recipe.recipe))
    for device in range(devices):
        path = device_path(directory, device)
        if not path.exists() and not keystore_path(path).exists():
            result = Answer("refused_ledger", None, (LedgerBroken.reason,), f"{path} is gone")
        else:
            with EventStore(path) as store:
                counters["events_expired"] += store.retain(now_ms, window_ms)
                result = answer(store, recipe, rng, bound)
        counters[result.status] += 1
        reasons.update(result.reasons)
        if result.bucket is not None:
            buckets.append(result.bucket)
            senders.append(device)
    out: dict[str, Any] = dict(counters)
    out["refusal_reasons"] = dict(sorted(reasons.items()))
    return np.asarray(buckets, dtype=np.int64), np.asarray(senders, dtype=np.int64), out


def _millis(value: Any) -> int:
    if hasattr(value, "timestamp"):
        return round(value.timestamp() * 1000)
    return int(value)


def record_sent(
    directory: str | Path,
    round_id: str,
    senders: np.ndarray,
    origin_key: int,
    reports: Iterable[Mapping[str, Any]],
) -> int:
    """Add to each sender's audit entry every Report its transport sent (respondent r of the
    simulation is ``senders[r]``, its origin ``origin_ids(r, origin_key)``): instance, event
    time, payload bytes (hex) and CRC32C. Returns the number of messages logged."""
    origins = origin_strings(origin_ids(np.arange(senders.size, dtype=np.int64), origin_key))
    by_origin = {origin: index for index, origin in enumerate(origins)}
    sent: dict[int, list[dict[str, Any]]] = {int(d): [] for d in senders}
    logged = 0
    for report in reports:
        index = by_origin.get(report["origin"])
        if index is None:
            raise ValueError(f"a report from unknown origin {report['origin']!r}")
        payload = bytes(report["payload"])
        sent[int(senders[index])].append(
            {
                "shuffler_instance": int(report["shuffler_instance"]),
                "recipe_id": report["recipe_id"],
                "event_time_ms": _millis(report["event_time"]),
                "payload_hex": payload.hex(),
                "payload_sha256": hashlib.sha256(payload).hexdigest(),
                "payload_crc32c": int(report["payload_crc32c"]),
            }
        )
        logged += 1
    for device, messages in sent.items():
        with EventStore(device_path(directory, device)) as store:
            store.amend(round_id, "sent", messages)
    return logged


def read_audit(directory: str | Path, device: int) -> list[dict[str, Any]]:
    """Device ``device``'s audit log, oldest first, verified against its keystore's hash chain
    (raises ``LedgerBroken``)."""
    path = device_path(directory, device)
    if not path.exists():
        raise FileNotFoundError(f"no device {device} under {directory}")
    with EventStore(path) as store:
        return store.audit()


def dumps_audit(entries: Sequence[Mapping[str, Any]]) -> str:
    """An audit log as indented JSON (what ``esa analysis audit`` prints)."""
    return json.dumps(list(entries), indent=2, sort_keys=True)

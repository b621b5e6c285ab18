"""Devices answering interactive recipes: query classes in the database, Checks 1-3, per-field
budgets, random answers and the audit log (simulators/interactive_devices.py); and the hostile
cases: a recipe asking more than the device allows, a tampered audit log, a query bomb."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sqlite3
import time

import numpy as np
import pytest
from scipy import stats

from privacy.ngrams import NgramEncoding, PrefixTree
from simulators import interactive_devices as dev
from simulators.event_store import (
    AUDIT_TABLE,
    EventStore,
    LedgerBroken,
    device_path,
    keystore_path,
)
from simulators.fleet import recipe_cohort_bound

KNOWN = ("the", "of", "in", "a")
NOW = 10 * 86_400_000
DAY = 86_400_000


def _recipe(round_id="round-1", tree=(("of",), ("in",)), epsilon=4.0):
    encoding = NgramEncoding(KNOWN, PrefixTree(tree))
    return dev.build_round_recipe("ngram_discovery", round_id, encoding, epsilon, 1000, 1e-6, 2)


def _config(field_epsilon=100.0, analysis_epsilon=100.0, **settings):
    return dev.DeviceConfig(
        analysis_epsilon=analysis_epsilon,
        field_epsilon=field_epsilon,
        local_epsilon_allowed=8.0,
        **settings,
    )


def _store(tmp_path, texts=("one of the best", "in a minute"), config=None):
    store = EventStore(tmp_path / "d.sqlite")
    store.configure((config or _config()).to_dict())
    store.append("keyboard", [(NOW, "en_US", t) for t in texts])
    store.append("contacts", [(NOW, "bob", "+15550001")])
    return store


def test_recipe_round_trips_and_names_its_tree():
    recipe = _recipe()
    again = dev.InteractiveRecipe.from_dict(recipe.to_dict())
    assert again.recipe.id == recipe.recipe.id and again.encoding == recipe.encoding
    assert recipe.encoding.tree.sha256()[:12] in recipe.recipe.id
    assert recipe.recipe.epsilon_central_target <= recipe.recipe.epsilon_local
    data = recipe.to_dict()
    data["encoding"]["prefix_tree"] = [["the"], ["a"]]
    data["encoding"]["prefix_tree_sha256"] = PrefixTree((("the",), ("a",))).sha256()
    with pytest.raises(ValueError, match="hash"):
        dev.InteractiveRecipe.from_dict(data)


def test_device_answers_with_a_matching_ngram_and_logs_it(tmp_path):
    store = _store(tmp_path)
    answer = dev.answer(store, _recipe(), np.random.default_rng(0))
    assert answer.status == "answered"
    assert _recipe().encoding.ngram(answer.bucket) in {("of", "the"), ("in", "a")}
    (entry,) = store.audit()
    assert entry["status"] == "answered" and entry["bucket"] == answer.bucket
    assert entry["query"] == dev.KEYBOARD_QUERY
    assert entry["fields_read"] == ["keyboard.locale", "keyboard.text"]


def test_query_outside_its_class_is_refused_by_the_database_and_sends_nothing(tmp_path):
    store = _store(tmp_path)
    hostile = dataclasses.replace(_recipe(), query="SELECT phone FROM contacts")
    answer = dev.answer(store, hostile, np.random.default_rng(0))
    assert answer.status == "refused_query" and answer.bucket is None
    assert answer.reasons == ("query_denied",)
    assert "the database refused the query: no such table: contacts" in answer.detail
    (entry,) = store.audit()
    assert entry["denied"] == ["no such table: contacts"] and entry["sent"] == []
    # The refused query charged nothing: the next honest one is admitted.
    assert dev.answer(store, _recipe(), np.random.default_rng(0)).status == "answered"


def test_a_query_returning_more_than_the_text_is_refused(tmp_path):
    store = _store(tmp_path)
    wide = dataclasses.replace(_recipe(), query="SELECT text, locale FROM keyboard")
    answer = dev.answer(store, wide, np.random.default_rng(0))
    assert answer.status == "refused_query" and answer.reasons == ("query_shape",)


def test_reading_a_timestamp_is_outside_the_class(tmp_path):
    store = _store(tmp_path)
    sneaky = dataclasses.replace(_recipe(), query="SELECT text FROM keyboard WHERE ts > 0")
    assert dev.answer(store, sneaky, np.random.default_rng(0)).status == "refused_query"


def test_declaring_a_field_outside_the_class_fails_the_checks(tmp_path):
    store = _store(tmp_path)
    greedy = dataclasses.replace(_recipe(), data_fields=("keyboard.text", "contacts.phone"))
    answer = dev.answer(store, greedy, np.random.default_rng(0))
    assert answer.status == "refused_checks"
    assert "field_not_in_query_class" in answer.reasons


def test_device_over_its_per_field_budget_refuses(tmp_path):
    first = _recipe("round-1")
    charge = first.recipe.epsilon_central_target
    # The field allows one round's cohort epsilon, the analysis ten.
    config = _config(field_epsilon=charge, analysis_epsilon=10 * charge)
    path = tmp_path / "d.sqlite"
    with _store(tmp_path, config=config):
        pass
    with EventStore(path) as store:
        assert dev.answer(store, first, np.random.default_rng(0)).status == "answered"
    with EventStore(path) as store:  # the ledger is rebuilt from the audit log
        second = _recipe("round-2", tree=(("of", "the"),))
        answer = dev.answer(store, second, np.random.default_rng(0))
        assert answer.status == "refused_checks" and answer.bucket is None
        assert "field_epsilon_exhausted" in answer.reasons
        assert "analysis_epsilon_exhausted" not in answer.reasons
        assert [e["status"] for e in store.audit()] == ["answered", "refused_checks"]


def test_device_without_a_match_sends_a_uniformly_random_bucket(tmp_path):
    # Nothing typed extends the tree: the device must still answer, uniformly over the buckets.
    config = _config(field_epsilon=100.0, analysis_epsilon=100.0, reports_allowed=1000)
    store = _store(tmp_path, texts=("zebra crossing",), config=config)
    recipe = _recipe(tree=(("of",),), epsilon=0.5)
    rng = np.random.default_rng(7)
    bound = functools.lru_cache(maxsize=None)(recipe_cohort_bound(recipe.recipe))
    buckets = []
    for _ in range(210):  # 30 per bucket
        answer = dev.answer(store, recipe, rng, bound)
        assert answer.status == "random_answer"
        buckets.append(answer.bucket)
    counts = np.bincount(buckets, minlength=recipe.encoding.domain_size)
    # Chi-square goodness of fit to uniform; seeded, so it fails only if the rule changes
    # (a false failure would have probability 1e-3 under a fresh seed).
    assert stats.chisquare(counts).pvalue > 1e-3


def test_fleet_counts_refusals_and_applies_retention(tmp_path):
    typed = [["of the people", "in a way"], ["zebra"], ["in the end"]]
    rng = np.random.default_rng(3)
    kept = dev.create_fleet(tmp_path, typed, NOW, DAY, rng, _config(), stale_fraction=0.0)
    assert kept == typed
    with EventStore(device_path(tmp_path, 0)) as store:  # one event from before the window
        store.append("keyboard", [(NOW - 2 * DAY, "en_US", "of old")])
    answers, senders, counters = dev.answer_fleet(tmp_path, 3, _recipe(), 1, NOW, DAY)
    assert counters["answered"] == 2 and counters["random_answer"] == 1
    assert counters["events_expired"] == 1
    assert senders.tolist() == [0, 1, 2] and answers.shape == (3,)
    hostile = dataclasses.replace(_recipe("round-2"), query="SELECT phone FROM contacts")
    answers, senders, counters = dev.answer_fleet(tmp_path, 3, hostile, 1, NOW, DAY)
    assert counters["refused_query"] == 3 and answers.size == 0 and senders.size == 0
    assert counters["refusal_reasons"] == {"query_denied": 3}


# -- the device's policy is its own: a recipe (or a plan) asks, the device decides ----------------


def test_answer_takes_the_policy_from_the_device_not_the_caller():
    assert "policy" not in inspect.signature(dev.answer).parameters
    assert "policy" not in inspect.signature(dev.answer_fleet).parameters


def test_asking_more_than_the_device_allows_is_refused_with_the_reason(tmp_path):
    store = _store(tmp_path, config=_config(analysis_epsilon=100.0))  # local allowed: 8
    greedy = _recipe(epsilon=9.0)
    answer = dev.answer(store, greedy, np.random.default_rng(0))
    assert answer.status == "refused_checks" and answer.bucket is None
    assert "field_epsilon_local_exceeded" in answer.reasons and "9.0" in answer.detail
    (entry,) = store.audit()
    assert entry["status"] == "refused_checks" and entry["sent"] == []


def test_a_device_configured_once_keeps_its_budget(tmp_path):
    # A device that allows two rounds answers two, whatever is asked of it afterwards.
    charge = _recipe().recipe.epsilon_central_target
    store = _store(tmp_path, config=_config(analysis_epsilon=2 * charge, field_epsilon=100.0))
    statuses = [
        dev.answer(store, _recipe(f"round-{r}"), np.random.default_rng(r)).status
        for r in range(1, 6)
    ]
    assert statuses == ["answered"] * 2 + ["refused_checks"] * 3
    with pytest.raises(ValueError, match="enrollment"):
        store.configure(_config(analysis_epsilon=50 * charge).to_dict())


def test_device_config_is_range_checked():
    for bad in ({"analysis_epsilon": -1.0}, {"field_epsilon": float("inf")},
                {"local_epsilon_allowed": float("nan")}, {"reports_allowed": 10**9},
                {"analysis_epsilon": "1"}, {"query_limits": {"seconds": 0}},
                {"query_limits": {"instructions": 5}}, {"budget": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            dev.DeviceConfig.from_dict(bad, source="test")
    config = dev.DeviceConfig.from_dict({"analysis_epsilon": 3.0, "query_limits": {"seconds": 1}})
    assert dev.DeviceConfig.from_dict(config.to_dict()) == config


# -- the ledger cannot be reset: a tampered audit log makes the device refuse ------------------------


def _raw(path, *statements):
    db = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        db.execute(statement)
    db.close()


AUDIT_TAMPERINGS = {
    "audit table dropped": lambda p: _raw(p, f"DROP TABLE {AUDIT_TABLE}"),
    "audit rows deleted": lambda p: _raw(
        p, f"DROP TRIGGER {AUDIT_TABLE}_no_delete", f"DELETE FROM {AUDIT_TABLE}"
    ),
    "answer rewritten as a refusal": lambda p: _raw(
        p,
        f"DROP TRIGGER {AUDIT_TABLE}_no_update",
        f"UPDATE {AUDIT_TABLE} SET entry = replace(entry, '\"answered\"', '\"refused_checks\"')",
    ),
    "database deleted": lambda p: p.unlink(),
    "database and keystore deleted": lambda p: (p.unlink(), keystore_path(p).unlink()),
}


@pytest.mark.parametrize("tampering", sorted(AUDIT_TAMPERINGS))
def test_a_tampered_audit_log_refuses_instead_of_resetting_the_budget(tmp_path, tampering):
    # Each device allows exactly one round; device 0's log is tampered with after it.
    charge = _recipe().recipe.epsilon_central_target
    config = _config(analysis_epsilon=charge, field_epsilon=charge)
    typed = [["of the people"], ["in a way"]]
    dev.create_fleet(tmp_path, typed, NOW, DAY, np.random.default_rng(3), config, 0.0)
    _, senders, counters = dev.answer_fleet(tmp_path, 2, _recipe("round-1"), 1, NOW, DAY)
    assert counters["answered"] == 2
    AUDIT_TAMPERINGS[tampering](device_path(tmp_path, 0))
    for r in (2, 3):  # refused every round: never a fresh budget
        recipe = _recipe(f"round-{r}", tree=(("of", "the"),))
        answers, senders, counters = dev.answer_fleet(tmp_path, 2, recipe, r, NOW, DAY)
        assert senders.size == 0 and answers.size == 0
        assert counters["refused_ledger"] == 1 and counters["refused_checks"] == 1
        assert counters["refusal_reasons"]["ledger_broken"] == 1
        assert counters["refusal_reasons"]["analysis_epsilon_exhausted"] == 1
    if tampering != "database and keystore deleted":
        with pytest.raises(LedgerBroken):
            dev.read_audit(tmp_path, 0)
    assert [e["status"] for e in dev.read_audit(tmp_path, 1)] == ["answered"] + [
        "refused_checks"
    ] * 2


# -- a query bomb is aborted on every device, counted, and the devices serve the next round --------


def test_query_bomb_is_refused_by_every_device_which_then_answers_the_next_round(tmp_path):
    typed = [[f"of the sentence {i}" for i in range(30)] for _ in range(3)]
    dev.create_fleet(tmp_path, typed, NOW, DAY, np.random.default_rng(3), _config(), 0.0)
    bomb = dataclasses.replace(
        _recipe("round-1"),
        query="SELECT count(*) FROM keyboard a, keyboard b, keyboard c, keyboard d, keyboard e "
        "WHERE a.text || b.text || c.text || d.text || e.text <> ''",
    )
    began = time.monotonic()
    answers, _, counters = dev.answer_fleet(tmp_path, 3, bomb, 1, NOW, DAY)
    assert time.monotonic() - began < 3.0  # 30^5 = 24 million joined rows per device, aborted
    assert counters["refused_query"] == 3 and answers.size == 0
    assert counters["refusal_reasons"] == {"query_instruction_limit": 3}
    entry = dev.read_audit(tmp_path, 0)[0]
    assert entry["reasons"] == ["query_instruction_limit"] and "aborted" in entry["detail"]
    answers, _, counters = dev.answer_fleet(tmp_path, 3, _recipe("round-2"), 2, NOW, DAY)
    assert counters["answered"] == 3 and answers.size == 3

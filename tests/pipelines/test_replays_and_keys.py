"""Replayed sealed messages and key rings that open nothing (issue: hardening round 3, items 1
and 3). One small sealed world (300 respondents, one shuffler instance) is simulated once per
module on FnApiRunner; each case attacks it in one way.

* A victim's sealed message resent by 30 other senders counts once at the shuffler (30 dead
  letters ``duplicate_payload``) and n stays the number of devices; a release that still carries
  repeats (a dishonest shuffler) has them discarded by the analyzer, counted.
* A sealed release analyzed without ``--key-ring``, or with a ring of another key, is refused
  before any work, in one line; a crowd all of whose messages were rejected is withheld with
  the reason, never estimated.
"""

from __future__ import annotations

import collections
import datetime
import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import fastavro
import pytest

from pipelines.commandline import main as cli
from schemas.crypto import sealing
from schemas.crypto.analyzer_keys import KeyRing
from schemas.recipes import load_recipe
from schemas.release import commit
from schemas.replays import OVERHEAD, repeated_sealed_payloads
from tests.transforms.analyzer.test_file_ranges import aggregate
from transforms.analyzer import arithmetic
from transforms.analyzer.aggregate import (
    BUNDLES_DECODING,
    READ_WHOLE_AFTER_RANGES,
    DecodeReleaseFile,
)
from transforms.analyzer.analyze import AnalysisConfig, EstimateBucket

FNAPI = ["--runner=FnApiRunner"]
RESPONDENTS = 300
ATTACKERS = 30


def _esa(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = cli.main(list(argv))
    return code, err.getvalue()


def _recipe(directory: Path) -> str:
    data = {
        "name": "replayed",
        "version": 1,
        "channel": "replayed",
        "randomizer": "one_hot_rappor",
        "randomizer_params": {"domain_size": 8, "epsilon": 4.0},
        "fragmentation": "attribute",
        "epsilon_local": 4.0,
        "epsilon_central_target": 4.0,
        "delta": 1e-6,
        "min_crowd_size": 50,
        "query_class": "test",
        "data_fields": ["value"],
        "shuffler_instances": 1,
    }
    path = directory / "replayed.json"
    path.write_text(json.dumps(data))
    return str(path)


def _records(path: Path) -> tuple[dict, list[dict]]:
    with open(path, "rb") as handle:
        reader = fastavro.reader(handle)
        return reader.writer_schema, list(reader)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("replays")
    recipe = _recipe(root)
    for name in ("keys", "other_keys"):
        assert (
            _esa("keys", "generate", "--output", str(root / name), "--valid-from", "2023-06-01")[0]
            == 0
        )
    [public] = (root / "keys").glob("*.public.json")
    code, err = _esa(
        "simulate", "--recipe", recipe, "--population", "uniform", "--respondents",
        str(RESPONDENTS), "--seed", "5", "--output", str(root / "simulation"),
        "--public-key", str(public), *FNAPI,
    )  # fmt: skip
    assert code == 0, err
    # The attack: 30 other senders resend one victim's sealed data message, later.
    [source] = sorted((root / "simulation" / "instance=0").glob("*.avro"))
    schema, records = _records(source)
    victim = next(r for r in records if len(r["payload"]) > OVERHEAD)
    later = datetime.timedelta(milliseconds=1)
    replays = [
        dict(victim, origin=f"attacker-{i}", event_time=victim["event_time"] + later * (1 + i))
        for i in range(ATTACKERS)
    ]
    attacked = root / "attacked"
    shutil.copytree(root / "simulation" / "instance=0", attacked)
    with open(attacked / "zz-replays.avro", "wb") as handle:
        fastavro.writer(handle, schema, replays)
    code, err = _esa(
        "shuffle", "--input", str(attacked / "*.avro"), "--instance", "0",
        "--output", str(root / "shuffled" / "instance=0"), "--recipe", recipe,
        "--crowd-threshold", "10", *FNAPI,
    )  # fmt: skip
    assert code == 0, err
    return root, recipe, victim["payload"]


def test_a_replayed_sealed_message_counts_once_and_moves_no_n(world):
    root, _, victim = world
    shuffled = root / "shuffled" / "instance=0"
    metrics = json.loads((root / "shuffled" / "instance=0.private" / "metrics.json").read_text())
    assert metrics["rejected_by_reason"].get("duplicate_payload") == ATTACKERS
    assert metrics["adds_up"]
    verified = commit.verify_release(str(shuffled))
    [crowd] = commit.iter_crowds(verified)
    assert crowd["respondents_released"] == RESPONDENTS  # the 30 senders are nobody
    released = []
    for path in sorted((shuffled / "messages").rglob("*.avro")):
        released += [r["payload"] for r in _records(path)[1]]
    counts = collections.Counter(released)
    assert counts[victim] == 1 and max(counts.values()) == 1


def test_replays_in_other_origin_shards_of_the_bucket_count_once_too(world, tmp_path):
    """The bucket split into many origin shards (--messages-per-shard 64): the replays sit in
    other shards than their victim, and still count once."""
    root, recipe, victim = world
    output = tmp_path / "sharded"
    code, err = _esa(
        "shuffle", "--input", str(root / "attacked" / "*.avro"), "--instance", "0",
        "--output", str(output), "--recipe", recipe, "--crowd-threshold", "10",
        "--messages-per-shard", "64", *FNAPI,
    )  # fmt: skip
    assert code == 0, err
    metrics = json.loads((tmp_path / "sharded.private" / "metrics.json").read_text())
    assert metrics["rejected_by_reason"].get("duplicate_payload") == ATTACKERS
    [crowd] = commit.iter_crowds(commit.verify_release(str(output)))
    assert crowd["respondents_released"] == RESPONDENTS
    released = []
    for path in sorted((output / "messages").rglob("*.avro")):
        released += [r["payload"] for r in _records(path)[1]]
    assert collections.Counter(released)[victim] == 1


def test_repeats_that_reach_the_analyzer_are_discarded_and_counted(world, tmp_path):
    root, recipe, _ = world
    [path] = sorted((root / "shuffled" / "instance=0" / "messages").rglob("*.avro"))
    schema, records = _records(path)
    replayed = tmp_path / "replayed.avro"
    with open(replayed, "wb") as handle:  # every message twice, the repeats in a later block
        fastavro.writer(handle, schema, records + records[:40], sync_interval=200)
    book = arithmetic.RecipeBook([load_recipe(recipe)])
    decode = DecodeReleaseFile(book, {1}, key_ring=str(root / "keys"), batch_records=64)
    decode.setup()
    outputs = list(decode.process(str(replayed)))
    [counts] = [o.value for o in outputs if getattr(o, "tag", None) == "counts"]
    assert counts["rejected:duplicate_payload"] == 40
    clean = DecodeReleaseFile(book, {1}, key_ring=str(root / "keys"), batch_records=64)
    clean.setup()
    [clean_counts] = [
        o.value for o in clean.process(str(path)) if getattr(o, "tag", None) == "counts"
    ]
    assert counts["messages"] == clean_counts["messages"]
    assert counts["read"] == clean_counts["read"] + 40


def test_repeats_in_a_file_read_in_ranges_are_discarded_exactly(world, tmp_path):
    """The file cut into ranges of 64 records: repeats in other ranges than their first copy
    (the file is read whole after its ranges' fingerprints are compared) and repeats next to
    their first copy count as a whole-file reading counts them."""
    root, recipe, _ = world
    [path] = sorted((root / "shuffled" / "instance=0" / "messages").rglob("*.avro"))
    schema, records = _records(path)
    far, near = tmp_path / "far.avro", tmp_path / "near.avro"
    with open(far, "wb") as handle:  # the repeats at the end, in other ranges
        fastavro.writer(handle, schema, records + records[:40], sync_interval=200)
    doubled = [copy for record in records[:40] for copy in (record, record)] + records[40:]
    with open(near, "wb") as handle:  # each repeat right after its first copy
        fastavro.writer(handle, schema, doubled, sync_interval=200)
    book = arithmetic.RecipeBook([load_recipe(recipe)])
    ring = str(root / "keys")
    for replayed in (far, near):
        whole = aggregate([str(replayed)], tmp_path, book=book, key_ring=ring, range_records=10**6)
        ranges = aggregate([str(replayed)], tmp_path, book=book, key_ring=ring, range_records=64)
        assert ranges[:3] == whole[:3]
        assert whole[2]["rejected:duplicate_payload"] == 40
        assert ranges[3][BUNDLES_DECODING] >= 1
    assert ranges[3].get(READ_WHOLE_AFTER_RANGES, 0) <= 1  # near: a pair may straddle two ranges
    far_ranges = aggregate([str(far)], tmp_path, book=book, key_ring=ring, range_records=64)
    assert far_ranges[3][READ_WHOLE_AFTER_RANGES] == 1


def test_repeated_sealed_payloads_keeps_the_first_and_leaves_clear_payloads_alone():
    sealed_a = bytes([sealing.ENVELOPE_VERSION]) + bytes(range(70))
    sealed_b = bytes([sealing.ENVELOPE_VERSION]) + bytes(range(1, 71))
    clear = b"\x02\x04"
    payloads = [sealed_a, clear, sealed_a, sealed_b, clear, sealed_a, sealed_b]
    groups = [0, 0, 0, 0, 0, 1, 1]
    assert repeated_sealed_payloads(groups, payloads).tolist() == [
        False, False, True, False, False, False, False,
    ]  # fmt: skip
    # The earliest (by the order given) keeps its copy.
    order = [5, 0, 1, 0, 0, 0, 0]
    assert repeated_sealed_payloads(groups, payloads, order).tolist() == [
        True, False, False, False, False, False, False,
    ]  # fmt: skip
    # A forgery sharing the victim's encapsulated-key prefix but not its bytes is no repeat.
    forged = sealed_a[:40] + bytes(31)
    assert repeated_sealed_payloads([0, 0], [sealed_a, forged]).tolist() == [False, False]
    assert repeated_sealed_payloads([0, 0], [forged, sealed_a]).tolist() == [False, False]
    assert OVERHEAD == sealing.OVERHEAD


def test_a_sealed_release_without_a_key_ring_is_refused_before_work(world, tmp_path):
    root, recipe, _ = world
    code, err = _esa(
        "analyze", "--input", str(root / "shuffled"), "--output", str(tmp_path / "a"),
        "--recipe", recipe, "--no-pictures", *FNAPI,
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1, err
    assert "sealed" in err and "--key-ring" in err
    assert not (tmp_path / "a" / "summary.json").exists()


def test_a_sealed_release_with_another_key_ring_is_refused_before_work(world, tmp_path):
    root, recipe, _ = world
    code, err = _esa(
        "analyze", "--input", str(root / "shuffled"), "--output", str(tmp_path / "a"),
        "--recipe", recipe, "--key-ring", str(root / "other_keys"), "--no-pictures", *FNAPI,
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1, err
    assert "does not hold" in err
    assert not (tmp_path / "a" / "summary.json").exists()


def test_a_crowd_whose_messages_all_failed_to_open_is_withheld_not_estimated(world):
    root, recipe, _ = world
    shuffled = root / "shuffled" / "instance=0"
    book = arithmetic.RecipeBook([load_recipe(recipe)])
    decode = DecodeReleaseFile(book, {1}, key_ring=str(root / "other_keys"))
    decode.setup()
    bucket = arithmetic.CrowdBucket()
    for path in sorted((shuffled / "messages").rglob("*.avro")):
        for output in decode.process(str(path)):
            if getattr(output, "tag", None) is None:
                bucket.merge(output[1])
    crowds = [(0, c) for c in commit.iter_crowds(commit.verify_release(str(shuffled)))]
    for partial in arithmetic.commit_buckets(crowds, book).values():
        bucket.merge(partial)
    [(key, accumulator)] = list(bucket.items())
    assert accumulator.messages == 0 and accumulator.respondents == {0: RESPONDENTS}
    assert set(accumulator.rejected) == {"sealed_unknown_key"}
    estimate = EstimateBucket(AnalysisConfig(book=book))
    estimate.setup()
    outputs = list(estimate.process(((arithmetic.HISTOGRAM, 0, 0, 0), bucket)))
    tags = collections.Counter(getattr(o, "tag", None) for o in outputs)
    assert tags["histogram"] == 0 and tags["report"] == 0 and tags["note"] == 1
    totals = [o for o in outputs if getattr(o, "tag", None) is None]
    assert totals == [{"withheld": 1}]
    assert KeyRing.load(root / "other_keys")  # a usable ring, just not this release's


# -- Key files (issue: hardening round 3, item 8) ---------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_private_key_readable_by_others_is_refused_naming_the_fix(world, tmp_path, mode):
    root, recipe, _ = world
    for kind in ("analyzer", "signing"):
        keys = tmp_path / kind
        extra = ["--shuffler-instance", "0"] if kind == "signing" else []
        assert _esa("keys", "generate", "--output", str(keys), *extra)[0] == 0
        [private] = keys.glob("*.private.json")
        assert private.stat().st_mode & 0o777 == 0o600  # written 0600, whatever the umask
        private.chmod(mode)
        if kind == "analyzer":
            argv = ["analyze", "--input", str(root / "shuffled"), "--key-ring", str(keys)]
            argv += ["--output", str(tmp_path / "a"), "--recipe", recipe, *FNAPI]
        else:
            argv = ["shuffle", "--input", str(root / "attacked" / "*.avro"), "--instance", "0"]
            argv += ["--output", str(tmp_path / "s"), "--recipe", recipe]
            argv += ["--signing-key", str(private), *FNAPI]
        code, err = _esa(*argv)
        assert code == 2 and err.count("\n") == 1, err
        assert f"chmod 600 {private}" in err and f"{mode:04o}" in err
        assert not (tmp_path / "a").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("output", ["", " "])
def test_keys_generate_refuses_an_empty_output(tmp_path, output, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _esa("keys", "generate", "--output", output)
    assert code == 2 and err.count("\n") == 1 and "--output" in err
    assert list(tmp_path.iterdir()) == []

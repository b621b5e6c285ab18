"""esa aggregate (both aggregators, both phases) and esa unshard on hand-built releases, and the
threats of the aggregate model: invalid and oversized shares, replays, a dropping aggregator,
missing, mismatched or foreign aggregate shares."""

from __future__ import annotations

import json

import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import aggregate, unshard
from pipelines.commandline.main import UsageError, main
from schemas.crypto.analyzer_keys import generate_key, write_key_pair
from schemas.crypto.prio3_reports import REPORT_ID_BYTES, Sealer, seal_shards
from schemas.crypto.verify_keys import generate_verify_key, write_verify_key
from tests import release_fixtures as fx
from tests.transforms.aggregators.test_shares import small_recipe

FIELD128_MODULUS = 2**66 * 4611686018427387897 + 1
pytestmark = pytest.mark.slow  # four Beam pipelines per scenario (about 25 s in all)
LENGTH = 16
HONEST = 12
MIN_BATCH = 5


def options() -> PipelineOptions:
    return PipelineOptions(["--runner=FnApiRunner"])


def malicious(vdaf, sealers, rng, recipe, kind: str) -> bytes:
    """A device that shards a valid vector and then shifts its leader measurement share, so the
    two shares add up to a vector that is not a valid report (a 2, or a -1 in some bucket)."""
    report_id = rng.bytes(REPORT_ID_BYTES)
    shards = vdaf.shard(np.zeros(LENGTH, dtype=int), report_id)
    leader = shards.input_shares[0]
    delta = {"two": 2, "minus_one": -1, "huge": 10**6}[kind]
    value = (int.from_bytes(leader[16:32], "little") + delta) % FIELD128_MODULUS
    forged = leader[:16] + value.to_bytes(16, "little") + leader[32:]
    shards = type(shards)(shards.public_share, (forged, shards.input_shares[1]))
    return seal_shards(
        shards, sealers, report_id, recipe.id, recipe.channel, fx.T0, fx.T0 + fx.DAY_MS, None
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("prio3_world")
    recipe = small_recipe(LENGTH, MIN_BATCH)
    (root / "recipe.json").write_text(recipe.to_json())
    keys = [generate_key() for _ in range(2)]
    for j, key in enumerate(keys):
        write_key_pair(key, root / f"agg{j}")
    analyzer = generate_key()
    write_key_pair(analyzer, root / "analyzer")
    write_verify_key(root / "verify.json", generate_verify_key())
    vdaf = recipe.build_vdaf()
    sealers = [Sealer(key.public) for key in keys]
    rng = np.random.default_rng(25)
    vectors = [rng.integers(0, 2, LENGTH) for _ in range(HONEST)]
    honest = []
    for vector in vectors:
        report_id = rng.bytes(REPORT_ID_BYTES)
        honest.append(
            seal_shards(
                vdaf.shard(vector, report_id),
                sealers,
                report_id,
                recipe.id,
                recipe.channel,
                fx.T0,
                fx.T0 + fx.DAY_MS,
                None,
            )
        )
    bad = [malicious(vdaf, sealers, rng, recipe, kind) for kind in ("two", "minus_one", "huge")]
    hostile = bad + [honest[0] + b"\x00", honest[1][:-1], honest[2]]  # oversized, cut, replayed
    payloads = honest + hostile
    crowd = fx.crowd(None, len(payloads), channel=recipe.channel, recipe_id=recipe.id)
    fx.write_release(root / "release" / "instance=0", [crowd], [payloads])
    return {
        "root": root,
        "recipe": recipe,
        "vectors": vectors,
        "analyzer_public": str(next((root / "analyzer").glob("*.public.json"))),
    }


def verify(world, agg_id, output, release=None, run_id=None):
    root = world["root"]
    return aggregate.run_verify(
        agg_id,
        [str(release or root / "release")],
        str(root / "recipe.json"),
        str(root / f"agg{agg_id}"),
        str(root / "verify.json"),
        str(output),
        options(),
        run_id=run_id,
    )


def finish(world, agg_id, output, peer):
    return aggregate.run_finish(agg_id, str(output), str(peer), world["analyzer_public"], options())


@pytest.fixture(scope="module")
def aggregated(world):
    root = world["root"]
    outputs = [root / f"out{j}" for j in range(2)]
    phase_one = [verify(world, j, outputs[j]) for j in range(2)]
    phase_two = [finish(world, j, outputs[j], outputs[1 - j]) for j in range(2)]
    return outputs, phase_one, phase_two


def test_invalid_oversized_and_replayed_reports_are_rejected_and_the_sum_is_unchanged(
    world, aggregated
):
    outputs, phase_one, phase_two = aggregated
    for summary in phase_one:
        assert summary["adds_up"] and summary["read"] == HONEST + 6
        assert summary["rejected_by_reason"] == {
            "prio3_bad_length": 2,
            "replayed_report": 1,
        }
    for summary in phase_two:
        assert summary["adds_up"]
        assert summary["rejected_by_reason"] == {"prio3_invalid": 3}
        assert summary["verified"] == HONEST and summary["published"] == 1
    result = unshard.run(
        [str(o) for o in outputs], str(world["root"] / "analyzer"), str(world["root"] / "analysis")
    )
    assert result["crowds_estimated"] == 1 and result["respondents"] == HONEST
    import pyarrow.parquet as pq

    table = pq.read_table(world["root"] / "analysis" / "histograms.parquet")
    np.testing.assert_array_equal(
        table.column("raw_count").to_numpy(), np.sum(world["vectors"], axis=0)
    )
    assert set(table.column("n").to_pylist()) == {HONEST}
    privacy = result["crowds"][0]["privacy"]
    assert privacy["respondents"] == HONEST and privacy["epsilon_central"] <= 2.0
    # Verification state is gone once published; dead letters name every rejection.
    assert not (outputs[0] / "private" / "states").exists()
    letters = [
        json.loads(line)
        for path in (outputs[0] / "private").glob("dead_letters-*/*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert sorted(letter["reason"] for letter in letters) == sorted(
        ["prio3_bad_length"] * 2 + ["replayed_report"] + ["prio3_invalid"] * 3
    )


def test_one_aggregators_published_share_alone_is_not_the_histogram(world, aggregated):
    """The aggregate share each aggregator publishes is sealed to the analyzer, and even opened
    it is uniformly random: unsharding one share with a zero share gives field-sized numbers."""
    outputs, _, _ = aggregated
    record = json.loads((outputs[0] / aggregate.AGGREGATE_FILE).read_text())
    sealed = bytes.fromhex(record["published"][0]["sealed_share"])
    assert sealed.count(b"\x00") < len(sealed) // 8  # ciphertext, not field elements near 0
    vdaf = world["recipe"].build_vdaf()
    from schemas.crypto.analyzer_keys import KeyRing
    from schemas.crypto.prio3_reports import open_aggregate_share

    entry = record["published"][0]
    share = open_aggregate_share(
        KeyRing.load(world["root"] / "analyzer"),
        sealed,
        0,
        record["run_id"],
        recipe_id=record["recipe_id"],
        channel=record["channel"],
        window_start_ms=entry["window_start"],
        window_end_ms=entry["window_end"],
        crowd_id=entry["crowd_id"],
        reports=entry["reports"],
        checksum=int(entry["checksum"], 16),
    )
    with pytest.raises(ValueError, match="exceeds"):
        vdaf.unshard([share, vdaf.aggregate_init()], HONEST)


def test_an_aggregator_that_drops_reports_makes_both_publish_nothing(world, aggregated, tmp_path):
    outputs, _, _ = aggregated
    root = world["root"]
    # Aggregator 1 verifies a copy of the release that lacks one report: the counts disagree.
    source = root / "release" / "instance=0"
    recipe = world["recipe"]
    dropped = tmp_path / "dropped" / "instance=0"
    payloads = []
    import fastavro

    for path in sorted(source.glob("messages/*.avro")):
        with open(path, "rb") as handle:
            payloads += [record["payload"] for record in fastavro.reader(handle)]
    kept = payloads[1:]
    crowd = fx.crowd(None, len(kept), channel=recipe.channel, recipe_id=recipe.id)
    fx.write_release(dropped, [crowd], [kept])
    mine, theirs = tmp_path / "a0", tmp_path / "a1"
    # Both agreed on the run (its releases may differ: that is the attack).
    verify(world, 0, mine, run_id="run-1")
    verify(world, 1, theirs, release=tmp_path / "dropped", run_id="run-1")
    for j, (output, peer) in enumerate(((mine, theirs), (theirs, mine))):
        summary = finish(world, j, output, peer)
        assert summary["published"] == 0 and summary["withheld"] == 1
        record = json.loads((output / aggregate.AGGREGATE_FILE).read_text())
        assert record["withheld"][0]["reason"].startswith("aggregators_disagree: report counts")


def test_the_analyzer_refuses_missing_mismatched_and_foreign_shares(world, aggregated, tmp_path):
    outputs, _, _ = aggregated
    ring = str(world["root"] / "analyzer")

    def variant(name, change):
        copies = []
        for j, output in enumerate(outputs):
            target = tmp_path / name / f"a{j}"
            target.mkdir(parents=True)
            record = json.loads((output / aggregate.AGGREGATE_FILE).read_text())
            change(j, record)
            (target / aggregate.AGGREGATE_FILE).write_text(json.dumps(record))
            copies.append(str(target))
        return copies

    def drop_second(j, record):
        if j == 1:
            record["published"] = []

    def inflate(j, record):
        if j == 1:
            record["published"][0]["reports"] += 1

    def both_inflate(j, record):
        record["published"][0]["reports"] += 1

    def flip(j, record):
        if j == 0:
            share = bytearray.fromhex(record["published"][0]["sealed_share"])
            share[-1] ^= 1
            record["published"][0]["sealed_share"] = share.hex()

    expected = {
        "missing": (drop_second, "aggregator 1's aggregate share is missing"),
        "mismatch": (inflate, "different report counts"),
        "both_inflated": (both_inflate, "does not open"),
        "flipped": (flip, "does not open"),
    }
    for name, (change, words) in expected.items():
        result = unshard.run(variant(name, change), ring, str(tmp_path / name / "out"))
        assert result["crowds_estimated"] == 0, name
        assert words in result["crowds"][0]["refused"], name

    def other_run(j, record):
        if j == 1:
            record["run_id"] = "another"

    with pytest.raises(UsageError, match="different runs"):
        unshard.run(variant("run", other_run), ring, str(tmp_path / "run" / "out"))

    def same_aggregator(j, record):
        record["aggregator"] = 0

    with pytest.raises(UsageError, match="aggregator 0's and aggregator 1's"):
        unshard.run(variant("same", same_aggregator), ring, str(tmp_path / "same" / "out"))


def test_command_line_refusals_are_one_line(world, aggregated, capsys):
    root = world["root"]
    outputs, _, _ = aggregated
    status = main(
        [
            "aggregate",
            "--aggregator",
            "0",
            "--phase",
            "finish",
            "--output",
            str(outputs[0]),
            "--peer",
            str(outputs[0]),
            "--analyzer-key",
            world["analyzer_public"],
        ]
    )
    assert status == 2
    assert "give aggregator 1's directory" in capsys.readouterr().err
    status = main(
        [
            "aggregate",
            "--aggregator",
            "1",
            "--phase",
            "verify",
            "--output",
            str(root / "never"),
            "--input",
            str(root / "release"),
            "--recipe",
            "image_grid_sealed",
            "--key-ring",
            str(root / "agg1"),
            "--verify-key",
            str(root / "verify.json"),
        ]
    )
    assert status == 2
    assert "is not a prio3 recipe" in capsys.readouterr().err


def test_signed_aggregate_records_are_required_when_the_keys_are_given(world, aggregated, tmp_path):
    from schemas.crypto.analyzer_keys import write_key_pair as write_pair
    from schemas.crypto.commit_signing import sign_commit
    from schemas.crypto.signing_keys import generate_signing_key

    outputs, _, _ = aggregated
    keys = [generate_signing_key(j, valid_from_ms=0) for j in range(2)]
    for key in keys:
        write_pair(key, tmp_path / "trusted")
    ring = str(world["root"] / "analyzer")
    records = [json.loads((o / aggregate.AGGREGATE_FILE).read_text()) for o in outputs]

    def write(name, signed):
        paths = []
        for j, record in enumerate(signed):
            target = tmp_path / name / f"a{j}"
            target.mkdir(parents=True)
            (target / aggregate.AGGREGATE_FILE).write_text(json.dumps(record))
            paths.append(str(target))
        return paths

    good = [sign_commit(r | {"instance": j}, keys[j]) for j, r in enumerate(records)]
    result = unshard.run(
        write("good", good), ring, str(tmp_path / "o1"), None, str(tmp_path / "trusted")
    )
    assert result["signed"] and result["crowds_estimated"] == 1
    with pytest.raises(UsageError, match="not signed"):
        unshard.run(
            write("unsigned", [good[0], records[1] | {"instance": 1}]),
            ring,
            str(tmp_path / "o2"),
            None,
            str(tmp_path / "trusted"),
        )
    altered = json.loads(json.dumps(good))
    altered[1]["published"][0]["checksum"] = "0" * 64
    with pytest.raises(UsageError, match="altered after signing"):
        unshard.run(
            write("altered", altered), ring, str(tmp_path / "o3"), None, str(tmp_path / "trusted")
        )
    swapped = [sign_commit(records[0] | {"instance": 1}, keys[1]), good[1]]
    with pytest.raises(UsageError, match="signed for another aggregator"):
        unshard.run(
            write("swapped", swapped), ring, str(tmp_path / "o4"), None, str(tmp_path / "trusted")
        )

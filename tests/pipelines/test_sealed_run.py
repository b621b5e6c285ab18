"""Sealed reports end to end: esa keys -> simulate --public-key -> shuffle (no key) -> analyze.

One small world (a 16-bucket one-hot k-RAPPOR recipe with chaff, two shuffler instances, 4,000
respondents) is simulated, shuffled and analyzed once per module on FnApiRunner.
"""

from __future__ import annotations

import collections
import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline import main as cli
from schemas import crc32c
from schemas.crypto import sealing
from schemas.crypto.analyzer_keys import KeyRing
from schemas.crypto.sealing import recipe_pad_length
from schemas.recipes import load_recipe
from schemas.release import commit as release
from transforms.analyzer.aggregate import DecodeReleaseFile
from transforms.analyzer.arithmetic import RecipeBook
from transforms.analyzer.opening import ReleaseOpener
from transforms.common import avro_io

pytestmark = pytest.mark.slow

FNAPI = ["--runner=FnApiRunner"]
RESPONDENTS = 4_000
CHAFF_RATE = 0.5


def _recipe(directory: Path) -> str:
    data = {
        "name": "sealed",
        "version": 1,
        "channel": "sealed",
        "randomizer": "one_hot_rappor",
        "randomizer_params": {"domain_size": 16, "epsilon": 4.0},
        "fragmentation": "attribute",
        "epsilon_local": 4.0,
        "epsilon_central_target": 4.0,
        "delta": 1e-6,
        "min_crowd_size": 1000,
        "query_class": "test",
        "data_fields": ["value"],
        "shuffler_instances": 2,
        "chaff_rate": CHAFF_RATE,
    }
    path = directory / "sealed.json"
    path.write_text(json.dumps(data))
    return str(path)


def _esa(*argv: str) -> int:
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return cli.main(list(argv))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("sealed")
    recipe = _recipe(root)
    assert (
        _esa("keys", "generate", "--output", str(root / "keys"), "--valid-from", "2023-06-01") == 0
    )
    [public] = (root / "keys").glob("*.public.json")
    assert _esa(
        "simulate", "--recipe", recipe, "--population", "uniform", "--respondents",
        str(RESPONDENTS), "--seed", "11", "--output", str(root / "simulation"),
        "--public-key", str(public), *FNAPI,
    ) == 0  # fmt: skip
    # The shuffler runs with no key material anywhere it can read: the keys are moved away.
    hidden = root.parent / f"{root.name}-analyzer-only"
    os.rename(root / "keys", hidden)
    for u in range(2):
        assert _esa(
            "shuffle", "--input", str(root / "simulation" / f"instance={u}" / "*.avro"),
            "--instance", str(u), "--output", str(root / "shuffled" / f"instance={u}"),
            "--recipe", recipe, "--crowd-threshold", "10", *FNAPI,
        ) == 0  # fmt: skip
    assert _esa(
        "analyze", "--input", str(root / "shuffled"), "--output", str(root / "analysis"),
        "--recipe", recipe, "--truth", str(root / "simulation"), "--key-ring", str(hidden),
        "--no-pictures", *FNAPI,
    ) == 0  # fmt: skip
    return root, recipe, hidden


def _payloads(root: Path, pattern: str) -> list[bytes]:
    out = []
    for path in sorted(root.glob(pattern)):
        with open(path, "rb") as handle:
            out += [record["payload"] for record in fastavro.reader(handle)]
    return out


def test_sealed_payloads_have_one_length_and_the_release_carries_them_byte_for_byte(world):
    root, recipe, _ = world
    sent = [p for p in _payloads(root, "simulation/instance=*/*.avro") if p]
    released = _payloads(root, "shuffled/instance=*/messages/**/*.avro")
    assert len(released) > RESPONDENTS
    pad_to = recipe_pad_length(load_recipe(recipe))
    assert {len(p) for p in sent} == {sealing.sealed_length(pad_to)}
    assert collections.Counter(released) == collections.Counter(sent)
    stated = json.loads((root / "simulation" / "simulation.json").read_text())["sealing"]
    assert stated["sealed_length"] == sealing.sealed_length(pad_to)
    assert stated["chaff_rate"] == CHAFF_RATE and stated["chaff_allowance"] == 1
    simulation = json.loads((root / "simulation" / "simulation.json").read_text())
    analysis = json.loads((root / "analysis" / "summary.json").read_text())
    # Every chaff message the devices stated reaches the analyzer (threshold 10: nothing deleted).
    assert simulation["chaff_messages"] == analysis["metrics"]["chaff"]
    assert len(sent) == simulation["messages"] + simulation["chaff_messages"]


def test_sealed_estimates_match_their_standard_error_and_chaff_is_counted(world):
    root, _, _ = world
    summary = json.loads((root / "analysis" / "summary.json").read_text())
    metrics = summary["metrics"]
    assert metrics["adds_up"] and metrics["dead_lettered"] == 0
    # Chaff: one cover message per device and instance with probability 1/2, so Binomial(8000,
    # 1/2): 4000 +- 45; the bounds are 6 sd (false failure < 1e-8).
    assert 4000 - 270 <= metrics["chaff"] <= 4000 + 270
    table = pq.read_table(root / "analysis" / "histograms.parquet").sort_by("bucket")
    estimate, stderr = table.column("estimate").to_numpy(), table.column("stderr").to_numpy()
    truth = table.column("truth").to_numpy()
    # Each of 16 buckets within 4.5 sd (~1e-4 false failures for the 16 together).
    assert np.all(np.abs(estimate - truth) <= 4.5 * stderr)


def test_shufflers_count_presence_and_never_cap_a_devices_chaff(world):
    root, _, _ = world
    for u in range(2):
        metrics = json.loads(
            (root / "shuffled" / f"instance={u}.private" / "metrics.json").read_text()
        )
        # Every device sends one unsealed presence message to each instance; its chaff (anchored
        # on them) stays within the per-origin cap, so nothing is dead-lettered over_origin_cap.
        assert metrics["presence"] == RESPONDENTS and metrics["adds_up"]
        assert metrics["dead_lettered"] == 0, metrics["rejected_by_reason"]
        verified = release.verify_release(str(root / "shuffled" / f"instance={u}"))
        crowds = release.iter_crowds(verified)
        assert [c["respondents_released"] for c in crowds] == [RESPONDENTS]
        assert verified.commit["respondents_released"] == RESPONDENTS


def test_a_flipped_byte_is_exactly_one_dead_letter_with_a_decryption_reason(world):
    root, recipe, hidden = world
    book = {load_recipe(recipe).id: load_recipe(recipe)}
    opener = ReleaseOpener(KeyRing.load(hidden), book)
    path = sorted((root / "shuffled" / "instance=0" / "messages").rglob("*.avro"))[0]
    [batch] = [b for b in avro_io.read_avro_batches(str(path), 1 << 20)]
    columns = batch.columns
    clean = opener.open_batch(columns)
    assert clean.rejected_rows.size == 0
    row = int(clean.kept_rows[0])  # a data message (not chaff)
    payloads = columns.column("payload").to_pylist()
    crcs = columns.column("payload_crc32c").to_pylist()
    flipped = bytearray(payloads[row])
    flipped[30] ^= 0x40
    payloads[row], crcs[row] = bytes(flipped), crc32c(bytes(flipped))  # a CRC that matches
    tampered = columns.set_column(
        columns.schema.get_field_index("payload"), "payload", pa.array(payloads, pa.binary())
    ).set_column(columns.schema.get_field_index("payload_crc32c"), "payload_crc32c", pa.array(crcs))
    bad = opener.open_batch(tampered)
    assert bad.rejected_reasons == ["sealed_open_failed"] and bad.rejected_rows.tolist() == [row]
    assert bad.columns.num_rows == clean.columns.num_rows - 1
    assert bad.counts["chaff"] == clean.counts["chaff"]
    assert bad.counts["read"] == clean.counts["read"] + 1


def test_no_private_key_bytes_in_options_or_pickled_dofns(world):
    root, recipe, hidden = world
    ring = KeyRing.load(hidden)
    secrets_ = []
    for key in ring:
        text = json.loads(key.to_json())["private_key"]
        secrets_ += [text.encode(), bytes.fromhex(text)]
    options = PipelineOptions(["--analyze_key_ring", str(hidden), *FNAPI])
    dofn = DecodeReleaseFile(RecipeBook([load_recipe(recipe)]), {1}, key_ring=str(hidden))
    blobs = [pickler.dumps(dofn), pickler.dumps(options), json.dumps(options.get_all_options())]
    for blob in blobs:
        data = blob if isinstance(blob, bytes) else blob.encode()
        assert not any(secret in data for secret in secrets_)
    dofn.setup()  # as on a worker: the keys are read from the path inside the DoFn
    with pytest.raises(TypeError, match="never pickled"):  # and can never leave it pickled
        pickler.dumps(dofn)


def test_keys_cli_errors_are_one_line(tmp_path):
    err = io.StringIO()
    with redirect_stderr(err):
        code = cli.main(["keys", "generate", "--output", str(tmp_path), "--key-id", "nothex"])
    assert code == 2 and err.getvalue().count("\n") == 1 and "key id" in err.getvalue()
    with redirect_stderr(io.StringIO()):
        assert cli.main(["analyze", "--input", str(tmp_path), "--output", str(tmp_path / "a"),
                         "--key-ring", str(tmp_path / "none")]) == 2  # fmt: skip


def test_the_key_check_estimates_the_sealed_messages_to_open(world):
    """check_release_keys returns the work of opening (every released message is sealed here:
    data and chaff), which decides whether esa analyze spreads over worker processes."""
    from pipelines import analyze as analyze_pipeline
    from pipelines import release_keys

    root, _, hidden = world
    releases = analyze_pipeline.discover_releases([str(root / "shuffled")], None)
    released = sum(int(r.commit["records_released"]) for r in releases)
    assert released > RESPONDENTS
    assert release_keys.check_release_keys(releases, str(hidden)) == released

"""``esa train`` against hostile devices and files: every epoch goes through the shuffler's own
pipeline (per-origin caps) and is read only through the analyzer's verified reader."""

from __future__ import annotations

import json

import fastavro
import numpy as np
import pytest

from pipelines.commandline import keys as keys_cli
from pipelines.commandline.main import UsageError
from pipelines.train import (
    NonFiniteResult,
    open_epoch_releases,
    run_devices,
    shuffle_and_step,
)
from privacy.ldp_sgd import learning_rate
from schemas.avro.crc32c import crc32c_many
from schemas.ldp_sgd import SgdChannel, encode_sgd_payloads
from simulators.sgd_data import load_device_data
from simulators.sgd_devices import EpochPlan, reference_epoch

FLAGS = ["--runner=FnApiRunner"]
DEVICES = 300
FLOOD = 5_000
VICTIM = 42  # the flooding device's index


def _settings(output, instances=1):
    settings = {
        "dataset": f"synthetic:{DEVICES}", "data_seed": 0, "epsilon": 2.0, "clip_norm": 1.0,
        "radius": 5.0, "instances": instances, "reports_per_device": 1, "seed": 7,
        "devices_per_shard": DEVICES, "crowd_threshold": 20, "deletion_epsilon": None,
        "deletion_delta": None, "epochs": 1, "delta": 1e-5,
    }  # fmt: skip
    signing = keys_cli.run_signing_keys(output, instances)
    settings["signing_keys"] = {instance: str(path) for instance, path in signing.items()}
    settings["shuffler_keys"] = str(output / keys_cli.SIGNING_KEYS_DIR)
    return settings


def _channel(data, settings, epoch=1):
    return SgdChannel(
        settings["dataset"], epoch, settings["epsilon"], settings["clip_norm"], data.dimension,
        settings["instances"], settings["reports_per_device"], settings["crowd_threshold"],
    )  # fmt: skip


def _reports(output, epoch=1, instance=0):
    folder = output / "epochs" / f"epoch={epoch:04d}" / "reports" / f"instance={instance}"
    (path,) = sorted(folder.glob("reports-*.avro"))
    with open(path, "rb") as handle:
        reader = fastavro.reader(handle)
        return folder, reader.writer_schema, list(reader)


def _flood(folder, schema, records):
    with open(folder / "flood.avro", "wb") as handle:
        fastavro.writer(handle, schema, records)


def _reference(data, settings, theta):
    plan = EpochPlan(1, settings["epsilon"], settings["clip_norm"], data.dimension, seed=7,
                     devices_per_shard=DEVICES)  # fmt: skip
    return plan, reference_epoch(data, plan, theta, settings["radius"])


def test_a_device_resending_its_report_thousands_of_times_is_used_once(tmp_path):
    data = load_device_data(f"synthetic:{DEVICES}")
    settings = _settings(tmp_path)
    theta = np.zeros(data.dimension)
    run_devices(FLAGS, data, settings, 1, theta, tmp_path)
    folder, schema, records = _reports(tmp_path)
    (victim,) = [r for r in records if r["origin"] == f"device-{VICTIM:09d}"]
    _flood(folder, schema, [victim] * FLOOD)
    theta_next, info = shuffle_and_step(FLAGS, data, settings, 1, theta, tmp_path)
    # Used once, as an honest device's report: n, the reports used and the model are the
    # unflooded epoch's.
    assert info["reports"] == DEVICES and info["read"] == DEVICES and info["adds_up"]
    assert info["crowds"] == [DEVICES]
    (summary,) = info["shuffles"].values()
    assert summary["dead_lettered"] == FLOOD and summary["released"] == DEVICES
    assert set(summary["rejected_by_reason"]) <= {"over_origin_cap", "duplicate_payload"}
    _, expected = _reference(data, settings, theta)
    np.testing.assert_allclose(theta_next, expected.theta, rtol=0, atol=1e-12)


def test_a_device_flooding_distinct_reports_moves_the_model_by_one_report_at_most(tmp_path):
    data = load_device_data(f"synthetic:{DEVICES}")
    settings = _settings(tmp_path, instances=2)
    theta = np.zeros(data.dimension)
    run_devices(FLAGS, data, settings, 1, theta, tmp_path)
    origin = f"device-{VICTIM:09d}"
    instance = next(
        u for u in (0, 1) if any(r["origin"] == origin for r in _reports(tmp_path, instance=u)[2])
    )
    folder, schema, records = _reports(tmp_path, instance=instance)
    (victim,) = [r for r in records if r["origin"] == origin]
    # Poison: 5,000 fresh reports, each a valid payload with its own seed and the sign +1.
    seeds = np.random.default_rng(9).integers(0, 256, size=(FLOOD, 16), dtype=np.uint8)
    payloads = encode_sgd_payloads(seeds, np.ones(FLOOD, dtype=np.int8)).to_pylist()
    crcs = crc32c_many(payloads).astype(np.int64).tolist()
    _flood(folder, schema, [
        {**victim, "payload": p, "payload_crc32c": c} for p, c in zip(payloads, crcs, strict=True)
    ])  # fmt: skip
    theta_next, info = shuffle_and_step(FLAGS, data, settings, 1, theta, tmp_path)
    assert info["reports"] == DEVICES and info["adds_up"]
    assert sum(info["crowds"]) == DEVICES  # n: the committed respondents, the flooder once
    summary = info["shuffles"][instance]
    assert summary["rejected_by_reason"] == {"over_origin_cap": FLOOD}
    # At most one of the device's reports was replaced by one of its own: theta moves by at
    # most eta |2 B| / n (the projection onto C does not expand distances).
    plan, expected = _reference(data, settings, theta)
    randomizer = plan.randomizer
    eta = learning_rate(1, 2 * settings["radius"], DEVICES, 2.0, 1.0, data.dimension)
    bound = eta * 2 * randomizer.scale / DEVICES
    assert np.linalg.norm(theta_next - expected.theta) <= bound * (1 + 1e-6)


def test_a_missing_or_altered_commit_record_makes_training_refuse(tmp_path):
    data = load_device_data(f"synthetic:{DEVICES}")
    settings = _settings(tmp_path)
    theta = np.zeros(data.dimension)
    run_devices(FLAGS, data, settings, 1, theta, tmp_path)
    shuffle_and_step(FLAGS, data, settings, 1, theta, tmp_path)
    epoch_dir = tmp_path / "epochs" / "epoch=0001"
    channel = _channel(data, settings)
    (opened,) = open_epoch_releases(epoch_dir, channel, 1, settings["shuffler_keys"])
    assert opened.respondents == DEVICES
    commit = epoch_dir / "shuffled" / "instance=0" / "_COMMIT.json"
    original = commit.read_text()
    record = json.loads(original)
    # Altered: n raised in the record (its signature no longer holds).
    record["respondents_released"] = 2 * DEVICES
    commit.write_text(json.dumps(record))
    with pytest.raises(UsageError, match="refusing release"):
        open_epoch_releases(epoch_dir, channel, 1, settings["shuffler_keys"])
    # Unsigned, with the signature stripped: refused as well.
    record = json.loads(original)
    record.pop("signature")
    commit.write_text(json.dumps(record))
    with pytest.raises(UsageError, match="refusing release"):
        open_epoch_releases(epoch_dir, channel, 1, settings["shuffler_keys"])
    # Missing: no fallback to counting messages.
    commit.unlink()
    with pytest.raises(UsageError, match="uncommitted"):
        open_epoch_releases(epoch_dir, channel, 1, settings["shuffler_keys"])
    # A message file the record does not list (a copy) is refused, never read.
    commit.write_text(original)
    (message,) = (epoch_dir / "shuffled" / "instance=0" / "messages").glob("*.avro")
    (message.parent / ("copy-" + message.name)).write_bytes(message.read_bytes())
    with pytest.raises(UsageError, match="not listed"):
        open_epoch_releases(epoch_dir, channel, 1, settings["shuffler_keys"])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_non_finite_model_is_an_error_and_no_checkpoint_is_kept(tmp_path):
    data = load_device_data(f"synthetic:{DEVICES}")
    settings = _settings(tmp_path)
    theta = np.full(data.dimension, np.nan)
    run_devices(FLAGS, data, settings, 1, theta, tmp_path)
    with pytest.raises(NonFiniteResult, match="theta is not finite"):
        shuffle_and_step(FLAGS, data, settings, 1, theta, tmp_path)
    assert not (tmp_path / "checkpoints" / "epoch-0001.npz").exists()

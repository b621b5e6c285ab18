"""``esa train`` end to end: devices -> one shuffler run per instance and epoch -> server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.commandline import main as cli
from simulators.sgd_data import load_device_data
from simulators.sgd_devices import EpochPlan, reference_training

FLAGS = ["--runner=FnApiRunner"]


def test_tiny_training_run_matches_the_numpy_epochs(tmp_path, capsys):
    output = tmp_path / "train"
    argv = ["train", "--dataset", "synthetic:300", "--epochs", "2", "--instances", "2",
            "--epsilon", "2", "--seed", "7", "--crowd-threshold", "20", "--grid", "1,4",
            "--devices-per-shard", "128", "--output", str(output), *FLAGS]  # fmt: skip
    assert cli.main(argv) == 0
    assert "eps_c" in capsys.readouterr().out
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["adds_up"] and len(metrics["epochs"]) == 2
    for row in metrics["epochs"]:
        assert row["reports_used"] == row["messages_read"] == 300 and row["rejected"] == {}
        assert sum(row["released_respondents_per_instance"]) == 300
    so_far = [row["epsilon_central_so_far"] for row in metrics["epochs"]]
    assert so_far[0] < so_far[1] == pytest.approx(metrics["privacy"]["epsilon_central"])
    privacy = metrics["privacy"]
    assert privacy["epsilon_local_epoch"] == 2.0 and privacy["delta"] == 1e-5
    assert privacy["respondents"] == min(
        n for row in metrics["epochs"] for n in row["released_respondents_per_instance"]
    )
    assert [g["epsilon_local_epoch"] for g in metrics["grid"]] == [1.0, 4.0]
    # Shuffling permutes the reports; the sums, hence the model, equal the numpy epochs'.
    data = load_device_data("synthetic:300")
    plan = EpochPlan(1, 2.0, 1.0, data.dimension, instances=2, seed=7, devices_per_shard=128)
    expected = reference_training(data, plan, 2, radius=5.0)
    for epoch, result in enumerate(expected, start=1):
        with np.load(output / "checkpoints" / f"epoch-{epoch:04d}.npz") as stored:
            np.testing.assert_allclose(stored["theta"], result.theta, rtol=0, atol=1e-12)
    with np.load(output / "model.npz") as stored:
        np.testing.assert_allclose(stored["theta"], expected[-1].theta, rtol=0, atol=1e-12)
    for picture in metrics["pictures"]:
        with open(picture, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert len(metrics["pictures"]) == 2
    # Each instance's commit record is signed with its own key (verified before its n is used).
    for instance in (0, 1):
        commit = output / "epochs" / "epoch=0001" / "shuffled" / f"instance={instance}"
        signature = json.loads((commit / "_COMMIT.json").read_text())["signature"]
        key = json.loads(
            (output / "shuffler_keys" / f"{signature['key_id']}.public.json").read_text()
        )
        assert key["shuffler_instance"] == instance
    # A second run into the same output is refused; --overwrite never deletes foreign files.
    assert cli.main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    (output / "notes.txt").write_text("mine")
    assert cli.main([*argv, "--overwrite"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert (output / "notes.txt").exists() and (output / "metrics.json").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--dataset", "mnist"], "unknown dataset"),
        (["--deletion-epsilon", "1"], "go together"),
        (["--grid", "1,x"], "--grid"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, flags, message):
    assert cli.main(["train", "--output", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1

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
        # The shuffler's private files lie outside the folder the server reads.
        epoch = output / "epochs" / "epoch=0001"
        assert sorted(p.name for p in (epoch / "shuffled").iterdir()) == [
            "instance=0",
            "instance=1",
        ]
        assert (epoch / "shuffler-private" / f"instance={instance}" / "metrics.json").exists()
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
        (["--epochs", "0"], "--epochs must be an integer in [1, 1,000], got 0"),
        (["--epochs", "1001"], "--epochs must be an integer in [1, 1,000]"),
        (["--instances", "1000000"], "--instances must be an integer in [1, 1,024]"),
        (["--reports-per-device", "101"], "--reports-per-device must be an integer in [1, 100]"),
        (["--devices-per-shard", "0"], "--devices-per-shard must be an integer in [1, 1,000,000]"),
        (["--crowd-threshold", "0"], "--crowd-threshold must be an integer in [1,"),
        (["--seed", "-1"], "--seed must be an integer in [0, 9,223,372,036,854,775,807], got -1"),
        (["--seed", "9223372036854775808"], "--seed must be an integer in [0,"),
        (["--clip-norm", "1e308"], "--clip-norm must be in [1e-06, 1e+06], got 1e+308"),
        (["--clip-norm", "nan"], "--clip-norm must be in"),
        (["--radius", "0"], "--radius must be in [1e-06, 1e+06]"),
        (["--epsilon", "inf"], "--epsilon must be in (0, 30], got inf"),
        (["--epsilon", "-1"], "--epsilon must be in (0, 30]"),
        (["--delta", "0.5"], "--delta must be in [1e-30, 0.1]"),
        (["--deletion-epsilon", "1e9", "--deletion-delta", "1e-6"], "--deletion-epsilon must"),
        (["--deletion-epsilon", "1", "--deletion-delta", "2"], "--deletion-delta must be in"),
        (["--dataset", "mnist-nope"], "unknown dataset"),
        (["--dataset", "synthetic:20000000"], "N in [1, 10,000,000]"),
        (
            ["--dataset", "synthetic:100", "--instances", "1024", "--devices-per-shard", "1"],
            "102,400 report files per epoch (at most 65,536)",
        ),
        (["--deletion-epsilon", "1"], "go together"),
        (["--grid", "1,x"], "--grid"),
        (["--grid", "1,31"], "--grid values must be in (0, 30]"),
        (["--grid", ",".join(["1"] * 17)], "--grid takes at most 16 values"),
    ],
)
def test_bad_flags_are_one_line_errors_before_any_work(tmp_path, capsys, flags, message):
    output = tmp_path / "o"
    assert cli.main(["train", "--output", str(output), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert err.startswith("esa train: error: ")
    assert not output.exists()  # refused before any work: not a file written


def test_a_nan_in_a_published_figure_is_one_line_exit_1_and_nothing_is_published(
    tmp_path, capsys, monkeypatch
):
    import pipelines.train as train_pipeline

    # A test accuracy that is NaN (as a NaN model would give) must stop the run, not be printed.
    monkeypatch.setattr(train_pipeline, "accuracy", lambda *args: float("nan"))
    output = tmp_path / "train"
    argv = ["train", "--dataset", "synthetic:120", "--epochs", "1", "--seed", "1",
            "--crowd-threshold", "20", "--grid", "none", "--unsealed",
            "--output", str(output), *FLAGS]  # fmt: skip
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err == "esa train: error: epoch 1: accuracy is not finite; stopped\n"
    assert "eps_c" not in captured.out.split("\n", 1)[1]  # no result line after the header
    assert not (output / "metrics.json").exists() and not (output / "model.npz").exists()


def test_the_default_dataset_is_mnist_once_installed_else_digits(tmp_path, monkeypatch):
    from pipelines.train import dataset_defaults
    from simulators import mnist_digits

    monkeypatch.setenv(mnist_digits.CACHE_ENV, str(tmp_path / "empty-cache"))
    settings = dataset_defaults({"dataset": None, "epsilon": None, "epochs": 3, "radius": None,
                                 "learning_rate_scale": None})  # fmt: skip
    assert settings == {"dataset": "digits", "epsilon": 1.9, "epochs": 3, "radius": 5.0,
                        "learning_rate_scale": 1.0}  # fmt: skip
    # With the digits in the cache (a copy of the installed file), mnist and its defaults.
    monkeypatch.undo()
    installed = mnist_digits.digits_file()
    if not mnist_digits.installed():
        pytest.skip(f"MNIST digits not installed in {mnist_digits.cache_dir()} (make mnist)")
    cache = tmp_path / "cache"
    (cache / "mnist-1.1.0").mkdir(parents=True)
    (cache / "mnist-1.1.0" / "digits.npz").write_bytes(installed.read_bytes())
    monkeypatch.setenv(mnist_digits.CACHE_ENV, str(cache))
    settings = dataset_defaults({"dataset": None, "epsilon": 2.5})
    assert settings == {"dataset": "mnist", "epsilon": 2.5, "epochs": 40, "radius": 20.0,
                        "learning_rate_scale": 0.2}  # fmt: skip


def test_a_tiny_mnist_training_through_the_shufflers(tmp_path, capsys):
    from simulators import mnist_digits

    if not mnist_digits.installed():
        pytest.skip(f"MNIST digits not installed in {mnist_digits.cache_dir()} (make mnist)")
    output = tmp_path / "train"
    argv = ["train", "--dataset", "mnist:300", "--epochs", "2", "--seed", "3", "--grid", "none",
            "--crowd-threshold", "20", "--output", str(output), *FLAGS]  # fmt: skip
    assert cli.main(argv) == 0
    assert "MNIST (npm mnist@1.1.0" in capsys.readouterr().out
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["dimension"] == 500 and metrics["devices"] == 300
    assert metrics["settings"]["learning_rate_scale"] == 0.2  # the mnist defaults
    assert [row["reports_used"] for row in metrics["epochs"]] == [300, 300]
    assert metrics["privacy"]["respondents"] == 300 and metrics["adds_up"]


def test_a_crowd_below_the_threshold_releases_nothing_and_costs_no_privacy(tmp_path):
    output = tmp_path / "train"
    argv = ["train", "--dataset", "synthetic:50", "--crowd-threshold", "100", "--epochs", "1",
            "--grid", "none", "--unsealed", "--seed", "2", "--output", str(output), *FLAGS]  # fmt: skip
    assert cli.main(argv) == 0
    metrics = json.loads((output / "metrics.json").read_text())
    (row,) = metrics["epochs"]
    assert row["released_respondents_per_instance"] == [0] and row["reports_used"] == 0
    assert metrics["privacy"]["epsilon_central"] == 0.0 and metrics["privacy"]["respondents"] == 0
    with np.load(output / "model.npz") as stored:
        assert not stored["theta"].any()  # theta_0: no report left a shuffler

"""Devices per second for one LDP-SGD epoch, next to the plain numpy epoch in the same run.

Rows (MNIST devices, ``mnist:N``, d = 500, when ``make mnist`` has installed the digits, else
synthetic devices, d = 650; one shuffler instance, FnApiRunner, pipeline start-ups included):

* ``ldp_sgd_epoch``: one epoch of ``esa train`` (devices' Beam pipeline writing Report files,
  the shuffler run, the server's Beam pipeline and its update) against
  ``simulators.sgd_devices.reference_epoch`` (the same devices, randomizer and Algorithm 5 step in
  numpy, no files, no shuffler) timed in the same child process.
* ``ldp_sgd_epoch_memory``: peak resident memory of that child at the largest size against the
  smallest: flat in the number of devices means a ratio near 1 (shards, read batches and
  direction blocks have fixed sizes).

Each size runs in a fresh interpreter so that its peak memory is its own.
"""

from __future__ import annotations

from benchmarks.common import run_child

CHILD = """
import json, sys, tempfile, time
from pathlib import Path
import numpy as np
from benchmarks.common import peak_rss_mb
from pipelines.train import run_epoch
from simulators.sgd_data import load_device_data
from simulators.sgd_devices import EpochPlan, reference_epoch

devices, family = json.loads(sys.argv[1])
spec = f"{family}:{devices}"
data = load_device_data(spec)
settings = {"dataset": spec, "data_seed": 0, "epsilon": 1.9, "clip_norm": 1.0, "radius": 5.0,
            "instances": 1, "reports_per_device": 1, "seed": 1, "devices_per_shard": 5000,
            "crowd_threshold": 100, "deletion_epsilon": None, "deletion_delta": None,
            "learning_rate_scale": 1.0}
theta = np.zeros(data.dimension)
with tempfile.TemporaryDirectory() as scratch:
    started = time.perf_counter()
    beam_theta, info = run_epoch(["--runner=FnApiRunner"], data, settings, 1, theta, Path(scratch))
    beam_seconds = time.perf_counter() - started
plan = EpochPlan(1, 1.9, 1.0, data.dimension, seed=1, devices_per_shard=5000)
started = time.perf_counter()
reference = reference_epoch(data, plan, theta, 5.0)
numpy_seconds = time.perf_counter() - started
assert info["reports"] == devices and np.allclose(beam_theta, reference.theta, atol=1e-12)
print(json.dumps({"beam_seconds": beam_seconds, "numpy_seconds": numpy_seconds,
                  "peak_mb": peak_rss_mb()}))
"""


def run(quick: bool) -> list[dict]:
    from simulators.mnist_digits import installed

    if installed():  # the sizes: 2,000 and 8,000 real devices
        family, sizes, what = "mnist", (2_000, 8_000), "MNIST devices, d = 500"
    else:
        family = "synthetic"
        sizes, what = (5_000, 20_000) if quick else (20_000, 100_000), "synthetic devices, d = 650"
    results = {devices: run_child(CHILD, [devices, family]) for devices in sizes}
    rows = []
    for devices, result in results.items():
        beam_rate = devices / result["beam_seconds"]
        numpy_rate = devices / result["numpy_seconds"]
        rows.append(
            {
                "benchmark": "ldp_sgd_epoch",
                "metric": "devices_per_s",
                "value": beam_rate,
                "baseline": numpy_rate,
                "ratio": beam_rate / numpy_rate,
                "note": f"{devices} {what}, K = 1: devices + shuffle + server "
                "pipelines (FnApiRunner, start-ups included) vs the numpy epoch, same run",
            }
        )
    small, large = results[sizes[0]], results[sizes[-1]]
    rows.append(
        {
            "benchmark": "ldp_sgd_epoch_memory",
            "metric": "peak_rss_mb",
            "value": large["peak_mb"],
            "baseline": small["peak_mb"],
            "ratio": large["peak_mb"] / small["peak_mb"],
            "note": f"peak RSS of one epoch at {sizes[-1]} devices vs {sizes[0]} devices "
            f"({sizes[-1] // sizes[0]}x the devices)",
        }
    )
    return rows

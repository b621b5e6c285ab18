"""The small end-to-end pipeline on each engine, beside DirectRunner's in-process FnApiRunner.

``esa run`` (simulate -> 2 shuffler instances one after the other -> analyze) with the same
recipe, population and seed on each engine, each run in its own child process: FnApiRunner (the
baseline, the project's default DirectRunner mode), Prism through PrismRunner, and Flink through
FlinkRunner with the job server ``make engines`` installed, on its embedded cluster and on a
standalone cluster (JobManager + TaskManager with 2 slots, pipelines/engines/flink_cluster.py). Rows:
the whole run's seconds and the shuffle stage's throughput (messages read per second; the
shuffle's time includes each pipeline's start-up, which dominates at these sizes).

Flink's shuffle throughput is also measured with 2 task slots (``--parallelism=2``) against 1.
An engine that is not installed gives a row saying why instead of a number.

Full mode: 30,000 respondents (about 170,000 data messages), best of 2 runs; quick mode: 3,000
respondents (about 17,000), 1 run. Sizes stay small: these are the engines' fixed costs
on two cores, not their scaling.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from benchmarks.common import run_child
from pipelines.engines import runners
from pipelines.engines.flink_cluster import FlinkCluster

RECIPE = {
    "name": "bench_engines",
    "version": 1,
    "channel": "bench_engines",
    "randomizer": "one_hot_rappor",
    "randomizer_params": {"domain_size": 256, "epsilon": 4.0},
    "fragmentation": "attribute",
    "epsilon_local": 4.0,
    "epsilon_central_target": 4.0,
    "delta": 1e-6,
    "min_crowd_size": 500,
    "query_class": "bench",
    "data_fields": ["value"],
    "shuffler_instances": 2,
    "window": "1d",
}

_RUN = """
import io, json, sys, time
from contextlib import redirect_stdout
from pipelines.commandline import main as cli
arguments = json.loads(sys.argv[1])
started = time.perf_counter()
with redirect_stdout(io.StringIO()):
    code = cli.main(arguments["argv"])
wall = time.perf_counter() - started
run = json.loads(open(arguments["run_json"]).read())
print(json.dumps({"code": code, "wall": wall, "seconds": run["seconds"],
                  "messages": run["messages"], "adds_up": run["adds_up"]}))
"""


def _esa_run(work: Path, engine: str, respondents: int, extra: list[str], master: str) -> dict:
    flags = runners.runner_flags(engine, master=master)
    recipe = work / "recipe.json"
    recipe.write_text(json.dumps(RECIPE))
    output = work / f"run-{engine}"
    argv = ["run", "--output", str(output), "--overwrite", "--recipe", str(recipe),
            "--population", "uniform", "--respondents", str(respondents), "--seed", "7",
            "--parallel-shuffles", "1", *flags, *extra]  # fmt: skip
    result = run_child(_RUN, {"argv": argv, "run_json": str(output / "run.json")})
    if result["code"] != 0 or not result["adds_up"]:
        raise RuntimeError(f"esa run on {engine} failed: {result}")
    return result


def _best(work: Path, engine: str, respondents: int, repeats: int, extra: list[str],
          master: str = "[local]") -> dict:  # fmt: skip
    runs = [_esa_run(work, engine, respondents, extra, master) for _ in range(repeats)]
    return min(runs, key=lambda run: run["wall"])


def _missing(engine: str) -> str | None:
    if engine == "flink_cluster" and runners.flink_cluster_lib() is None:
        return "no assembled Flink jars for a standalone cluster (make engines)"
    try:
        runners.runner_flags("flink" if engine == "flink_cluster" else engine)
    except FileNotFoundError as missing:
        return str(missing)
    return None


def run(quick: bool) -> list[dict]:
    respondents = 3_000 if quick else 30_000
    repeats = 1 if quick else 2
    work = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    rows: list[dict] = []
    try:
        baseline = _best(work, "fnapi", respondents, repeats, [])
        size = f"{respondents:,} respondents, {baseline['messages']:,} messages, best of {repeats}"
        rows.append(
            {
                "benchmark": "engines",
                "metric": "fnapi_end_to_end_s",
                "value": baseline["wall"],
                "note": f"esa run on FnApiRunner (the baseline); {size}; stages {baseline['seconds']}",
            }
        )
        results = {"fnapi": baseline}
        for engine in ("prism", "flink", "flink_cluster"):
            missing = _missing(engine)
            if missing:
                rows.append({"benchmark": "engines", "metric": f"{engine}_end_to_end_s",
                             "note": f"not measured: {missing}"})  # fmt: skip
                continue
            if engine == "flink_cluster":
                with FlinkCluster(runners.flink_cluster_lib(), slots=2) as cluster:
                    results[engine] = result = _best(
                        work, engine, respondents, repeats, [], cluster.master
                    )
            else:
                results[engine] = result = _best(work, engine, respondents, repeats, [])
            rows.append(
                {
                    "benchmark": "engines",
                    "metric": f"{engine}_end_to_end_s",
                    "value": result["wall"],
                    "baseline": baseline["wall"],
                    "ratio": result["wall"] / baseline["wall"],
                    "note": f"esa run on {engine}; {size}; stages {result['seconds']}",
                }
            )
        for engine, result in results.items():
            rate = result["messages"] / result["seconds"]["shuffle"]
            rows.append(
                {
                    "benchmark": "engines",
                    "metric": f"{engine}_shuffle_messages_per_s",
                    "value": rate,
                    "baseline": baseline["messages"] / baseline["seconds"]["shuffle"],
                    "ratio": rate / (baseline["messages"] / baseline["seconds"]["shuffle"]),
                    "note": "2 instances one after the other, start-up included",
                }
            )
        rows.append(_flink_slots(work, respondents, repeats))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _flink_slots(work: Path, respondents: int, repeats: int) -> dict:
    """Flink's shuffle throughput with 2 task slots against 1 (same run, same data)."""
    missing = _missing("flink")
    if missing:
        return {"benchmark": "engines", "metric": "flink_shuffle_2_slots_vs_1",
                "note": f"not measured: {missing}"}  # fmt: skip
    rates = {}
    for slots in (1, 2):
        result = _best(work, "flink", respondents, repeats, [f"--parallelism={slots}"])
        rates[slots] = result["messages"] / result["seconds"]["shuffle"]
    return {
        "benchmark": "engines",
        "metric": "flink_shuffle_2_slots_messages_per_s",
        "value": rates[2],
        "baseline": rates[1],
        "ratio": rates[2] / rates[1],
        "note": "embedded Flink cluster, --parallelism 2 vs 1 (baseline)",
    }

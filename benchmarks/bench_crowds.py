"""Many small crowds through shuffle + analyze: peak memory at 10x the crowds (issue: no
whole-dataset gathers).

Report files are generated for ``crowds`` crowds = 2 channels (recipes) x windows x crowd IDs,
3 respondents each (one-hot RAPPOR over 4 values, ε_ℓ = 3; crowd threshold 2), then, each in its
own child process so that peak memory (``VmHWM``, ``benchmarks/common.py``) is its own:
``esa shuffle`` (FnApiRunner) and ``esa analyze`` over its release (FnApiRunner, no pictures).
The same is done at a tenth of the crowds in the same run; the rows give the peak RSS at the
larger size against the smaller (ratio ~1: memory flat in the number of crowds) and crowds/s.

Full mode: 100,000 vs 10,000 crowds; quick mode: 10,000 vs 1,000. ``peak_rss_kb_per_crowd`` is
the growth of peak RSS per added crowd between the two sizes. ``crowds_analyze`` /
``crowds_per_s`` is the crowds the analysis reported over the seconds ``esa analyze`` ran at the
larger size given no runner flags, as a user runs it (target: :data:`ANALYZE_CROWDS_PER_S` at
100,000 crowds, full mode): from 20,000 crowds it spreads them over worker processes
(``pipelines/analyze.py: worker_processes``), so this third analysis runs just after the
one-process one, whose rate is the row's baseline (the memory rows stay one process's).
``crowds_command`` times ``esa analyze`` at the larger size as a user runs it, in a fresh
process with its pictures, report and summary table, against that third analysis.
``crowds_estimate`` times the estimates alone (``EstimateBucket`` in this process, buckets of
:data:`BUCKET_CROWDS` crowds of the same recipes): the histogram crowds of a recipe de-biased
together as rows against the same buckets one crowd at a time (``crowd_at_a_time``).
``crowds_sizes`` times ``esa analyze`` given no runner flags of :data:`SIZES_CROWDS` crowds
whose respondents are drawn lognormal (:func:`crowd_sizes`: hundreds of distinct sizes, as
telemetry's crowds come) against as many crowds of one size: each distinct size has a privacy
report of its own to evaluate (root searches of milliseconds, once per size, spread over the
workers: ``transforms.analyzer.analyze.EvaluateCrowdSizes``). The ``crowds_flink_*`` rows run
the same stages on a standalone Flink cluster (``make engines``) at 10,000 vs 1,000 crowds in
both modes, with the peak RSS of the Python process (driver and LOOPBACK worker), the
TaskManager and the JobManager.

Why memory used to grow with the crowds on FnApiRunner (measured by instrumenting its data
buffers per stage, and with memray at the peak): a grouping's input is held decoded (Python
objects) and its output encoded until the consuming stage ran, and RSS never shrinks, so whatever
crosses a grouping per crowd counts with its copies. Both stages therefore work in crowd buckets
(``schemas/release/crowd_buckets.py``): the shuffler's unit is the bucket of a window and instance
(``--crowd-buckets``, 16 by default; one spill piece per bucket and batch, one message file per
group of a bucket, one crowd table per bucket, release format ``esa-release/2``), the analyzer's
the bucket of a kind and window (its accumulators, estimates and output rows cross groupings as
one compressed blob per bucket). What crosses a grouping per crowd is a few bytes inside such a
blob; the drivers hold one commit entry per file, never one per crowd.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.common import peak_rss_mb, run_child
from benchmarks.stage_log import describe
from pipelines.engines import runners
from pipelines.engines.flink_cluster import FlinkCluster
from schemas import SCHEMA_VERSION, schema_json
from schemas.avro.container import encode_container
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import encode_message_batch
from schemas.recipes import load_recipe
from transforms.analyzer import arithmetic
from transforms.analyzer.analyze import AnalysisConfig, EstimateBucket

DAY_MS = 86_400_000
# The analyze stage's target at 100,000 crowds (full mode): crowds reported per second.
ANALYZE_CROWDS_PER_S = 30_000
# Crowds per bucket in crowds_estimate: what a bucket of one window holds at 100,000 crowds
# (arithmetic.analyzer_buckets gives 100 buckets over the 10 windows).
BUCKET_CROWDS = 100
T0 = 1_704_067_200_000
CHANNELS = 2
WINDOWS = 10
RESPONDENTS_PER_CROWD = 3
ROWS_PER_FILE = 200_000
# The crowds_sizes row: crowds of many sizes (crowd_sizes), in full mode (a tenth in quick).
SIZES_CROWDS = 20_000
SIZES_MEDIAN = 8
SIZES_SIGMA = 1.2

_STAGES = """
import json, sys, time
from benchmarks.common import peak_rss_mb
from apache_beam.options.pipeline_options import PipelineOptions
from benchmarks.stage_log import record_stages, stage_summary
from pipelines import analyze, shuffle
from pipelines.commandline.flags import worker_processes_of
a = json.loads(sys.argv[1])
record_stages()
start = time.perf_counter()
if a["stage"] == "shuffle":
    summary = shuffle.run(PipelineOptions(
        a["flags"], input=a["input"], output=a["output"], instance=0,
        recipe=a["recipes"], crowd_threshold=2, messages_per_file=10000))
    result = {"records": summary["read"], "adds_up": summary["adds_up"],
              "crowds": summary["crowds_released"]}
else:
    options = PipelineOptions(
        a["flags"], analyze_input=[a["input"]], analyze_output=a["output"],
        analyze_recipe=a["recipes"], analyze_no_pictures=True)
    summary = analyze.run(options)
    result = {"records": summary["metrics"]["read"], "adds_up": summary["metrics"]["adds_up"],
              "crowds": summary["reports"]["histograms"], "workers": worker_processes_of(options)}
seconds = time.perf_counter() - start
result.update(seconds=seconds, peak_rss_mb=peak_rss_mb(), stage_log=stage_summary(seconds))
print(json.dumps(result))
"""


def _recipes(directory: Path) -> list[str]:
    paths = []
    for channel in range(CHANNELS):
        recipe = {
            "name": f"crowds{channel}",
            "version": 1,
            "channel": f"crowds{channel}",
            "randomizer": "one_hot_rappor",
            "randomizer_params": {"domain_size": 4, "epsilon": 3.0},
            "fragmentation": "attribute",
            "epsilon_local": 3.0,
            "epsilon_central_target": 3.0,
            "delta": 1e-6,
            "min_crowd_size": 2,
            "query_class": "benchmark",
            "data_fields": ["value"],
            "shuffler_instances": 1,
            "window": "1d",
        }
        path = directory / f"crowds{channel}.json"
        path.write_text(json.dumps(recipe))
        paths.append(str(path))
    return paths


def generate(
    directory: Path, crowds: int, seed: int = 0, sizes: np.ndarray | None = None
) -> list[str]:
    """Report files of ``crowds`` crowds (channels x windows x crowd IDs), rows in random order;
    :data:`RESPONDENTS_PER_CROWD` respondents each, or ``sizes[i]`` in crowd i."""
    directory.mkdir(parents=True, exist_ok=True)
    recipe_paths = _recipes(directory)
    recipes = [load_recipe(path) for path in recipe_paths]
    rng = np.random.default_rng(seed)
    if sizes is None:
        sizes = np.full(crowds, RESPONDENTS_PER_CROWD, dtype=np.int64)
    crowd = np.repeat(np.arange(crowds), sizes)
    respondents = crowd.size
    channel = crowd % CHANNELS
    window = (crowd // CHANNELS) % WINDOWS
    crowd_id = crowd // (CHANNELS * WINDOWS)
    randomizer = recipes[0].build_randomizer()
    messages = randomizer.randomize(rng.integers(0, 4, size=respondents), rng)
    payloads = encode_message_batch(messages, recipes[0].payload_kind).to_arrow()
    who = messages.respondent
    order = rng.permutation(who.size)
    payloads, who = payloads.take(pa.array(order)), who[order]
    crcs = crc32c_many(payloads).astype(np.int64)
    names = np.array([r.channel for r in recipes], dtype=object)
    ids = np.array([r.id for r in recipes], dtype=object)
    paths = []
    for index, start in enumerate(range(0, who.size, ROWS_PER_FILE)):
        rows = who[start : start + ROWS_PER_FILE]
        columns = {
            "schema_version": SCHEMA_VERSION,
            "shuffler_instance": 0,
            "channel": pa.array(names[channel[rows]], pa.string()),
            "recipe_id": pa.array(ids[channel[rows]], pa.string()),
            "crowd_id": pa.array([f"c{c:06d}" for c in crowd_id[rows]], pa.string()),
            "min_crowd_size": 2,
            "origin": pa.array([f"device-{r:09d}" for r in rows], pa.string()),
            "event_time": T0 + window[rows] * DAY_MS + rng.integers(0, DAY_MS, size=rows.size),
            "payload": payloads.slice(start, rows.size),
            "payload_crc32c": crcs[start : start + rows.size],
        }
        path = directory / f"reports-{index:03d}.avro"
        path.write_bytes(encode_container(schema_json("report"), columns, rows.size, "deflate"))
        paths.append(str(path))
    return recipe_paths


FNAPI = ["--runner=FnApiRunner"]


def _stage(stage: dict, engine: str) -> dict:
    """One stage in a child process: ``fnapi`` in that process (FnApiRunner), ``default`` on
    the runner the command picks given no runner flags (``esa analyze`` spreads many crowds
    over worker processes, ``pipelines/analyze.py: worker_processes``); on ``flink_cluster`` on
    a fresh standalone cluster, with the JobManager's and TaskManager's peak RSS beside the
    Python process's (driver + LOOPBACK worker)."""
    if engine in ("fnapi", "default"):
        return run_child(_STAGES, {**stage, "flags": FNAPI if engine == "fnapi" else []})
    with FlinkCluster(runners.flink_cluster_lib(), slots=2) as cluster:
        flags = runners.runner_flags("flink_cluster", master=cluster.master)
        result = run_child(_STAGES, {**stage, "flags": flags})
        jobmanager, taskmanager = (process.pid for process in cluster.processes)
        result.update(
            jobmanager_mb=peak_rss_mb(jobmanager), taskmanager_mb=peak_rss_mb(taskmanager)
        )
    return result


def shuffled_release(
    work: Path, crowds: int, engine: str = "fnapi", sizes: np.ndarray | None = None
) -> tuple[list[str], dict]:
    """Report files of ``crowds`` crowds under ``work/reports`` (:func:`generate`), shuffled on
    ``engine`` (:func:`_stage`) into ``work/shuffled``: the recipes' paths and the shuffle's
    child result."""
    recipes = generate(work / "reports", crowds, sizes=sizes)
    shuffled = _stage(
        {"stage": "shuffle", "input": str(work / "reports" / "*.avro"),
         "output": str(work / "shuffled"), "recipes": recipes},
        engine,
    )  # fmt: skip
    return recipes, shuffled


def measure(
    work: Path,
    crowds: int,
    engine: str = "fnapi",
    default_too: bool = False,
    sizes: np.ndarray | None = None,
) -> dict[str, dict]:
    """Generate (``sizes``: respondents per crowd, :func:`generate`), shuffle and analyze
    ``crowds`` crowds; each stage's child result (and with ``default_too``,
    ``analyze_default``: the same analysis on the runner ``esa analyze`` picks given no runner
    flags, run just after)."""
    recipes, shuffled = shuffled_release(work, crowds, engine, sizes)
    analysis = {"stage": "analyze", "input": str(work / "shuffled"), "recipes": recipes}
    results = {
        "shuffle": shuffled,
        "analyze": _stage({**analysis, "output": str(work / "analysis")}, engine),
    }
    if default_too:
        output = str(work / "analysis-default")
        results["analyze_default"] = _stage({**analysis, "output": output}, "default")
        results["analyze_command"] = analyze_command(
            work / "shuffled", work / "analysis-command", recipes
        )
    return results


def analyze_command(release: Path, output: Path, recipes: list[str]) -> dict:
    """``esa analyze`` as a user runs it, given no flags but its input, output and recipes:
    a fresh process (imports, the verifying pass, the analysis, the pictures, report.html,
    the summary table, the process's end), timed from outside; the pictures it drew."""
    command = [sys.executable, "-m", "pipelines.commandline.main", "analyze",
               "--input", str(release), "--output", str(output)]  # fmt: skip
    for recipe in recipes:
        command += ["--recipe", recipe]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"esa analyze failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"seconds": seconds, "pictures": len(list((output / "pictures").glob("*.png")))}


def command_row(command: dict, default: dict) -> dict:
    """``crowds_command`` seconds: :func:`analyze_command` against the same analysis run
    given no runner flags inside a process that had imported everything, without pictures
    (``default``, the ``crowds_analyze`` row's run): what the command adds around it."""
    note = (
        f"esa analyze of {default['crowds']:,} crowds as a user runs it (a fresh process, "
        f"{command['pictures']} pictures, report.html, the summary table) in "
        f"{command['seconds']:.1f} s against {default['seconds']:.1f} s for the analysis alone "
        "(no pictures, imports done; baseline)"
    )
    return {
        "benchmark": "crowds_command",
        "metric": "wall_s",
        "value": command["seconds"],
        "baseline": default["seconds"],
        "ratio": command["seconds"] / default["seconds"],
        "note": note,
    }


def kb_per_crowd(big: dict, little: dict) -> float:
    """Peak RSS added per crowd between two runs (KB, 1 KB = 1,024 bytes)."""
    added = big["crowds"] - little["crowds"]
    return (big["peak_rss_mb"] - little["peak_rss_mb"]) * 1024 / added if added else 0.0


def run(quick: bool) -> list[dict]:
    large = 10_000 if quick else 100_000
    small = large // 10
    work = Path(tempfile.mkdtemp(prefix="bench-crowds-"))
    try:
        results = {
            size: measure(work / str(size), size, default_too=size == large)
            for size in (small, large)
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = _flink_rows()
    for stage in ("shuffle", "analyze"):
        big, little = results[large][stage], results[small][stage]
        note = (
            f"{big['crowds']:,} crowds ({big['records']:,} messages) vs {little['crowds']:,}; "
            f"{CHANNELS} channels x {WINDOWS} windows x crowd IDs, {RESPONDENTS_PER_CROWD} "
            f"respondents each; FnApiRunner; adds up: {big['adds_up'] and little['adds_up']}"
        )
        rows.append(
            {
                "benchmark": f"crowds_{stage}",
                "metric": "peak_rss_mb",
                "value": big["peak_rss_mb"],
                "baseline": little["peak_rss_mb"],
                "ratio": big["peak_rss_mb"] / little["peak_rss_mb"],
                "note": "baseline: the same at a tenth of the crowds (ratio ~1 = flat); " + note,
            }
        )
        rows.append(
            {
                "benchmark": f"crowds_{stage}",
                "metric": "peak_rss_kb_per_crowd",
                "value": kb_per_crowd(big, little),
                "baseline": None,
                "ratio": None,
                "note": "growth of peak RSS from the smaller run to the larger, per added crowd",
            }
        )
        if stage == "analyze":
            default = results[large]["analyze_default"]
            rows.append(analyze_rate_row(default, big, little))
            rows.append(command_row(results[large]["analyze_command"], default))
            continue
        note = (
            f"{big['seconds']:.1f} s vs {little['seconds']:.1f} s; baseline: a tenth of the crowds"
        )
        rows.append(_rate_row(f"crowds_{stage}", big, little, note))
    rows.append(estimate_row(large))
    rows.append(sizes_row(SIZES_CROWDS // (10 if quick else 1)))
    return rows


def _rate_row(benchmark: str, run: dict, baseline: dict, note: str, tail: str = "") -> dict:
    """A crowds/s row: ``run``'s crowds over its seconds against ``baseline``'s, the note
    followed by ``run``'s slowest stages and ``tail``."""
    rate, baseline_rate = (r["crowds"] / r["seconds"] for r in (run, baseline))
    if stages := describe(run.get("stage_log")):
        note += f"; {stages}"
    return {
        "benchmark": benchmark,
        "metric": "crowds_per_s",
        "value": rate,
        "baseline": baseline_rate,
        "ratio": rate / baseline_rate,
        "note": note + tail,
    }


def crowd_sizes(crowds: int, seed: int = 0) -> np.ndarray:
    """Respondents per crowd as telemetry's crowds come (a few large, many small): lognormal with
    median :data:`SIZES_MEDIAN` and sigma :data:`SIZES_SIGMA`, at least
    :data:`RESPONDENTS_PER_CROWD`."""
    rng = np.random.default_rng(seed)
    drawn = np.round(rng.lognormal(np.log(SIZES_MEDIAN), SIZES_SIGMA, size=crowds))
    return np.maximum(drawn, RESPONDENTS_PER_CROWD).astype(np.int64)


def sizes_row(crowds: int) -> dict:
    """``crowds_sizes`` crowds/s: ``esa analyze`` given no runner flags of ``crowds`` crowds of
    many sizes (:func:`crowd_sizes`) against as many crowds of :data:`RESPONDENTS_PER_CROWD`
    respondents each. Each distinct size's privacy report costs root searches of milliseconds
    (``privacy.accounting.amplify``, evaluated once per size: ``EvaluateCrowdSizes``), which the
    crowds of one size share: the row shows what many sizes cost beside the messages they
    bring."""
    sizes = crowd_sizes(crowds)
    work = Path(tempfile.mkdtemp(prefix="bench-crowds-"))
    try:
        uniform = measure(work / "uniform", crowds, engine="default")["analyze"]
        varied = measure(work / "sizes", crowds, engine="default", sizes=sizes)["analyze"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    note = (
        f"{varied['crowds']:,} crowds of {np.unique(sizes).size:,} distinct sizes "
        f"({varied['records']:,} messages; lognormal, median {SIZES_MEDIAN}) in "
        f"{varied['seconds']:.1f} s vs {uniform['crowds']:,} of {RESPONDENTS_PER_CROWD} "
        f"respondents ({uniform['records']:,} messages) in {uniform['seconds']:.1f} s; esa "
        f"analyze given no runner flags ({varied.get('workers', 1)} worker processes); "
        "baseline: the crowds of one size"
    )
    return _rate_row("crowds_sizes", varied, uniform, note)


def analyze_rate_row(default: dict, one: dict, tenth: dict) -> dict:
    """``crowds_analyze`` crowds/s: ``esa analyze`` as run given no runner flags (``default``:
    at 100,000 crowds it spreads them over worker processes, one per 10,000 crowds up to one
    per CPU) against the same analysis in one process (``one``, FnApiRunner, whose peak RSS
    the memory rows give), with the one process's seconds at a tenth of the crowds."""
    rate = default["crowds"] / default["seconds"]
    workers = default.get("workers", 1)
    note = (
        f"{default['seconds']:.1f} s on {workers} worker process{'es' if workers > 1 else ''} "
        f"(esa analyze given no runner flags) vs {one['seconds']:.1f} s in one process "
        f"(FnApiRunner; {tenth['seconds']:.1f} s at a tenth of the crowds); baseline: one "
        "process"
    )
    target = f"; target >= {ANALYZE_CROWDS_PER_S:,} crowds/s at 100,000 crowds (full mode)"
    if default["crowds"] >= 90_000:
        target += ": met" if rate >= ANALYZE_CROWDS_PER_S else ": not met"
    return _rate_row("crowds_analyze", default, one, note, target)


def _estimate_buckets(recipe_paths: list[str], crowds: int, seed: int = 0) -> list:
    """(bucket key, CrowdBucket) elements of ``crowds`` crowds as the analyzer meets them in this
    benchmark: :data:`BUCKET_CROWDS` crowds of one window per bucket, both recipes, 3 respondents
    and ~5 messages each."""
    recipes = [load_recipe(path) for path in recipe_paths]
    rng = np.random.default_rng(seed)
    elements = []
    for first in range(0, crowds, BUCKET_CROWDS):
        window = (first // BUCKET_CROWDS) % WINDOWS
        start = T0 + window * DAY_MS
        members = {}
        for index in range(first, min(crowds, first + BUCKET_CROWDS)):
            recipe = recipes[index % CHANNELS]
            key = (arithmetic.HISTOGRAM, start, start + DAY_MS, recipe.channel, recipe.id,
                   f"c{index:06d}")  # fmt: skip
            accumulator = arithmetic.CrowdAccumulator.empty(4)
            accumulator.add_messages(rng.integers(0, 4, size=5))
            accumulator.set_respondents(0, RESPONDENTS_PER_CROWD)
            members[key] = accumulator
        unit = (arithmetic.HISTOGRAM, start, start + DAY_MS, first // BUCKET_CROWDS)
        elements.append((unit, arithmetic.CrowdBucket(members).pack()))
    return elements


def estimate_row(crowds: int) -> dict:
    """``crowds_estimate``: EstimateBucket over ``crowds`` crowds as rows against the same
    buckets one crowd at a time (at most 5,000 crowds of them: the slow reference)."""
    work = Path(tempfile.mkdtemp(prefix="bench-crowds-estimate-"))
    try:
        paths = _recipes(work)
        book = arithmetic.RecipeBook([load_recipe(path) for path in paths])
        blobs = pickle.dumps(_estimate_buckets(paths, crowds))
        reference = pickle.dumps(_estimate_buckets(paths, min(crowds, 5_000)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rates = {}
    for name, data, at_a_time in (("rows", blobs, False), ("one", reference, True)):
        estimate = EstimateBucket(AnalysisConfig(book), crowd_at_a_time=at_a_time)
        estimate.setup()
        elements = pickle.loads(data)
        for _ in estimate.process(elements[0]):  # the privacy report is made once, untimed
            pass
        elements = pickle.loads(data)
        start = time.perf_counter()
        counted = 0
        for element in elements:
            for output in estimate.process(element):
                if isinstance(output, dict):
                    counted += output.get("histograms", 0)
        rates[name] = (counted / (time.perf_counter() - start), counted)
    return {
        "benchmark": "crowds_estimate",
        "metric": "crowds_per_s",
        "value": rates["rows"][0],
        "baseline": rates["one"][0],
        "ratio": rates["rows"][0] / rates["one"][0],
        "note": f"EstimateBucket in-process over {rates['rows'][1]:,} crowds in buckets of "
        f"{BUCKET_CROWDS} (rows of one recipe de-biased together) vs {rates['one'][1]:,} crowds "
        "one at a time (crowd_at_a_time); bucket unpacking included",
    }


def _flink_rows() -> list[dict]:
    """The same on a standalone Flink cluster at 1,000 vs 10,000 crowds (both modes: Flink's job
    submission makes each stage slow); a row per process whose peak RSS was measured."""
    if runners.flink_cluster_lib() is None:
        return [{"benchmark": "crowds_flink", "metric": "peak_rss_mb",
                 "note": "not measured: no assembled Flink jars (make engines)"}]  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bench-crowds-flink-"))
    try:
        results = {
            size: measure(work / str(size), size, "flink_cluster") for size in (1_000, 10_000)
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for stage in ("shuffle", "analyze"):
        big, little = results[10_000][stage], results[1_000][stage]
        for process, key in (("python", "peak_rss_mb"), ("taskmanager", "taskmanager_mb"),
                             ("jobmanager", "jobmanager_mb")):  # fmt: skip
            rows.append(
                {
                    "benchmark": f"crowds_flink_{stage}",
                    "metric": f"{process}_peak_rss_mb",
                    "value": big[key],
                    "baseline": little[key],
                    "ratio": big[key] / little[key],
                    "note": f"standalone Flink cluster, {big['crowds']:,} vs {little['crowds']:,} "
                    f"crowds; {big['seconds']:.0f} s vs {little['seconds']:.0f} s; adds up: "
                    f"{big['adds_up'] and little['adds_up']}",
                }
            )
    return rows


if __name__ == "__main__":
    print(json.dumps(run("--full" not in sys.argv), indent=2))

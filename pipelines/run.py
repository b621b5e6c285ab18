"""``esa run``: the whole product on one machine: simulated devices -> K shufflers -> analyzer.

    esa run [--output results] [--recipe image_grid_sealed] [--population image:horse]
        [--respondents N] [--instances K] [--seed S] [--deletion-epsilon E --deletion-delta D]
        [--parallel-shuffles P] [Beam runner flags, passed to every stage]

Steps (each a Beam pipeline on the same runner flags):

1. ``esa simulate``: the fleet writes ``OUTPUT/simulation/instance=<u>/reports-*.avro`` with the
   truth (``truth.parquet``); given no runner flags, a fleet of 200,000 messages or more is
   simulated on the multi-process DirectRunner, one shard and worker per CPU, its workers (and
   the analyze stage's) forked from one process that imported what they run while this one
   prepared (``pipelines/engines/forked_workers.py``);
2. ``esa shuffle --instance u --signing-key`` for each of the K instances, on that instance's
   reports only: ``OUTPUT/releases/instance=<u>/`` (its own release, its commit record signed
   with instance u's throwaway Ed25519 key from ``OUTPUT/shuffler_keys``), and its private
   outputs (dead letters with origins, manifests, metrics) in ``OUTPUT/shuffler-<u>/private/``,
   outside the folder the analyzer is given. The K runs are independent (as in a
   deployment, where each instance sits in its own trust domain), so up to ``--parallel-shuffles``
   of them run at once, each in its own process (by default: one after the other in this process
   while each instance has under 500,000 messages, where a process's start-up costs more than
   it saves; else one per CPU);
3. ``esa analyze --input OUTPUT/releases --shuffler-keys OUTPUT/shuffler_keys`` over the K releases (each commit record
   must carry its instance's valid signature) with the simulation's truth: ``OUTPUT/analysis/``
   (histograms.parquet, longitudinal.parquet, summary.json, pictures/*.png); given no runner
   flags, a release of 100,000 sealed messages or more is analyzed on one worker per CPU.

``--collect`` puts the network in between: the devices are enrolled (``OUTPUT/devices``), one
``esa collect`` per instance listens on 127.0.0.1 (a free port, TLS from
``OUTPUT/collector_tls``), every simulated device uploads its reports to its instances'
collectors, the collectors are stopped with SIGTERM (each commits its open file), and each
shuffler reads its collector's committed files (``OUTPUT/collected/instance=<u>/*.avro``), whose
origins are the authenticated devices.

``--unsigned`` leaves the commit records unsigned (and the analyzer says it read them
unauthenticated).

K defaults to the recipe's own number of shuffler instances. Given another K, the recipe is
re-issued for K instances as ``<name>-k<K>`` (uniform instance weights; everything else
unchanged) in ``OUTPUT/recipe.json``, so its id still names every parameter; a zero-sum recipe,
whose sums hide a respondent only inside one shuffler, is never re-issued. The defaults (the
sealed 32x32 image-grid recipe image_grid_sealed, its two instances, 40,000 respondents: its
minimum crowd) take under a minute on two cores; ``make run`` calls ``esa run --output results``.
Without ``--respondents`` a recipe that states ``default_respondents`` (the ``small_*`` recipes,
``esa recipes list``) is simulated at that size.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from pipelines import analyze as analyze_pipeline
from pipelines import report_html, withheld_reasons
from pipelines import shuffle as shuffle_pipeline
from pipelines import simulate as simulate_pipeline
from pipelines.commandline import keys as keys_cli
from pipelines.commandline.flags import multi_process_flags
from pipelines.commandline.main import UsageError
from pipelines.commandline.progress import (
    avro_input_records,
    counted_stage,
    line_wanted,
    print_above,
)
from pipelines.commandline.run_options import DEFAULT_RESPONDENTS, RunOptions
from pipelines.default_populations import (  # noqa: F401 - default_image re-exported
    IMAGE_RANDOMIZERS,
    default_image,
    default_population,
)
from pipelines.engines import forked_workers, runners
from schemas.crypto.verify_keys import generate_verify_key, write_verify_key
from schemas.recipes import Recipe, load_recipe, recipe_from_dict
from simulators.shards import ShardContext

__all__ = ["register", "run", "recipe_for_instances"]

RUN_FILE = "run.json"
RELEASES_DIR = "releases"  # the K releases: all the analyzer is given
AGGREGATORS_DIR = "aggregators"  # prio3 recipes: the two aggregators' directories
SUBDIRECTORIES = (
    "simulation", RELEASES_DIR, "analysis", AGGREGATORS_DIR, "collected", "devices", "collector_tls"
)  # fmt: skip
COLLECTOR_START_S = 60.0
SIMULATE_PROCESSES_MIN_MESSAGES = 200_000  # below it the simulation runs in this process
SIMULATE_PROCESSES_MAX = 8  # simulate workers at most (each imports for seconds)
PROCESS_SHUFFLE_MIN_MESSAGES = 500_000  # per instance: below it the shuffles run in this process
SIMULATED_KINDS = ("messages", "chaff", "presence")  # simulation.json's <kind>_per_instance
# What the forked worker processes of a large run import before the first is forked (the
# simulate and analyze stages' DoFns and Beam's worker), and while idle after (an analyzer
# worker's privacy report and pictures).
WORKER_MODULES = ("apache_beam.runners.worker.sdk_worker_main", "pipelines.simulate",
                  "pipelines.analyze")  # fmt: skip
FORK_SERVER_MIN_RESPONDENTS = 20_000  # --respondents below it: no fork server is started early
WORKER_MODULES_LATER = ("scipy.special", "matplotlib.figure", "matplotlib.backends.backend_agg")


def shuffler_private_dir(output: Path, instance: int) -> Path:
    """Instance ``instance``'s private outputs, outside ``OUTPUT/releases`` (DESIGN.md: a
    shuffler's dead letters and manifests never reach the analyzer)."""
    return output / f"shuffler-{instance}" / "private"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="Simulate -> shuffle per instance -> analyze, with a short result table.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    RunOptions.add_cli_arguments(parser)
    parser.set_defaults(handler=_handle, accepts_pipeline_args=True)


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    options = PipelineOptions(pipeline_args, **RunOptions.cli_values(args))
    if args.run_stream:  # live: one line per window as it is analyzed
        return 0 if _run_stream(options)["adds_up"] else 1
    result = run(options, pipeline_args, echo=True)
    return 0 if result["adds_up"] else 1


def _run_stream(options: PipelineOptions) -> dict[str, Any]:
    """``esa run --stream`` (pipelines/stream_run.py) in a prepared --output."""
    from pipelines import stream_run

    values = options.view_as(RunOptions)
    output = Path(values.run_output)
    try:
        recipe = recipe_for_instances(load_recipe(values.run_recipe), values.run_instances)
    except ValueError as error:
        raise UsageError(str(error)) from error
    _prepare(output, values.run_overwrite, not values.run_unsealed and values.run_keys is None)
    (output / "recipe.json").write_text(recipe.to_json())
    population = values.run_population or default_population(recipe)
    result = stream_run.run(
        options,
        recipe,
        population,
        output / RELEASES_DIR,
        lambda instance: shuffler_private_dir(output, instance),
    )
    (output / RUN_FILE).write_text(json.dumps(result, indent=2))
    return result


def recipe_for_instances(recipe: Recipe, instances: int | None) -> Recipe:
    """``recipe`` itself when it is made for ``instances`` shufflers (or ``instances`` is None),
    else ``<name>-k<K>``: the same recipe re-issued for K instances with uniform weights (a new
    id, since an id names every parameter).

    The zero-sum protocol (shuffled-model-histograms, Figure 2) is never re-issued: its messages
    have no local privacy, and its guarantee holds only when one shuffler mixes all of a
    respondent's messages with everyone else's.
    """
    if instances is None or recipe.shuffler_instances == instances:
        return recipe
    if instances < 1:
        raise UsageError(f"--instances must be >= 1, got {instances}")
    if recipe.randomizer == "zero_sum_histogram":
        raise UsageError(
            f"{recipe.id} is made for {recipe.shuffler_instances} shuffler instance(s) and cannot "
            f"be spread over {instances}: its sums hide a respondent only inside one shuffler"
        )
    data = recipe.to_dict()
    data["name"] = f"{recipe.name}-k{instances}"
    data["shuffler_instances"] = instances
    data["instance_weights"] = [1.0 / instances] * instances
    data["description"] = (
        f"{recipe.id} re-issued for {instances} shuffler instances. " + recipe.description
    )
    return recipe_from_dict(data, source=f"{recipe.id} for {instances} instances")


def start_collector(
    instance: int, output: Path, registry: Path, tls: Path
) -> tuple[subprocess.Popen[str], str]:
    """``esa collect --instance u`` on 127.0.0.1 and a free port; returns it and its URL."""
    command = [
        sys.executable, "-m", "pipelines.commandline.main", "collect",
        "--instance", str(instance), "--listen", "127.0.0.1:0",
        "--output", str(output), "--registry", str(registry), "--tls", str(tls),
        "--device-rate", "1000", "--device-burst", "1000",
    ]  # fmt: skip
    log = open(output.parent / f"collector-{instance}.log", "w")  # noqa: SIM115
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    ready: list[str] = []
    reader = threading.Thread(target=lambda: ready.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(COLLECTOR_START_S)
    if not ready or not ready[0].strip():
        process.kill()
        raise RuntimeError(f"collector {instance} did not start; see {log.name}")
    return process, json.loads(ready[0])["listening"]


def collect(
    output: Path,
    simulation_dir: Path,
    instances: int,
    devices: int,
    connections: int,
    say: Any,
) -> dict[str, Any]:
    """Fleet -> K collectors: enrol the devices, make the collectors' TLS, start one
    ``esa collect`` per instance, upload, stop them with SIGTERM (each commits its open file)."""
    keys_cli.enrol_devices(devices, output / "devices")
    tls = output / "collector_tls"
    keys_cli.collector_tls(tls, "127.0.0.1,localhost")
    collected = output / "collected"
    collected.mkdir()
    processes: list[subprocess.Popen[str]] = []
    try:
        urls = []
        for instance in range(instances):
            process, url = start_collector(
                instance, collected / f"instance={instance}", output / "devices", tls
            )
            processes.append(process)
            urls.append(url)
        say(f"collect: {instances} collectors at {', '.join(urls)}")
        uploads = simulate_pipeline.upload_simulation(
            simulation_dir, instances, urls, str(output / "devices"), str(tls / "ca.crt"),
            connections,
        )  # fmt: skip
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(COLLECTOR_START_S)
            except subprocess.TimeoutExpired:
                process.kill()
    if uploads["failed"] or any(process.returncode for process in processes):
        raise RuntimeError(f"uploads to the collectors failed: {uploads}")
    return uploads


def names_runner(flags: list[str]) -> bool:
    """Whether Beam flags choose the runner or its DirectRunner settings (then every stage runs
    as they say, never spread over processes by this command)."""
    return any(flag.startswith(("--runner", "--direct_")) for flag in flags)


def simulate_options(flags: list[str], values: dict[str, Any]) -> PipelineOptions:
    """The simulate stage's options: ``flags`` and ``values``; when ``flags`` name no runner, a
    simulation of at least ``SIMULATE_PROCESSES_MIN_MESSAGES`` messages on a machine with several
    CPUs runs on the multi-process DirectRunner, its devices cut into one shard per CPU (sealing
    each message is the stage's cost, and the shards' workers seal in parallel: make run's
    simulation took 22.4 s of CPU in one process; with 2 workers, 3.4 s in the driver and
    11.6 s and 14.9 s in the workers). Its files and truth are the same kind, one per shard."""
    options = PipelineOptions(flags, **values)
    cpus = os.cpu_count() or 1
    if cpus < 2 or names_runner(flags):
        return options
    context = ShardContext(simulate_pipeline.plan_from_options(options))
    per_respondent = context.messages_per_respondent()
    respondents = context.population.size
    if respondents * per_respondent < SIMULATE_PROCESSES_MIN_MESSAGES:
        return options
    workers = min(cpus, SIMULATE_PROCESSES_MAX)
    per_shard = math.ceil(math.ceil(respondents / workers) * per_respondent)
    return PipelineOptions(
        [*flags, *multi_process_flags(workers)], **values, simulate_messages_per_shard=per_shard
    )


def shuffle_processes(requested: int | None, simulation: dict[str, Any], instances: int) -> int:
    """How many shuffler instances run at once: ``--parallel-shuffles`` when given; else one
    after the other in this process while every instance has fewer than
    ``PROCESS_SHUFFLE_MIN_MESSAGES`` messages (a fresh interpreter imports for ~4 s of CPU before
    its pipeline starts: ``make run``'s two shuffles of 120,000 sealed messages took 9.0 s in two
    processes on two cores), else as many as there are CPUs."""
    if requested is not None:
        return min(instances, requested)
    largest = max(
        sum(
            (simulation.get(f"{kind}_per_instance") or [0] * instances)[u]
            for kind in SIMULATED_KINDS
        )
        for u in range(instances)
    )
    if largest < PROCESS_SHUFFLE_MIN_MESSAGES:
        return 1
    return min(instances, os.cpu_count() or 1)


def _shuffle_instance(
    flags: list[str], values: dict[str, Any], max_processes: int | None = None
) -> dict[str, Any]:
    """One shuffler instance's run (module level, so a worker process can run it); at most
    ``max_processes`` worker processes of its own when it spreads (``shuffle.worker_processes``)."""
    return shuffle_pipeline.run(PipelineOptions(flags, **values), max_processes=max_processes)


def _say_shuffled(say: Any, instance: int, summary: dict[str, Any], began: float) -> None:
    say(
        f"  instance {instance}: released {summary['released']:,} of {summary['read']:,} "
        f"messages, {summary['crowds_withheld']} crowds withheld "
        f"({time.monotonic() - began:.1f} s)"
    )


def _prepare(output: Path, overwrite: bool, throwaway_keys: bool = False) -> None:
    """Refuse a non-empty --output without ``overwrite`` (an earlier run's too, as every stage
    does); with it, clear an earlier run's stages (and its throwaway key pair in OUTPUT/keys when
    this run makes a new one, so old private keys do not pile up)."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()):
        if not overwrite:
            held = "an earlier esa run" if (output / RUN_FILE).exists() else "other files"
            raise UsageError(f"--output {output} holds {held}; pass --overwrite to replace it")
        _remove_run(output, throwaway_keys)
    output.mkdir(parents=True, exist_ok=True)


def _remove_run(output: Path, throwaway_keys: bool) -> None:
    """Remove what an esa run writes into ``output`` (never a --keys folder given inside it)."""
    names = [*SUBDIRECTORIES, RUN_FILE, "recipe.json", keys_cli.SIGNING_KEYS_DIR]
    names += ["keys"] if throwaway_keys else []
    names += [path.name for path in output.glob("shuffler-*") if path.is_dir()]
    for name in names:
        path = output / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            with contextlib.suppress(OSError):
                path.unlink()
    for name in os.listdir(output) if output.is_dir() else ():
        if name.startswith(".simulation.tmp-"):  # a killed simulation's staging folder
            shutil.rmtree(output / name, ignore_errors=True)


def _undo_on_failure(output: Path, throwaway_keys: bool, created: bool) -> Any:
    """An ExitStack callback (with the exception's type): a failed run removes everything it
    wrote, so nothing is left that makes the next run refuse (and the folder, if it made it)."""

    def undo(kind: type[BaseException] | None, *_: Any) -> bool:
        if kind is not None:
            _remove_run(output, throwaway_keys)
            if created and output.is_dir() and not any(output.iterdir()):
                output.rmdir()
        return False

    return undo


def run(
    options: PipelineOptions, pipeline_args: list[str] | None = None, echo: bool = False
) -> dict[str, Any]:
    """Run the three stages; returns run.json's content (stage summaries, seconds, paths).

    ``pipeline_args`` are Beam's own flags (runner and its settings), passed to every stage (on
    Flink through one job server for all of them, ``engines.one_job_server``).
    """
    with contextlib.ExitStack() as resources:
        return _run(options, pipeline_args, echo, resources)


def _run(
    options: PipelineOptions,
    pipeline_args: list[str] | None,
    echo: bool,
    resources: contextlib.ExitStack,
) -> dict[str, Any]:
    values = options.view_as(RunOptions)
    flags = list(pipeline_args or [])
    output = Path(values.run_output)
    errors = values.validate()
    if errors:
        raise UsageError(errors[0])
    given_runner = names_runner(flags)
    # The fork server of a large run's worker processes, started first so that it imports
    # while this process loads the recipe and makes keys; stopped at once if the run is small.
    fork_server = contextlib.ExitStack()
    resources.callback(fork_server.close)
    if (
        not given_runner
        and (os.cpu_count() or 1) > 1
        and (values.run_respondents or FORK_SERVER_MIN_RESPONDENTS) >= FORK_SERVER_MIN_RESPONDENTS
    ):
        fork_server.enter_context(forked_workers.serving(WORKER_MODULES, WORKER_MODULES_LATER))
    try:
        recipe = recipe_for_instances(load_recipe(values.run_recipe), values.run_instances)
    except ValueError as error:
        raise UsageError(str(error)) from error
    throwaway = not values.run_unsealed and values.run_keys is None  # keys_cli.run_keys
    created = not output.exists()
    _prepare(output, values.run_overwrite, throwaway_keys=throwaway)
    resources.push(_undo_on_failure(output, throwaway, created))
    recipe_path = output / "recipe.json"
    recipe_path.write_text(recipe.to_json())
    population = values.run_population or default_population(recipe)
    respondents = values.run_respondents or recipe.default_respondents or DEFAULT_RESPONDENTS
    flags = resources.enter_context(runners.one_job_server(flags))
    seconds: dict[str, float] = {}
    # Sealed by default: devices seal to the newest public key, the analyzer opens with the ring.
    # A prio3 recipe always has an analyzer key: its aggregate shares are sealed to it.
    keys = (
        None
        if values.run_unsealed and not recipe.is_prio3
        else keys_cli.run_keys(output, values.run_keys)
    )
    aggregator_keys = _aggregator_keys(output) if recipe.is_prio3 else None
    # Signed by default: each instance signs its commit record, the analyzer requires it.
    signing = (
        {} if values.run_unsigned else keys_cli.run_signing_keys(output, recipe.shuffler_instances)
    )

    def say(text: str) -> None:
        if echo:
            print_above(text)  # never on the progress line's line

    started = time.monotonic()
    say(
        f"simulate: {recipe.id}, population {population}, {respondents:,} "
        f"respondents, {recipe.shuffler_instances} shuffler instances"
    )
    simulation_dir = output / "simulation"
    simulate_values = {
        "simulate_recipe": str(recipe_path),
        "simulate_population": population,
        "simulate_respondents": respondents,
        "simulate_output": str(simulation_dir),
        "simulate_seed": values.run_seed,
        # A recipe without local privacy (zero-sum) cannot pass an on-device accountant.
        "simulate_no_device_budget": not math.isfinite(recipe.epsilon_local),
        "simulate_public_key": keys and str(keys_cli.newest_public_key(keys)),
        "simulate_aggregator_keys": aggregator_keys and aggregator_keys["public"],
    }
    simulate_flags = simulate_options(flags, simulate_values)
    if simulate_flags.view_as(DirectOptions).direct_num_workers > 1 and not given_runner:
        # A large run: its worker processes (simulate's, then analyze's) are forked.
        if forked_workers.running() is None:
            fork_server.enter_context(forked_workers.serving(WORKER_MODULES, WORKER_MODULES_LATER))
        simulate_flags.view_as(StandardOptions).runner = forked_workers.RUNNER
    else:
        fork_server.close()
    simulation = simulate_pipeline.run(simulate_flags)
    seconds["simulate"] = round(time.monotonic() - started, 2)
    chaff = simulation.get("chaff_messages") or 0  # sealed cover messages (simulators/sealing.py)
    say(f"  {simulation['messages']:,} messages, " + (f"{chaff:,} chaff, " if chaff else "")
        + f"{simulation['presence_messages']:,} presence ({seconds['simulate']} s)")  # fmt: skip

    shuffler_inputs = simulation_dir
    if values.run_collect:
        began = time.monotonic()
        uploads = collect(
            output,
            simulation_dir,
            recipe.shuffler_instances,
            int(simulation["respondents"]),
            values.run_connections,
            say,
        )
        seconds["collect"] = round(time.monotonic() - began, 2)
        say(
            f"  {uploads['stored']:,} uploads stored ({uploads['reports']:,} reports, "
            f"{uploads['retries']:,} retries) ({seconds['collect']} s)"
        )
        shuffler_inputs = output / "collected"
    shuffle_jobs = {
        instance: {
            "input": str(shuffler_inputs / f"instance={instance}" / "*.avro"),
            "output": str(output / RELEASES_DIR / f"instance={instance}"),
            "private_output": str(shuffler_private_dir(output, instance)),
            "instance": instance,
            "recipe": [str(recipe_path)],
            "crowd_threshold": values.run_crowd_threshold,
            "deletion_epsilon": values.run_deletion_epsilon,
            "deletion_delta": values.run_deletion_delta,
            "signing_key": str(signing[instance]) if signing else None,
        }
        for instance in range(recipe.shuffler_instances)
    }
    began = time.monotonic()
    workers = shuffle_processes(values.run_parallel_shuffles, simulation, len(shuffle_jobs))
    say(f"shuffle: {len(shuffle_jobs)} instances, {workers} at a time")
    summaries: dict[int, dict[str, Any]] = {}
    stage = contextlib.ExitStack()  # the progress line, closed below or when the run fails
    resources.callback(stage.close)
    # Records read by every instance's workers against what their inputs' block headers state.
    stage.enter_context(
        counted_stage(
            "shuffle",
            avro_input_records(job["input"] for job in shuffle_jobs.values())
            if line_wanted()
            else None,
        )
    )
    if workers <= 1:
        for instance, job in shuffle_jobs.items():
            summaries[instance] = _shuffle_instance(flags, job)
            _say_shuffled(say, instance, summaries[instance], began)
    else:
        # A fresh interpreter per worker: forking a process that already ran a Beam pipeline
        # (and may hold gRPC threads) is not safe.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            share = max(1, (os.cpu_count() or 1) // workers)  # CPUs for each one's own workers
            futures = {
                pool.submit(_shuffle_instance, flags, job, share): instance
                for instance, job in shuffle_jobs.items()
            }
            for future in concurrent.futures.as_completed(futures):
                instance = futures[future]
                summaries[instance] = future.result()
                _say_shuffled(say, instance, summaries[instance], began)
    stage.close()
    shuffles = [summaries[instance] for instance in sorted(summaries)]
    seconds["shuffle"] = round(time.monotonic() - began, 2)

    if recipe.is_prio3:
        return _aggregate_and_unshard(
            output, recipe, flags, keys, aggregator_keys, simulation, shuffles, seconds, say,
            started, population,
        )  # fmt: skip

    began = time.monotonic()
    say("analyze")
    analysis_dir = output / "analysis"
    stage = contextlib.ExitStack()
    resources.callback(stage.close)
    line = stage.enter_context(counted_stage("analyze", unit="messages"))
    analysis = analyze_pipeline.run(
        PipelineOptions(
            flags,
            analyze_input=[str(output / RELEASES_DIR)],
            analyze_output=str(analysis_dir),
            analyze_recipe=[str(recipe_path)],
            analyze_truth=[str(simulation_dir)],
            analyze_postprocessing=values.run_postprocessing,
            analyze_deletion_epsilon=values.run_deletion_epsilon,
            analyze_deletion_delta=values.run_deletion_delta,
            analyze_key_ring=keys and str(keys),
            analyze_shuffler_keys=str(output / keys_cli.SIGNING_KEYS_DIR) if signing else None,
        ),
        line.set_total,
    )
    stage.close()
    seconds["analyze"] = round(time.monotonic() - began, 2)
    seconds["total"] = round(time.monotonic() - started, 2)
    result = {
        "recipe": recipe.id,
        "population": population,
        "seed": simulation.get("seed"),
        "respondents": simulation.get("respondents"),
        "messages": simulation.get("messages"),
        "instances": recipe.shuffler_instances,
        "paths": {
            "recipe": str(recipe_path),
            "simulation": str(simulation_dir),
            "releases": str(output / RELEASES_DIR),
            "shuffler_private": [
                str(shuffler_private_dir(output, u)) for u in range(recipe.shuffler_instances)
            ],
            "analysis": str(analysis_dir),
            "histograms": str(analysis_dir / analyze_pipeline.HISTOGRAMS_FILE),
            "longitudinal": str(analysis_dir / analyze_pipeline.LONGITUDINAL_FILE),
            "summary": str(analysis_dir / analyze_pipeline.SUMMARY_FILE),
            "pictures": analysis.get("pictures", []),
        },
        "seconds": seconds,
        "adds_up": bool(analysis["metrics"]["adds_up"])
        and all(summary.get("adds_up") for summary in shuffles),
    }
    result["paths"]["report"] = str(analysis_dir / report_html.REPORT_FILE)
    (output / RUN_FILE).write_text(json.dumps(result, indent=2))
    withheld_reasons.record_reasons(str(analysis_dir))
    report_html.write_report(analysis_dir, run=result)
    say("")
    say(analyze_pipeline.summary_table(analysis))
    say("")
    say(f"results ({seconds['total']} s): {analysis_dir}/")
    for name in ("report", "histograms", "longitudinal", "summary"):
        say(f"  {result['paths'][name]}")
    for picture in result["paths"]["pictures"]:
        say(f"  {picture}")
    return result


def _aggregator_keys(output: Path) -> dict[str, Any]:
    """Throwaway keys of the two aggregators (valid for every event time) and their shared
    verify key, in OUTPUT/aggregators/keys."""
    from schemas.crypto.analyzer_keys import generate_key, write_key_pair
    from schemas.crypto.signing_keys import generate_signing_key, trust_shuffler_key

    directory = output / AGGREGATORS_DIR / "keys"
    public, rings = [], []
    for agg_id in range(2):
        ring = directory / f"aggregator{agg_id}"
        public.append(str(write_key_pair(generate_key(), ring)[1]))
        rings.append(str(ring))
    verify_key = write_verify_key(directory / "verify_key.json", generate_verify_key())
    # Each aggregator signs its aggregate.json; the analyzer requires both signatures.
    now_ms = int(time.time() * 1000)
    signing = []
    for j in range(2):
        key = generate_signing_key(j, valid_from_ms=now_ms - 60_000)
        signing.append(str(write_key_pair(key, directory / "signing")[0]))
        trust_shuffler_key(directory / "signing", key.public)  # pinned: the analyzer trusts these
    return {
        "public": public,
        "rings": rings,
        "verify_key": str(verify_key),
        "signing": signing,
        "signing_public": str(directory / "signing"),
    }


def _aggregate_and_unshard(
    output: Path,
    recipe: Recipe,
    flags: list[str],
    keys: Path,
    aggregator_keys: dict[str, Any],
    simulation: dict[str, Any],
    shuffles: list[dict[str, Any]],
    seconds: dict[str, float],
    say: Any,
    started: float,
    population: str,
) -> dict[str, Any]:
    """A prio3 recipe's last stages: both aggregators' two phases, then the analyzer's unshard."""
    from pipelines import aggregate as aggregate_pipeline
    from pipelines import unshard as unshard_pipeline
    from pipelines.commandline.flags import with_default_runner

    began = time.monotonic()
    directories = [output / AGGREGATORS_DIR / f"aggregator{j}" for j in range(2)]
    recipe_path = output / "recipe.json"
    phases = []
    for agg_id in range(2):
        phases.append(
            aggregate_pipeline.run_verify(
                agg_id,
                [str(output / RELEASES_DIR)],
                str(recipe_path),
                aggregator_keys["rings"][agg_id],
                aggregator_keys["verify_key"],
                str(directories[agg_id]),
                with_default_runner(PipelineOptions(flags)),
                shuffler_keys=str(output / keys_cli.SIGNING_KEYS_DIR)
                if (output / keys_cli.SIGNING_KEYS_DIR).is_dir()
                else None,
            )
        )
        say(
            f"aggregate {agg_id} (verify): {phases[-1]['initialized']:,} reports opened, "
            f"{phases[-1]['rejected']:,} rejected ({phases[-1]['seconds']} s)"
        )
    analyzer_public = str(keys_cli.newest_public_key(keys))
    for agg_id in range(2):
        phases.append(
            aggregate_pipeline.run_finish(
                agg_id,
                str(directories[agg_id]),
                str(directories[1 - agg_id]),
                analyzer_public,
                with_default_runner(PipelineOptions(flags)),
                signing_key=aggregator_keys["signing"][agg_id],
            )
        )
        say(
            f"aggregate {agg_id} (finish): {phases[-1]['verified']:,} valid, "
            f"{phases[-1]['published']} crowds published, {phases[-1]['withheld']} withheld "
            f"({phases[-1]['seconds']} s)"
        )
    seconds["aggregate"] = round(time.monotonic() - began, 2)
    began = time.monotonic()
    analysis_dir = output / "analysis"
    analysis = unshard_pipeline.run(
        [str(d) for d in directories],
        str(keys),
        str(analysis_dir),
        str(output / "simulation"),
        aggregator_keys=aggregator_keys["signing_public"],
    )
    seconds["analyze"] = round(time.monotonic() - began, 2)
    seconds["total"] = round(time.monotonic() - started, 2)
    result = {
        "recipe": recipe.id,
        "aggregation": "prio3",
        "population": population,
        "seed": simulation.get("seed"),
        "respondents": simulation.get("respondents"),
        "messages": simulation.get("messages"),
        "instances": recipe.shuffler_instances,
        "aggregators": phases,
        "paths": {
            "recipe": str(recipe_path),
            "simulation": str(output / "simulation"),
            "releases": str(output / RELEASES_DIR),
            "aggregators": [str(d) for d in directories],
            "analysis": str(analysis_dir),
            "histograms": str(analysis_dir / unshard_pipeline.HISTOGRAMS_FILE),
            "summary": str(analysis_dir / unshard_pipeline.SUMMARY_FILE),
        },
        "seconds": seconds,
        "adds_up": all(p.get("adds_up") for p in phases)
        and all(summary.get("adds_up") for summary in shuffles),
    }
    (output / RUN_FILE).write_text(json.dumps(result, indent=2))
    say("")
    for crowd in analysis["crowds"]:
        if "refused" in crowd:
            say(f"window {crowd['window_start']}: refused: {crowd['refused']}")
            continue
        privacy = crowd["privacy"]
        say(
            f"window {crowd['window_start']}: n = {crowd['n']:,} valid reports, "
            f"eps_c = {privacy['epsilon_central']:.3g} ({privacy['bound']}) at delta "
            f"{privacy['delta']:g}, eps_l = {privacy['epsilon_local']:g}"
            + (f", rms z vs truth {crowd['rms_z']:.2f}" if "rms_z" in crowd else "")
        )
    say(f"results ({seconds['total']} s): {analysis_dir}/")
    return result

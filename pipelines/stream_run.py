"""``esa run --stream``: a live run in one command, one line per window as it is analyzed.

    esa run --stream [--windows 2] [--window-seconds 10] [--output results] [--recipe R]
        [--respondents N] [--seed S] [...]

1. The fleet is simulated (``esa simulate --stream``'s first half: ``OUTPUT/simulation/_fleet``,
   with the truth in ``OUTPUT/simulation``), sealed to a throwaway analyzer key and with one
   throwaway signing key per shuffler instance, as ``esa run`` does.
2. K streaming shufflers (``esa shuffle --streaming --instance u``, each its own process on
   Prism, following ``OUTPUT/simulation/instance=<u>/``, committing into
   ``OUTPUT/releases/instance=<u>/`` with its private outputs in ``OUTPUT/shuffler-<u>/private``)
   and the streaming analyzer (``esa analyze --streaming --instances K`` on
   ``OUTPUT/releases``, results in ``OUTPUT/analysis``) start on empty folders.
3. The devices' files appear window after window, ``--window-seconds`` apart. Each window is
   committed by every shuffler once the next window's reports arrive (the watermark passes it;
   the last when the input ends), and analyzed once all K committed it: the analyzer's line
   (window, messages, per crowd n, ε_c and RMSE against the truth) is printed as it happens.

Everything stops by itself: the followers watch for the replay's length plus a margin.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import simulate as simulate_pipeline
from pipelines import stream_simulate
from pipelines.commandline import keys as keys_cli
from pipelines.commandline.run_options import RunOptions
from schemas.recipes import Recipe

# Seconds the followers watch beyond the replay: Prism's start and the last poll.
MARGIN_SECONDS = 15.0


def _esa(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.commandline.main", *argv],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _forward(process: subprocess.Popen, prefix: str, lines: list[str], echo: bool) -> None:
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if echo and prefix == "analyze" and line.startswith("window="):
            print(line.rstrip("\n"), flush=True)


def run(
    options: PipelineOptions,
    recipe: Recipe,
    population: str,
    releases: Path,
    private_of: Callable[[int], Path],
    echo: bool = True,
) -> dict[str, Any]:
    """The live run in ``--output`` (prepared by pipelines/run.py, which wrote ``recipe`` to
    ``OUTPUT/recipe.json``): instance u's releases in ``releases/instance=<u>/``, its private
    outputs in ``private_of(u)``, outside what the analyzer is given; returns the files written
    and each process's exit code."""
    values = options.view_as(RunOptions)
    output = Path(values.run_output)
    recipe_path = output / "recipe.json"
    keys = None if values.run_unsealed else keys_cli.run_keys(output, values.run_keys)
    signing = (
        {} if values.run_unsigned else keys_cli.run_signing_keys(output, recipe.shuffler_instances)
    )
    simulation_dir = output / "simulation"
    simulate_options = PipelineOptions(
        ["--runner=FnApiRunner"],
        simulate_recipe=str(recipe_path),
        simulate_population=population,
        simulate_respondents=values.run_respondents,
        simulate_output=str(simulation_dir),
        simulate_seed=values.run_seed,
        simulate_windows=values.run_windows,
        simulate_no_device_budget=not math.isfinite(recipe.epsilon_local),
        simulate_public_key=keys and str(keys_cli.newest_public_key(keys)),
    )
    say = print if echo else (lambda text: None)
    say(f"simulate: {recipe.id}, population {population}, {values.run_windows} windows")
    simulation = stream_simulate.prepare(simulate_options, simulate_pipeline.run)
    replay_seconds = values.run_windows * values.run_window_seconds
    watch_for = replay_seconds + MARGIN_SECONDS
    interval = max(0.5, min(5.0, values.run_window_seconds / 4))
    shufflers = []
    for u in range(recipe.shuffler_instances):
        # The devices write in event-time order: a window is final once the next one starts.
        argv = ["shuffle", "--streaming", "--instance", str(u), "--recipe", str(recipe_path),
                "--allowed-lateness", "0",
                "--input", str(simulation_dir / f"instance={u}" / "*.avro"),
                "--output", str(releases / f"instance={u}"),
                "--private-output", str(private_of(u)),
                "--watch-interval", str(interval), "--watch-for", str(watch_for)]  # fmt: skip
        if values.run_crowd_threshold is not None:
            argv += ["--crowd-threshold", str(values.run_crowd_threshold)]
        if values.run_deletion_epsilon is not None:
            argv += ["--deletion-epsilon", str(values.run_deletion_epsilon),
                     "--deletion-delta", str(values.run_deletion_delta)]  # fmt: skip
        if signing:
            argv += ["--signing-key", str(signing[u])]
        shufflers.append(_esa(argv))
    releases.mkdir(parents=True, exist_ok=True)
    analyze_argv = ["analyze", "--streaming", "--input", str(releases),
                    "--output", str(output / "analysis"), "--recipe", str(recipe_path),
                    "--truth", str(simulation_dir), "--instances", str(recipe.shuffler_instances),
                    "--watch-interval", str(interval), "--watch-for", str(watch_for)]  # fmt: skip
    if keys:
        analyze_argv += ["--key-ring", str(keys)]
    if signing:
        analyze_argv += ["--shuffler-keys", str(output / keys_cli.SIGNING_KEYS_DIR)]
    analyzer = _esa(analyze_argv)
    logs: dict[str, list[str]] = {}
    threads = []
    for name, process in [("analyze", analyzer)] + [
        (f"shuffle {u}", p) for u, p in enumerate(shufflers)
    ]:
        logs[name] = []
        thread = threading.Thread(target=_forward, args=(process, name, logs[name], echo))
        thread.start()
        threads.append(thread)
    # The shufflers say they are up (their progress record) before the first file appears.
    deadline = time.monotonic() + MARGIN_SECONDS * 4
    while not all(
        (releases / f"instance={u}" / "_STREAM.json").exists() for u in range(len(shufflers))
    ):
        if time.monotonic() > deadline or any(p.poll() is not None for p in shufflers):
            break
        time.sleep(0.2)
    say(
        f"streaming: {len(shufflers)} shufflers and the analyzer follow {simulation_dir}; "
        f"one window every {values.run_window_seconds:g} s"
    )
    files = stream_simulate.replay(simulation_dir, simulation, values.run_window_seconds)
    codes = {name: process.wait() for name, process in [("analyze", analyzer)] + [
        (f"shuffle {u}", p) for u, p in enumerate(shufflers)]}  # fmt: skip
    for thread in threads:
        thread.join()
    failed = {name: code for name, code in codes.items() if code != 0}
    for name in failed:
        print(f"esa run: {name} exited {failed[name]}:", file=sys.stderr)
        print("\n".join(logs[name][-20:]), file=sys.stderr)
    say(f"results: {output / 'analysis'}/ (summary.json, histograms.parquet/window=<start>/)")
    return {"files": len(files), "exit_codes": codes, "adds_up": not failed}

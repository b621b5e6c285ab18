"""``esa shuffle``: the shuffler stage as a runnable pipeline (transforms/shuffler/shuffle.py).

    esa shuffle --input 'reports/*.avro' --output shuffled/ [--private-output shuffled.private]
        [--overwrite] [--crowd-threshold 100] [--deletion-epsilon 1.0 --deletion-delta 1e-6]
        [--window 1d] [--instance 0]
        [--runner=FnApiRunner | --runner=PortableRunner --job_endpoint=embed
         --environment_type=LOOPBACK | --direct_running_mode=multi_processing ...]

Batch mode reads the files matching ``--input`` once. With Beam's ``--streaming`` flag the
shuffler follows ``--input`` for new files (every ``--watch-interval`` seconds, until
``--watch-for`` seconds have passed) and commits one release per event-time window as it closes
(``pipelines/stream_shuffle.py``), dead-lettering data that arrives after its window was
committed (``late_data``).

Each of the K shuffler instances is a separate run: ``--instance I`` on that instance's inputs
(other instances' reports are dead-lettered ``wrong_instance``). Without ``--instance`` one run
serves every instance, keeping them apart in the crowd key.

Output: the release ``--output DIR`` (``esa-release/2``) holds only, per crowd bucket of a window
and instance (``--crowd-buckets B``, schemas/release/crowd_buckets.py: the unit of work, so memory and
elements do not grow with the number of crowds), ``messages/<stem>-g<group>.avro`` (ShuffledMessage
files grouped by crowd, deterministic names) and ``crowds/<stem>.avro`` (per crowd its status and
the distinct respondents and messages released), and ``_COMMIT.json`` (schemas/release/commit.py: every
file with size, records and SHA-256; totals of records, crowds and respondents; the parameters the
privacy report needs), written last and atomically from the run's index; with ``--signing-key KEY``
(this instance's Ed25519 key, ``esa keys generate --shuffler-instance I``; needs ``--instance
I``) the record carries the instance's signature (schemas/crypto/commit_signing.py), the key read on the
driver when the commit is written and never placed in the job graph. Everything shuffler-private
goes to ``--private-output PDIR`` (default ``DIR.private``, a sibling): ``manifest/`` (one
CrowdManifest per crowd, in a file per window and crowd bucket), ``dead_letter/*.avro``,
``metrics.json`` (read = released + deleted + withheld + dead-lettered + presence, in records,
checked), ``index/`` and the spill directory ``spill/`` (under the runner's ``--temp_location`` when given:
``<temp_location>/esa-spill/<digest of DIR>/``; removed on every exit path; a run killed before it
could is cleaned by the next run into the same DIR).

An existing release (committed or partial) in DIR is refused unless ``--overwrite``, which first
removes its commit record and then everything else of it and of PDIR. ``esa`` holds an exclusive
lock on DIR and PDIR for the run (a second run into them stops in one line); each run draws a
random run id, written into every index entry and into the commit record (``run``: id, commit
time, windows), which lists only that run's files. A run that fails removes what it wrote (no
commit, nothing that makes the next run refuse). An ``--input`` match that is not a regular file
(a FIFO would block its reader forever) and an ``--instance`` no recipe sends messages to are
refused before any work. Repeats of a sealed payload within a crowd are dead-lettered
``duplicate_payload`` before respondents are counted (``schemas/replays.py``).

Given no runner flags, the shuffle runs in this process, or from 128 MiB of report files on
the multi-process DirectRunner with one worker per CPU (at most 8): every core reads, screens and
writes its share of each crowd. On that runner with several workers, report files are read as
ranges of whole blocks (about 4 per worker, of 50,000 records or more), so one large file is
every worker's work.

Other runners: Flink/Spark/Dataflow take the same flags plus their own (``--runner=FlinkRunner
--flink_master=HOST:PORT``, or ``--runner=DataflowRunner --project P --region R
--temp_location gs://... --setup_file ./setup.py``); DIR and PDIR must then be on a file
system every worker and the driver reach as a local path (a shared mount): the driver checks,
cleans and commits them with the local file API (schemas/release/commit.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import time
from collections.abc import Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
)

from pipelines.commandline import shuffler_key_flags
from pipelines.commandline.main import UsageError
from pipelines.commandline.options import (
    add_stage_arguments,
    stage_option_values,
    temp_location_root,
    with_default_runner,
    worker_processes_of,
)
from pipelines.commandline.shuffle_options import ShuffleOptions
from pipelines.engines.new_pipeline import new_pipeline
from schemas import SUPPORTED_SCHEMA_VERSIONS
from schemas.regular_files import kind_of
from schemas.release import commit as release_format
from schemas.release.crowd_buckets import CROWDS_DIR, MESSAGES_DIR, parse_release_path
from transforms.common import atomic_files
from transforms.common.dead_letters import WriteDeadLetters
from transforms.shuffler import report_rows, sinks, spill
from transforms.shuffler import shuffle as shuffle_transforms
from transforms.shuffler.read import PlanReportRanges

# Given no runner flags, a shuffle is spread over worker processes (one per CPU, at most
# MAX_WORKER_PROCESSES) from this many bytes of report files: a worker process costs ~1-1.5 s
# to start and the driver more to feed it, against ~2-3 us of CPU a message (~33 bytes of a
# clear report, ~60 of a sealed one). On 2 cores, one process against 2 workers:
# bench_scaling's 481,300 sealed messages (29 MB) 2.6 s against 3.9 s; bench_shuffle's clear
# messages, 2 M (65 MiB) 7.2-7.8 s against 6.1-6.8 s, 4 M (131 MiB) 13.2-13.4 s against
# 7.9-9.3 s, 10 M 1.58x. Below it, this process.
SPREAD_MIN_INPUT_BYTES = 128 << 20
MAX_WORKER_PROCESSES = 8
# Spread over processes, report files are read as ranges of whole blocks
# (transforms.shuffler.read.PlanReportRanges), so that one large file is every worker's work,
# not one's: about RANGES_PER_WORKER ranges per worker, none under MIN_RANGE_RECORDS records
# (each range is read as batches of its own, and ends its last batch early). The records are
# guessed from the bytes, as a clear report's (the most records a byte can hold): on 2 cores, 8
# files of 250,000 records ran 6.2-6.4 s cut into 50,000-record ranges and 5.6-5.8 s whole.
RANGES_PER_WORKER = 4
MIN_RANGE_RECORDS = 50_000
BYTES_PER_REPORT = 32  # a report with a 16-byte clear payload, deflated: ~33 bytes


def range_records(input_bytes: int, workers: int) -> int:
    """Records per range of a report file when ``input_bytes`` of them are read by ``workers``
    worker processes (see ``RANGES_PER_WORKER``)."""
    guessed = input_bytes // BYTES_PER_REPORT
    return max(MIN_RANGE_RECORDS, math.ceil(guessed / (max(1, workers) * RANGES_PER_WORKER)))


def worker_processes(input_bytes: int) -> int:
    """Worker processes a shuffle of ``input_bytes`` bytes of report files is spread over when
    no runner was chosen (``with_default_runner``): one per CPU, at most
    ``MAX_WORKER_PROCESSES``, from ``SPREAD_MIN_INPUT_BYTES``; else 1 (this process)."""
    if input_bytes >= SPREAD_MIN_INPUT_BYTES:
        return min(os.cpu_count() or 1, MAX_WORKER_PROCESSES)
    return 1


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "shuffle",
        help="Shuffler: threshold, randomized deletion, strip and permute report crowds.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_stage_arguments(parser, ShuffleOptions)
    parser.add_argument(
        "--json", action="store_true", help="Print metrics.json instead of a short summary."
    )
    parser.set_defaults(handler=_handle, accepts_pipeline_args=True)


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    values = stage_option_values(args, ShuffleOptions)
    options = PipelineOptions(pipeline_args, **values)
    from pipelines.commandline import progress
    from pipelines.engines.forked_workers import serving_this_process

    streaming = options.view_as(StandardOptions).streaming
    if streaming:  # input that grows: elapsed time only
        line = progress.stage_progress("shuffle")
    else:  # records read against the records the input's Avro block headers state
        pattern = options.view_as(ShuffleOptions).input
        total = (
            progress.avro_input_records([pattern]) if pattern and progress.line_wanted() else None
        )
        line = progress.counted_stage("shuffle", total)
    # Batch workers forked from this process as it is before the progress line's thread starts.
    with contextlib.nullcontext() if streaming else serving_this_process(), line:
        summary = run(options)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        from pipelines.commandline.summaries import shuffle_summary

        print(shuffle_summary(summary))
    if summary.get("adds_up"):
        return 0
    unknown = summary.get("chunks_of_unknown_records") or {}
    print(
        f"esa shuffle: error: the records read do not add up ({summary.get('read')} read, "
        f"{summary.get('accounted')} accounted; chunks of unknown records: {unknown}); see the "
        f"dead letters in {summary.get('private_output')}",
        file=sys.stderr,
    )
    return 1


def _routes(recipe_names: list[str] | None, window_ms: int) -> dict[str, report_rows.RecipeRoute]:
    from schemas import recipes

    if not recipe_names:
        return report_rows.routes_from_recipes(recipes.shipped_recipes(), window_ms)
    loaded = {}
    for name in recipe_names:
        try:
            recipe = recipes.load_recipe(name)
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot load recipe {name!r}: {error}") from error
        loaded[recipe.id] = recipe
    return report_rows.routes_from_recipes(loaded, window_ms)


def shuffle_config(
    options: ShuffleOptions,
    streaming: bool,
    routes: Mapping[str, report_rows.RecipeRoute] | None = None,
) -> shuffle_transforms.ShuffleConfig:
    """The ShuffleConfig an options object describes (``routes`` overrides ``--recipe``)."""
    epsilon, delta = options.deletion_epsilon, options.deletion_delta
    if (epsilon is None) != (delta is None):
        raise UsageError("--deletion-epsilon and --deletion-delta go together")
    deletion = None if epsilon is None else report_rows.DeletionParameters(epsilon, delta)
    if options.instance is not None and options.instance < 0:
        raise UsageError(f"--instance must be >= 0, got {options.instance}")
    window_ms = report_rows.parse_duration_ms(options.window)
    routes = dict(routes) if routes is not None else _routes(options.recipe, window_ms)
    check_instance_routed(options.instance, routes)
    rules = report_rows.ValidationRules(
        routes=routes,
        supported_versions=frozenset(SUPPORTED_SCHEMA_VERSIONS),
        instance=options.instance,
        window_ms=window_ms,
    )
    return shuffle_transforms.ShuffleConfig(
        rules=rules,
        crowd_threshold=options.crowd_threshold,
        deletion=deletion,
        window=report_rows.WindowSpec(period_ms=window_ms),
        streaming=streaming,
        batch_records=options.batch_records,
        messages_per_shard=options.messages_per_shard,
        messages_per_file=options.messages_per_file,
        crowd_buckets=options.crowd_buckets,
    )


def check_instance_routed(
    instance: int | None, routes: Mapping[str, report_rows.RecipeRoute]
) -> None:
    """``--instance I`` must be an instance some recipe sends messages to (I < its K), else
    every record would be dead-lettered and an empty release committed: refused, one line."""
    if instance is None or any(instance < r.shuffler_instances for r in routes.values()):
        return
    largest = max((route.shuffler_instances for route in routes.values()), default=0)
    raise UsageError(
        f"--instance {instance}: no recipe routes messages to it (the recipes use instances "
        f"0..{largest - 1})"
    )


def _input_files(pattern: str) -> tuple[list[str], int]:
    """The report files ``pattern`` matches, sorted, and their bytes in all."""
    try:
        matches = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # noqa: BLE001 - a bad pattern is the user's to fix
        raise UsageError(f"cannot list --input {pattern!r}: {error}") from error
    paths = sorted(metadata.path for metadata in matches)
    if not paths:
        raise UsageError(f"--input {pattern!r} matches no file")
    for path in paths:  # a FIFO would block its reader forever: never opened
        if FileSystems.get_scheme(path) is None:
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise UsageError(
                    f"--input {pattern!r} matches {path}: {kind_of(mode)}, not a regular file"
                )
    return paths, sum(int(metadata.size_in_bytes or 0) for metadata in matches)


def private_path(output: str, private_output: str | None) -> str:
    """``--private-output``, default ``<output>.private``; never the release or inside it."""
    private = private_output or output.rstrip("/\\") + ".private"
    release_dir, private_dir = os.path.abspath(output), os.path.abspath(private)
    if os.path.commonpath([release_dir, private_dir]) == release_dir:
        raise UsageError(f"--private-output {private!r} must not be inside --output {output!r}")
    return private


_SPILL_RUN = re.compile(r"^run-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[0-9a-f]+$")


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def spill_run_name() -> str:
    """``run-<host>-<pid>-<random>``: lets a later run tell a live run's spill from a dead one's."""
    return f"run-{_host_tag()}-{os.getpid()}-{secrets.token_hex(6)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_spill(spill_root: str) -> list[str]:
    """Remove the spill directories of runs that are no longer alive (killed before they could
    clean up); a live run's on this host is left alone. Returns the removed names."""
    if not os.path.isdir(spill_root):
        return []
    removed = []
    for name in sorted(os.listdir(spill_root)):
        match = _SPILL_RUN.match(name)
        if match and match["host"] == _host_tag() and int(match["pid"]) != os.getpid():
            if _alive(int(match["pid"])):
                continue
        spill.remove_spill(os.path.join(spill_root, name))
        removed.append(name)
    if not os.listdir(spill_root):
        os.rmdir(spill_root)
    return removed


def spill_root_path(output: str, private: str, temp_location: str | None) -> str:
    """Where this release's spill goes: ``<--temp_location>/esa-spill/<digest of DIR>`` when the
    runner was given a temp location (one root per release, so cleaning a dead run's spill never
    touches another release's), else ``PDIR/spill``."""
    if not temp_location:
        return FileSystems.join(private, "spill")
    return temp_location_root(temp_location, "esa-spill", output)


def _remove_empty(path: str) -> None:
    if os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)


def _has_entries(path: str) -> bool:
    return os.path.isdir(path) and bool(os.listdir(path))


def prepare_outputs(
    output: str, private: str, overwrite: bool, spill_root: str | None = None
) -> None:
    """Clean stale spill data, then refuse (one line) or, with ``overwrite``, empty an existing
    release and its private directory. The commit record goes first, so an interrupted removal
    leaves an uncommitted directory that every reader refuses."""
    for path, flag in ((output, "--output"), (private, "--private-output")):
        if os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"{flag} {path!r} is a file, not a directory")
    # Spill of a run killed before it could clean up: never needed again, never kept.
    remove_stale_spill(os.path.join(private, "spill"))
    if spill_root is not None and FileSystems.get_scheme(spill_root) is None:
        remove_stale_spill(spill_root)
    committed = os.path.isfile(os.path.join(output, release_format.COMMIT_FILE))
    if not overwrite:
        if committed:
            raise UsageError(
                f"--output {output!r} already holds a release; pass --overwrite to replace it"
            )
        if _has_entries(output):
            raise UsageError(
                f"--output {output!r} holds an uncommitted (partial) release; pass --overwrite "
                "to replace it"
            )
        if _has_entries(private):
            raise UsageError(
                f"--private-output {private!r} holds a previous run's data; pass --overwrite "
                "to replace it"
            )
        return
    if committed:
        os.remove(os.path.join(output, release_format.COMMIT_FILE))
    for path in (output, private):
        if os.path.isdir(path):
            FileSystems.delete([path])


def remove_failed_run(output: str, private: str) -> None:
    """Remove what a failed run wrote into DIR and PDIR (both held nothing else: refused or
    emptied by :func:`prepare_outputs`, locked for this run), so that nothing is committed and
    nothing makes the next run refuse; a path that cannot be removed is left as it is."""
    commit_path = os.path.join(output, release_format.COMMIT_FILE)
    with contextlib.suppress(OSError):
        os.remove(commit_path)  # uncommitted first, whatever else stays
    for path in (output, private):
        if FileSystems.get_scheme(path) is None:
            shutil.rmtree(path, ignore_errors=True)


def _release_files(output: str) -> list[str]:
    """Relative paths of the message files and crowd tables in the release directory."""
    present = []
    for directory in (MESSAGES_DIR, CROWDS_DIR):
        path = os.path.join(output, directory)
        if os.path.isdir(path):
            present.extend(f"{directory}/{name}" for name in os.listdir(path))
    return sorted(present)


def new_run_id() -> str:
    """A run's id: 128 random bits (hex), in every index entry and in the signed commit record
    (``run``), so that a commit lists only its own run's files and an analyzer can tell one run
    from another (``pipelines/runs_ledger.py``)."""
    return secrets.token_hex(16)


def run_record(run_id: str, entries: list[dict[str, Any]], window_ms: int) -> dict[str, Any]:
    """The commit record's ``run``: its id, when it was committed and the event-time range of
    the windows it released (from its files' stems)."""
    starts = [
        parsed[1].window_start
        for entry in entries
        if (parsed := parse_release_path(entry["path"])) is not None
    ]
    windows = [min(starts), max(starts) + window_ms] if starts else None
    return {"id": run_id, "committed_at_ms": int(time.time() * 1000), "windows": windows}


def commit_release(
    output: str,
    private: str,
    config: shuffle_transforms.ShuffleConfig,
    window: str,
    signing_key: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Write ``_COMMIT.json`` from the run's release index only (last, atomically), signed
    with the key file ``signing_key`` when given; refuses if the message files and crowd tables
    on disk are not exactly the indexed ones, or (given ``run_id``) if an index entry is
    another run's."""
    entries = sinks.read_index(private)
    if run_id is not None:
        foreign = [entry["path"] for entry in entries if entry.get("run_id") != run_id]
        if foreign:
            raise RuntimeError(
                f"{output}: {foreign[0]} was written by another run, not this one "
                f"({run_id}); not committed"
            )
    if _release_files(output) != [entry["path"] for entry in entries]:
        raise RuntimeError(f"{output}: release files differ from the run's index; not committed")
    deletion = config.deletion
    parameters = {
        "crowd_threshold": config.crowd_threshold,
        "deletion_epsilon": None if deletion is None else deletion.epsilon,
        "deletion_delta": None if deletion is None else deletion.delta,
        "window": window,
        "window_ms": config.window.period_ms,
        "crowd_buckets": config.crowd_buckets,
    }
    record = sinks.commit_record(
        config.rules.instance, config.rules.recipe_ids, parameters, entries
    )
    if run_id is not None:
        record["run"] = run_record(run_id, entries, config.window.period_ms)
    os.makedirs(output, exist_ok=True)
    key = None if signing_key is None else shuffler_key_flags.load_signing_key(signing_key)
    release_format.write_commit(output, record, signing_key=key)
    return record


def run(
    options: PipelineOptions,
    routes: Mapping[str, report_rows.RecipeRoute] | None = None,
    max_processes: int | None = None,
) -> dict[str, Any]:
    """Run the shuffler pipeline and commit its release; returns the metrics summary (also in
    PDIR/metrics.json). Given no runner flags, it runs in this process or, from
    ``SPREAD_MIN_INPUT_BYTES`` of input, on a worker process per CPU (:func:`worker_processes`),
    at most ``max_processes`` (``esa run``'s shuffles that run side by side share the CPUs)."""
    shuffle_options = options.view_as(ShuffleOptions)
    if not shuffle_options.input or not shuffle_options.output:
        raise UsageError("--input and --output are required")
    if options.view_as(StandardOptions).streaming:  # one release per window, as they close
        from pipelines import stream_shuffle

        config = shuffle_config(shuffle_options, True, routes)
        private = private_path(shuffle_options.output, shuffle_options.private_output)
        return stream_shuffle.run(options, config, private, lambda window: run(window, routes))
    config = shuffle_config(shuffle_options, False, routes)
    output = shuffle_options.output
    private = private_path(output, shuffle_options.private_output)
    shuffler_key_flags.check_signing_key(shuffle_options.signing_key, config.rules.instance)
    paths, input_bytes = _input_files(shuffle_options.input)
    processes = worker_processes(input_bytes)
    options = with_default_runner(options, min(processes, max_processes or processes))
    temp_location = options.view_as(GoogleCloudOptions).temp_location
    spill_root = spill_root_path(output, private, temp_location)
    prepare_outputs(output, private, bool(shuffle_options.overwrite), spill_root)
    spill_dir = FileSystems.join(spill_root, spill_run_name())
    run_id = new_run_id()

    started = time.monotonic()
    try:
        pipeline = new_pipeline(options)
        workers = worker_processes_of(options)
        config = dataclasses.replace(config, workers=workers)
        # Reshuffled only to walk many files' blocks on several workers: SpreadFiles spreads
        # the files (or their ranges) over the workers anyway.
        input_paths = pipeline | "InputPaths" >> beam.Create(paths, reshuffle=workers > 1)
        if workers > 1:  # block headers walked: ~30 ms for 131 MiB
            planner = PlanReportRanges(range_records(input_bytes, workers))
            input_paths |= "PlanRanges" >> beam.ParDo(planner)
        input_paths |= "SpreadFiles" >> beam.Reshuffle()
        outputs = input_paths | "Shuffle" >> shuffle_transforms.ShuffleReports(config, spill_dir)
        outputs.released | "WriteMessages" >> sinks.WriteShuffledMessages(
            output, private, run_id=run_id
        )
        outputs.crowds | "WriteCrowdTables" >> sinks.WriteCrowdTables(
            output, private, run_id=run_id
        )
        outputs.dead_letters | "WriteDeadLetters" >> WriteDeadLetters(private)
        outputs.manifests | "WriteManifests" >> sinks.WriteManifests(private)
        outputs.counts | "WriteMetrics" >> sinks.WriteMetrics(private)
        result = pipeline.run()
        result.wait_until_finish()
    except BaseException:
        remove_failed_run(output, private)
        raise
    finally:
        spill.remove_spill(spill_dir)
        # Failed attempts' temporary files (transforms/common/atomic_files.py), before any commit.
        atomic_files.remove_temporary(output)
        atomic_files.remove_temporary(private)
        if FileSystems.get_scheme(spill_root) is None:
            _remove_empty(spill_root)
            if temp_location:
                _remove_empty(os.path.dirname(spill_root.rstrip("/")))
    try:
        commit_release(
            output, private, config, shuffle_options.window, shuffle_options.signing_key, run_id
        )
    except BaseException:
        remove_failed_run(output, private)
        raise
    elapsed = time.monotonic() - started

    metrics_path = FileSystems.join(private, "metrics.json")
    with FileSystems.open(metrics_path) as handle:
        summary = json.loads(handle.read())
    summary["seconds"] = round(elapsed, 3)
    summary["release"] = output
    summary["private_output"] = private
    summary["instance"] = shuffle_options.instance
    summary["commit_signed"] = shuffle_options.signing_key is not None
    summary["deletion"] = (
        {"epsilon": config.deletion.epsilon, "delta": config.deletion.delta}
        if config.deletion is not None
        else None
    )
    counters = _beam_counters(result)
    summary["beam_counters"] = counters
    if counters is not None:
        rejected = sum(value for name, value in counters.items() if name.startswith("rejected_"))
        accounted = rejected + sum(
            counters.get(name, 0)
            for name in (
                shuffle_transforms.RELEASED,
                shuffle_transforms.DELETED,
                shuffle_transforms.WITHHELD,
                shuffle_transforms.PRESENCE,
            )
        )
        summary["beam_counters_add_up"] = counters.get(shuffle_transforms.READ, 0) == accounted
    with FileSystems.create(metrics_path) as handle:
        handle.write(json.dumps(summary, indent=2, sort_keys=True).encode())
    return summary


def _beam_counters(result: Any) -> dict[str, int] | None:
    """The Beam counters of the run (committed, else attempted), or None if the runner has none."""
    try:
        counters = result.metrics().query(
            beam.metrics.MetricsFilter().with_namespace(shuffle_transforms.METRICS_NAMESPACE)
        )["counters"]
    except Exception:  # noqa: BLE001 - not every runner reports metrics
        return None
    totals: dict[str, int] = {}
    for counter in counters:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + int(value or 0)
    return totals

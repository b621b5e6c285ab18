"""``esa analyze``: the analyzer stage as a runnable pipeline (transforms/analyzer/aggregate.py, analyze.py).

    esa analyze --input shuffled/ --output analysis/ [--input ...] [--recipe NAME|FILE ...]
        [--truth simulation/] [--postprocessing none|clip_nonnegative|norm_sub]
        [--runner=FnApiRunner | --direct_running_mode=multi_processing --direct_num_workers=2 |
         --runner=PortableRunner --job_endpoint=embed --environment_type=LOOPBACK]

Input: one committed release per shuffler instance, as ``esa shuffle`` writes it
(``esa-release/2``: ``messages/<stem>-g<group>.avro``, one crowd table ``crowds/<stem>.avro`` per
bucket of a window, and ``_COMMIT.json``). ``--input DIR`` is either a release or a directory of
``instance=<u>/`` releases. Every release is verified against its commit record first
(``schemas.release.commit.verify_release``): an uncommitted directory, a missing, unlisted (e.g. copied),
truncated or altered file, any shuffler-private file (dead letters, manifests, metrics, spill),
a crowd table that disagrees with its bucket, the threshold or the record's totals, and a release
of the older format ``esa-release/1`` are refused with one line naming it (exit 2). Only the
committed files are read: workers take the file list from the commit record itself, refusing it
unless its SHA-256 is the one the driver verified, and the crowds from the crowd tables it
commits, each checked against its committed SHA-256 (nothing per crowd or file is pickled into
the job). Each crowd's messages in its bucket's files must match its crowd table
(``pipelines.release_counts``, one bucket at a time, counted by the workers as they decode): a
crowd read but not released, or a ``messages_released`` other than the records read, is refused
too, and nothing of that analysis is published.
With ``--shuffler-keys KEYS`` (the shufflers' public signing keys) every commit record must also
carry a valid Ed25519 signature of its own instance's key (schemas/crypto/commit_signing.py): an
unsigned record, an unknown, wrong-instance or expired key, and a record altered after signing
are refused the same way (a directory of keys counts only the key ids its
``trusted_shufflers.json`` pins per instance). Without it the summary states that the commit
records were not authenticated. With ``--runs-ledger FILE`` a release whose run was accepted
before, or an older one of its instance, is refused (``pipelines/runs_ledger.py``). A sealed
release that ``--key-ring`` cannot open (none given, or none of its key ids held) is refused
before any work (``pipelines/release_keys.py``); repeats of a sealed payload are discarded
(``duplicate_payload``) and a crowd all of whose messages were rejected is withheld with the
reasons, never estimated (``transforms/analyzer/arithmetic/rejections.py``).

Respondent counts come only from the crowd tables: instance u states per crowd the respondents
it released (``respondents_released``, after randomized deletion), and the analyzer de-biases with
n_eff = Σ_u π_u n_u over instances (π = the recipe's instance weights): unbiased for the
π-weighted surviving population when shufflers withhold crowds or delete respondents (Algorithm
3), and exactly n when nothing was deleted. No message can change n; retired census payloads are
dead-lettered ``census_not_counted``. The instance, threshold and deletion (ε_cr, δ_cr) of the
privacy report come from the commit record too.

Output (DIR): ``histograms.parquet`` (window_start, window_end, channel, recipe_id, crowd, bucket,
estimate [unbiased], stderr, raw_count, n, estimate_<postprocessing>, truth), ``longitudinal.parquet``
(f̃_t per period with Theorem 6's bound), ``reports.jsonl`` (per crowd the privacy report and
accuracy, JSON Lines), ``withheld.jsonl`` (notes on withheld crowds), ``summary.json`` (inputs,
metrics, totals and the names of those two), ``dead_letter/part-*.avro`` and PNG pictures
under ``pictures/`` (drawn per crowd inside the pipeline). The two tables are Parquet datasets:
directories of ``part-SSSSS-of-NNNNN.parquet`` files, each holding whole crowd buckets
(``transforms.analyzer.arithmetic.buckets``), at most about a million rows and a thousand crowds per
part; ``pyarrow.parquet.read_table(DIR/histograms.parquet)`` reads one as a table. The two JSON
Lines datasets are split the same way (``transforms.analyzer.report_files.read_reports``).

Given no runner flags (no ``--runner``, no ``--direct_*`` setting), a release of at least 100,000
sealed messages (or 1,000,000 in all) is analyzed on the multi-process DirectRunner, one worker
process per CPU (at most 16), its files read in ranges of at most 1/8 of a worker's share; one of
at least 20,000 crowds on one worker per 10,000 crowds (at most one per CPU) where its workers
are forked, not spawned; anything smaller runs in this process on FnApiRunner, as
``--runner=FnApiRunner`` always does.

Other runners take the same flags plus their own (``--runner=FlinkRunner --flink_master=HOST:PORT``,
or ``--runner=DataflowRunner --project P --region R --temp_location gs://... --setup_file
./setup.py``); inputs and DIR must then be on a filesystem every worker reaches.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
)

from pipelines import pictures, release_keys, report_html, runs_ledger, withheld_reasons
from pipelines.commandline import analyzer_key_flags
from pipelines.commandline.analyze_options import AnalyzeOptions
from pipelines.commandline.main import UsageError
from pipelines.commandline.options import (
    temp_location_root,
    with_default_runner,
    worker_processes_of,
)
from pipelines.engines import forked_workers
from pipelines.engines.new_pipeline import new_pipeline
from pipelines.release_counts import (
    CheckCrowdCounts,
    check_crowd_counts,
    read_refusal,
    refuse_on_problems,
)
from schemas import SUPPORTED_SCHEMA_VERSIONS
from schemas.crypto.signing_keys import ShufflerKeys
from schemas.recipes import load_recipe, shipped_recipes
from schemas.regular_files import kind_of
from schemas.release import commit as release
from schemas.release.crowd_buckets import CROWDS_DIR
from schemas.release.crowd_tables import CrowdColumns
from transforms.analyzer import arithmetic
from transforms.analyzer.aggregate import (
    AggregateReleases,
    commit_crowd_buckets,
    crowd_table_bucket,
    pinned_crowd_table_group_records,
    pinned_crowd_table_groups,
    pinned_message_paths,
    table_analyzer_bucket,
)
from transforms.analyzer.analyze import (
    HISTOGRAMS_FILE,
    LONGITUDINAL_FILE,
    SUMMARY_FILE,
    AnalysisConfig,
    EstimateBuckets,
    TruthSource,
    WriteAnalysis,
)
from transforms.analyzer.report_files import REPORTS_DIR, WITHHELD_DIR, read_reports
from transforms.analyzer.tables import SPILL_DIR, analysis_parts
from transforms.common import atomic_files, avro_io
from transforms.common.dead_letters import WriteDeadLetters

__all__ = ["Release", "discover_releases", "register", "run", "summary_table"]

PICTURES_DIR = pictures.PICTURES_DIR
# Given no runner flags, an analysis is spread over worker processes (one per CPU, at most
# MAX_WORKER_PROCESSES) from this many sealed messages, or this many messages in all: opening a
# sealed message costs ~60-90 us of CPU and decoding one in the clear ~10 us, a worker process
# ~2 s to start (importing Beam and the analyzer, unpickling the pipeline), and the driver
# ~1 s more to feed workers over gRPC (make run's 160,464 sealed messages on 2 cores: 15.2 s of
# CPU in one process, 21-22 s with 2 workers, then the split over 2 ranges per file was 2:1).
# On a 16-core machine, bench_scaling's 1,284,574 sealed messages took 81.9 s on 1 worker,
# 25.2 s on 4 and 11.0 s on 16 (spawned workers): every core of such a machine is worth using.
SPREAD_MIN_SEALED_MESSAGES = 100_000
SPREAD_MIN_MESSAGES = 1_000_000
# Many crowds are work of their own (~35 us each in one process: a bucket's estimates, report
# line and table rows, whatever the messages), spread one worker per CROWDS_PER_WORKER from
# twice that many where the workers are forked (a spawned one takes seconds to start).
# bench_crowds' 99,518 crowds of 327,851 messages on 2 cores, alternating: one process
# 3.8-5.8 s, 2 forked workers 3.3-4.0 s (its full run at bc3443f: 4.9 s and 3.5 s); its 9,959
# crowds 1.9-2.4 s either way (the workers' start and the stages' fixed costs match what a
# worker's share saves).
CROWDS_PER_WORKER = 10_000
MAX_WORKER_PROCESSES = 16
# The crowd tables' picture candidates are found this many crowds at a time (at most about this
# many crowd rows wait in the driver).
PICTURE_BATCH_ROWS = 1 << 16
RANGES_PER_WORKER = 8  # file ranges per worker at least, when spread over processes
_INSTANCE_DIR = re.compile(r"instance=(\d+)$")
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="Analyzer: de-bias released crowds into histograms, counters and a privacy report.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    AnalyzeOptions.add_cli_arguments(parser)
    parser.set_defaults(handler=_handle, accepts_pipeline_args=True)


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    options = PipelineOptions(pipeline_args, **AnalyzeOptions.cli_values(args))
    if options.view_as(StandardOptions).streaming:  # window by window, as they are committed
        from pipelines import stream_analyze

        summary = stream_analyze.run(options, run)
        print(
            f"windows analyzed: {summary.get('windows_analyzed', 0)}; results: {args.analyze_output}"
        )
        return 0
    from pipelines.commandline.progress import counted_stage

    # Workers forked from this process as it is before the progress line's thread starts.
    with forked_workers.serving_this_process(), counted_stage("analyze", unit="messages") as line:
        summary = run(options, line.set_total)
    print(summary_table(summary))
    print(f"results: {summary['inputs']['output']}")
    withheld_reasons.record_reasons(summary["inputs"]["output"])
    print(f"report: {report_html.write_report(summary['inputs']['output'])}")
    return 0 if summary["metrics"]["adds_up"] else 1


# ---------------------------------------------------------------------------------------------
# Inputs: committed releases
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One shuffler instance's verified release: its commit record (which lists no crowds),
    committed message files and every committed file's entry (``entries``: so that
    ``schemas.release.commit.iter_crowds(r)`` and ``crowd_table_paths(r)`` read its crowd tables, one
    at a time)."""

    instance: int
    path: str
    commit: Mapping[str, Any]
    files: tuple[str, ...]  # message files only (crowd tables: release.crowd_table_paths)
    deletion: tuple[float, float] | None
    crowd_threshold: Any
    signed_by: str | None = None  # the verified signing key's id (--shuffler-keys)
    commit_sha256: str | None = None  # of the verified _COMMIT.json: workers re-read only it
    entries: tuple[release.FileEntry, ...] = ()


def _exists(path: str) -> bool:
    try:
        return FileSystems.exists(path)
    except Exception:  # noqa: BLE001 - an unreachable path simply is not there
        return False


def _read_json(path: str) -> dict[str, Any] | None:
    if not _exists(path):
        return None
    try:
        with avro_io.open_input(path) as handle:
            return json.loads(handle.read())
    except (OSError, ValueError):
        return None


def _release_dirs(given: str) -> list[str]:
    """``given`` itself when it holds a commit record (or nothing to expand), else its
    ``instance=<u>/`` children and any other child holding a commit record (a renamed or copied
    release is read, and so refused as a second release of its instance, never skipped)."""
    given = given.rstrip("/") or "/"
    if not os.path.isdir(given):
        raise UsageError(f"--input {given}: no such directory")
    if os.path.exists(os.path.join(given, release.COMMIT_FILE)):
        return [given]
    children = sorted(
        os.path.join(given, name)
        for name in os.listdir(given)
        if os.path.isdir(os.path.join(given, name))
        and (
            _INSTANCE_DIR.fullmatch(name)
            or os.path.exists(os.path.join(given, name, release.COMMIT_FILE))
        )
    )
    return children or [given]


def _commit_deletion(path: str, parameters: Mapping[str, Any]) -> tuple[float, float] | None:
    if "deletion_epsilon" not in parameters or "deletion_delta" not in parameters:
        raise UsageError(f"{path}: parameters state no deletion_epsilon/deletion_delta")
    epsilon, delta = parameters["deletion_epsilon"], parameters["deletion_delta"]
    if epsilon is None and delta is None:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (epsilon, delta)):
        raise UsageError(f"{path}: deletion_epsilon and deletion_delta must both be numbers")
    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
        raise UsageError(f"{path}: deletion (ε {epsilon}, δ {delta}) is not ε > 0, δ in (0, 1)")
    return float(epsilon), float(delta)


class ReleaseSelection:
    """What the driver takes from the releases' crowds, gathered in the one pass that verifies
    them (``open_release``): the crowd keys that get pictures (``pictures.PicturedCrowds``: the
    first released crowds of known recipes in the summary's order), about how many histogram
    rows the released crowds give (dense domains in full) and how many crowds there are (the
    largest release's figures, as the instances release mostly the same crowds) and how many
    crowds the largest analysis unit (a kind and window: ``arithmetic.bucket_key`` without the
    bucket) holds, which sizes the analyzer's buckets (:meth:`unit_crowds`). Holds nothing per
    crowd: a count per instance, kind and window."""

    def __init__(self, book: arithmetic.RecipeBook, pictures_wanted: bool = True) -> None:
        self.book = book
        self.pictures_wanted = pictures_wanted
        self._pictured = pictures.PicturedCrowds(pictures.MAX_PICTURED_CROWDS)
        self._sizes: dict[str, int] = {}
        self._rows: dict[Any, int] = {}
        self._crowds: dict[Any, int] = {}
        self._units: dict[tuple, int] = {}
        self._waiting: list[CrowdColumns] = []  # tables whose picture candidates are not found
        self._waiting_rows = 0

    def add(self, instance: Any, crowds: Sequence[Mapping[str, Any]]) -> None:
        """One crowd table's rows of release ``instance``: counted per recipe, window and
        status (a table holds a few of those), then added per group; of the crowds that may be
        pictured, only the few ``pictures.picture_candidates`` finds are looked at one by one."""
        self._crowds[instance] = self._crowds.get(instance, 0) + len(crowds)
        if isinstance(crowds, CrowdColumns):  # counted by Arrow, no dict per crowd
            groups: Counter = Counter()
            names = ("recipe_id", "window_start_ms", "window_end_ms", "status")
            for (recipe_id, start, stop, status), count in crowds.count_by(names).items():
                groups[(recipe_id, start, stop, status == "released")] += count
        else:
            groups = Counter(
                (
                    c["recipe_id"],
                    c["window_start_ms"],
                    c["window_end_ms"],
                    c["status"] == "released",
                )
                for c in crowds
            )
        units = self._units
        for (recipe_id, start, stop, released), count in groups.items():
            recipe = self.book.get(recipe_id)
            longitudinal = recipe is not None and arithmetic.is_longitudinal(recipe)
            if longitudinal:
                unit = (instance, arithmetic.LONGITUDINAL, 0, stop - start)  # rounds span windows
            else:
                unit = (instance, arithmetic.HISTOGRAM, start, stop)
            units[unit] = units.get(unit, 0) + count
            if not released or recipe is None or longitudinal:
                continue
            if recipe.id not in self._sizes:
                domain = recipe.build_randomizer().domain_size
                self._sizes[recipe.id] = min(domain, arithmetic.DENSE_LIMIT)
            self._rows[instance] = self._rows.get(instance, 0) + self._sizes[recipe.id] * count
        if not self.pictures_wanted:
            return
        if isinstance(crowds, CrowdColumns):  # a batch of tables at a time: Arrow's calls
            self._waiting.append(crowds)  # cost about as much on a table as on many
            self._waiting_rows += len(crowds)
            if self._waiting_rows >= PICTURE_BATCH_ROWS:
                self._add_waiting()
            return
        self._add_crowds(crowds)

    def _add_crowds(self, crowds: Sequence[Mapping[str, Any]]) -> None:
        """Every released crowd of a known recipe, one by one, to the pictured crowds."""
        for crowd in crowds:
            recipe = self.book.get(crowd["recipe_id"])
            if crowd["status"] == "released" and recipe is not None:
                self._pictured.add(arithmetic.crowd_key(recipe, crowd))

    def _add_waiting(self) -> None:
        """The waiting tables' candidates (``pictures.picture_candidates``) to the pictured
        crowds; crowd by crowd where Arrow cannot find them."""
        waiting, self._waiting, self._waiting_rows = self._waiting, [], 0
        if not waiting:
            return
        try:
            table = pa.concat_tables([pa.table(crowds.table) for crowds in waiting])
            keys = pictures.picture_candidates(table, self.book, self._pictured.limit)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # tables of different schemas
            keys = None
        if keys is None:
            for crowds in waiting:
                self._add_crowds(crowds)
            return
        for key in keys:
            self._pictured.add(key)

    def unit_crowds(self) -> int:
        """The most crowds (released or withheld) one instance holds in one analysis unit: the
        size ``arithmetic.analyzer_buckets`` keeps each bucket of a unit under a thousand
        crowds with (crowds spread over many windows need no more buckets than one window's)."""
        return max(self._units.values(), default=0)

    def result(self) -> tuple[frozenset, int, int]:
        """(pictured crowd keys, histogram rows, crowds)."""
        self._add_waiting()
        return (
            self._pictured.chosen() if self.pictures_wanted else frozenset(),
            max(self._rows.values(), default=0),
            max(self._crowds.values(), default=0),
        )


def open_release(
    directory: str,
    shuffler_keys: ShufflerKeys | None = None,
    selection: ReleaseSelection | None = None,
    count_messages: bool = True,
) -> Release:
    """Verify ``directory`` against its commit record (and its signature, given the shufflers'
    keys) and its crowd tables against its message files, one bucket at a time; UsageError (one
    line) if it may not be read. One pass: each crowd table is read once, checked, compared with
    its bucket's messages (``release_counts.check_crowd_counts``; not with ``count_messages``
    False, when the pipeline compares them: ``release_counts.CheckCrowdCounts``) and handed to
    ``selection``."""
    commit_path = os.path.join(directory, release.COMMIT_FILE)
    digest = release.sha256_of(commit_path) if os.path.isfile(commit_path) else None

    def visit(commit: Mapping[str, Any], table: str, crowds: Any, files: Any) -> None:
        if count_messages:
            check_crowd_counts(directory, crowds, files)
        if selection is not None:
            selection.add(commit.get("instance"), crowds)

    try:
        verified = release.verify_release(
            directory, shuffler_keys=shuffler_keys, on_crowd_table=visit
        )
    except release.ReleaseError as error:
        message = str(error)
        if directory not in message:
            message = f"{directory}: {message}"
        raise UsageError(f"refusing release: {message}") from None
    commit = verified.commit
    path = os.path.join(directory, release.COMMIT_FILE)
    if commit.get("format") != release.RELEASE_FORMAT:
        raise UsageError(f"{path}: format {commit.get('format')!r} is not a shuffler release")
    instance = commit.get("instance")
    if not isinstance(instance, int) or isinstance(instance, bool) or instance < 0:
        raise UsageError(f"{path}: states no shuffler instance (an int >= 0)")
    if digest is None or release.sha256_of(commit_path) != digest:
        raise UsageError(f"refusing release: {commit_path} changed while it was verified")
    parameters = commit["parameters"]
    return Release(
        instance=instance,
        path=directory,
        commit=commit,
        files=tuple(
            path
            for path, entry in zip(verified.files, verified.entries, strict=True)
            if not entry.path.startswith(CROWDS_DIR + "/")
        ),
        deletion=_commit_deletion(path, parameters),
        crowd_threshold=parameters.get("crowd_threshold"),
        signed_by=verified.signed_by,
        commit_sha256=digest,
        entries=verified.entries,
    )


def discover_releases(
    inputs: Sequence[str],
    shuffler_keys: ShufflerKeys | None = None,
    selection: ReleaseSelection | None = None,
    count_messages: bool = True,
) -> list[Release]:
    """The verified releases ``--input`` names (see the module docstring and
    :func:`open_release`); UsageError when one is refused or two releases claim one instance."""
    if not inputs:
        raise UsageError("--input is required (a release, or a directory of instance=<u>/)")
    releases = [
        open_release(path, shuffler_keys, selection, count_messages)
        for given in inputs
        for path in _release_dirs(given)
    ]
    seen: dict[int, str] = {}
    for item in releases:
        if item.instance in seen:
            raise UsageError(
                f"instance {item.instance} released twice: {seen[item.instance]} and {item.path}"
            )
        seen[item.instance] = item.path
    return sorted(releases, key=lambda r: r.instance)


def check_deletion_flags(releases: Sequence[Release], stated: tuple[float, float] | None) -> None:
    """``--deletion-epsilon/--deletion-delta``, when given, must match every commit record (the
    report's deletion comes from the commit records only)."""
    for item in releases:
        if stated is not None and item.deletion != stated:
            raise UsageError(
                f"{item.path}/{release.COMMIT_FILE} states deletion {item.deletion}, not the "
                f"--deletion-epsilon/--deletion-delta given {stated}"
            )


def commit_authentication(releases: Sequence[Release], shuffler_keys: str | None) -> str:
    """One line for the summary: whether the commit records (hence every n) were authenticated."""
    if shuffler_keys is None:
        return (
            "NOT authenticated: commit records (and so each n and epsilon_c) were read without "
            "checking shuffler signatures (no --shuffler-keys)"
        )
    signed = ", ".join(f"instance {r.instance} by key {r.signed_by}" for r in releases)
    return f"authenticated: Ed25519 signatures verified with {shuffler_keys} ({signed})"


def recipe_book(names: Sequence[str] | None) -> arithmetic.RecipeBook:
    """The recipes to accept: the named ones, or every shipped recipe."""
    if not names:
        return arithmetic.RecipeBook(shipped_recipes())
    recipes = []
    for name in names:
        try:
            recipes.append(load_recipe(name))
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot load recipe {name!r}: {error}") from error
    return arithmetic.RecipeBook(recipes)


def truth_sources(
    truths: Sequence[str] | None, truth_recipe: str | None
) -> tuple[TruthSource, ...]:
    """``--truth`` (repeatable): simulation directories (their simulation.json names the recipe)
    or truth.parquet files."""
    return tuple(truth_source(truth, truth_recipe) for truth in truths or ())


def truth_source(truth: str, truth_recipe: str | None) -> TruthSource:
    """One ``--truth``: a simulation directory or a truth.parquet file."""
    truth = truth.rstrip("/")
    if truth.endswith(".parquet"):
        path, directory = truth, truth.rsplit("/", 1)[0] if "/" in truth else "."
    else:
        path, directory = FileSystems.join(truth, "truth.parquet"), truth
    if not _exists(path):
        raise UsageError(f"--truth: no {path!r}")
    if FileSystems.get_scheme(path) is None and not os.path.isfile(path):
        raise UsageError(f"--truth: {path!r} is {kind_of(os.stat(path).st_mode)}, not a file")
    recipe_id = truth_recipe
    if recipe_id is None:
        simulation = _read_json(FileSystems.join(directory, "simulation.json")) or {}
        recipe_id = simulation.get("recipe_id")
    if not recipe_id:
        raise UsageError("--truth: no simulation.json beside it; give --truth-recipe NAME@VERSION")
    return TruthSource(path, recipe_id)


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------


def _prepare_output(output: str | None, overwrite: bool) -> str:
    if not output:
        raise UsageError("--output DIR is required")
    existing = [
        name
        for name in (SUMMARY_FILE, HISTOGRAMS_FILE, LONGITUDINAL_FILE, "dead_letter", PICTURES_DIR)
        if _exists(FileSystems.join(output, name))
    ]
    if existing and not overwrite:
        raise UsageError(f"--output {output!r} already holds results ({existing[0]}); --overwrite")
    if existing:
        FileSystems.delete([FileSystems.join(output, name) for name in existing])
    return output


RESULT_NAMES = (
    SUMMARY_FILE,
    HISTOGRAMS_FILE,
    LONGITUDINAL_FILE,
    REPORTS_DIR,
    WITHHELD_DIR,
    "dead_letter",
    PICTURES_DIR,
)


def remove_results(output: str) -> None:
    """Remove what a failed analysis wrote into ``output`` (its result names only: the folder
    may hold other things); a path that cannot be removed is left."""
    for name in RESULT_NAMES:
        path = FileSystems.join(output, name)
        if _exists(path):
            with contextlib.suppress(Exception):
                FileSystems.delete([path])


def analysis_spill_dir(output: str, temp_location: str | None) -> str:
    """Where the estimates' batches are spilled while the analysis runs (removed by ``run`` on
    success and on failure): ``<--temp_location>/esa-analysis/<digest of OUTPUT>`` when the
    runner was given a temp location, else ``OUTPUT/_batches``. They hold estimates only."""
    if temp_location:
        return temp_location_root(temp_location, "esa-analysis", output)
    return FileSystems.join(output, SPILL_DIR)


def worker_processes(
    messages: int, sealed_messages: int, crowds: int = 0, forked: bool = True
) -> int:
    """Worker processes an analysis of ``messages`` (``sealed_messages`` of them sealed) and
    ``crowds`` crowds (the most one instance released or withheld) is spread over when no
    runner was chosen (``with_default_runner``): one per CPU, at most ``MAX_WORKER_PROCESSES``,
    from ``SPREAD_MIN_SEALED_MESSAGES`` sealed messages or ``SPREAD_MIN_MESSAGES`` in all;
    else, where the workers would be ``forked`` (``forked_workers.workers_would_fork``: a
    spawned worker's start, seconds, is more than a share of crowds saves), one per
    ``CROWDS_PER_WORKER`` crowds from two of them (at most one per CPU); else 1 (this
    process)."""
    most = min(os.cpu_count() or 1, MAX_WORKER_PROCESSES)
    if sealed_messages >= SPREAD_MIN_SEALED_MESSAGES or messages >= SPREAD_MIN_MESSAGES:
        return most
    by_crowds = max(0, int(crowds)) // CROWDS_PER_WORKER
    return min(most, by_crowds) if by_crowds >= 2 and forked else 1


def run(
    options: PipelineOptions, messages_total: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Run the analyzer; returns summary.json's content (plus ``pictures`` and ``seconds``).
    ``messages_total`` is told the messages the verified releases state (their commit records'
    ``records_released``, which their crowd tables add up to) before the pipeline reads them:
    the progress line's total."""
    values = options.view_as(AnalyzeOptions)
    if (values.analyze_deletion_epsilon is None) != (values.analyze_deletion_delta is None):
        raise UsageError("--deletion-epsilon and --deletion-delta go together")
    stated = None
    if values.analyze_deletion_epsilon is not None:
        stated = (values.analyze_deletion_epsilon, values.analyze_deletion_delta)
    shuffler_keys = analyzer_key_flags.load_shuffler_keys(values.analyze_shuffler_keys)
    book = recipe_book(values.analyze_recipe)
    # Driver-side per crowd: nothing but bounded results of the one pass that verifies the
    # releases (the pictured crowd keys, the table-size estimate for the number of parts); the
    # respondent counts and withheld crowds are read from the verified releases by workers.
    selection = ReleaseSelection(book, not values.analyze_no_pictures)
    # The crowd tables against the messages: checked by the pipeline as it decodes them.
    releases = discover_releases(values.analyze_input or [], shuffler_keys, selection, False)
    runs_ledger.check_runs(releases, values.analyze_runs_ledger)
    check_deletion_flags(releases, stated)
    output = _prepare_output(values.analyze_output, values.analyze_overwrite)
    message_files = sum(len(r.files) for r in releases)
    messages = sum(int(r.commit.get("records_released") or 0) for r in releases)
    if messages_total is not None:
        messages_total(messages)
    analyzer_key_flags.check_key_ring(values.analyze_key_ring)  # one-line error before the pipeline
    sealed = release_keys.check_release_keys(releases, values.analyze_key_ring)
    pictured, rows, crowds = selection.result()
    config = AnalysisConfig(
        book=book,
        postprocessing=values.analyze_postprocessing,
        failure_probability=values.analyze_failure_probability,
        deletion={r.instance: r.deletion for r in releases if r.deletion is not None},
        truth=truth_sources(values.analyze_truth, values.analyze_truth_recipe),
        pictured=pictured,
    )
    parts = analysis_parts(rows, crowds)
    accepted = releases  # their full commit records, for the runs ledger
    releases = [
        replace(r, commit={k: v for k, v in r.commit.items() if k not in ("crowds", "files")})
        for r in releases
    ]
    inputs = {
        "releases": [
            {
                "instance": r.instance,
                "path": r.path,
                "crowd_threshold": r.crowd_threshold,
                "deletion": None if r.deletion is None else list(r.deletion),
                "files": len(r.files),
                "records_released": r.commit.get("records_released"),
            }
            for r in releases
        ],
        "message_files": message_files,
        "recipes": book.ids(),
        "truth": [source.path for source in config.truth],
        "postprocessing": config.postprocessing,
        "deletion": {str(u): list(d) for u, d in config.deletion.items()},
        "commit_records": commit_authentication(releases, values.analyze_shuffler_keys),
        "replays": runs_ledger.ledger_line(values.analyze_runs_ledger),
        "output": output,
    }
    with_default_runner(
        options, worker_processes(messages, sealed, crowds, forked_workers.workers_would_fork())
    )
    range_records = values.analyze_range_records
    workers = worker_processes_of(options)
    if workers > 1:
        # Each worker is handed a fixed share of the ranges (round robin): many small ones even
        # the shares out.
        share = math.ceil(messages / (workers * RANGES_PER_WORKER))
        range_records = max(1, min(range_records, share))
    started = time.monotonic()
    pipeline = new_pipeline(options)
    # Workers read the committed message files and crowd tables from each commit record, pinned
    # to the SHA-256 the driver verified: nothing per file or crowd is pickled into the job.
    # (Not reshuffled: SpreadFiles and SpreadTables spread what each record lists.)
    commits = pipeline | "CommitRecords" >> beam.Create(
        [(r.instance, r.path, r.commit_sha256) for r in releases], reshuffle=False
    )
    release_files = (
        commits
        | "ReleaseFiles" >> beam.FlatMap(pinned_message_paths)
        | "SpreadFiles" >> beam.Reshuffle()
    )
    # The crowds come from the crowd tables the records commit, each read by a worker if its
    # SHA-256 is the committed one, a few tables at a time (decoded together).
    crowd_tables = (
        commits
        | "CrowdTables" >> beam.FlatMap(pinned_crowd_table_groups)
        | "SpreadTables" >> beam.Reshuffle()
    )
    aggregated = (release_files, crowd_tables) | "Aggregate" >> AggregateReleases(
        book,
        SUPPORTED_SCHEMA_VERSIONS,
        batch_records=values.analyze_batch_records,
        range_records=range_records,
        dense_limit=values.analyze_dense_limit,
        key_ring=values.analyze_key_ring,  # a path: workers read the keys (sealed payloads)
        # a bucket's size does not grow with the crowds (nor with a unit's)
        buckets=arithmetic.analyzer_buckets(selection.unit_crowds()),
        read_crowd_groups=pinned_crowd_table_group_records,
        part_bucket=table_analyzer_bucket,  # no crowd hashed when the bucket counts divide
        # the same for message files, with each release's crowd_buckets
        release_buckets={r.path: commit_crowd_buckets(r.commit) for r in releases},
        stated_bucket=crowd_table_bucket,  # the count check's figures, from the same read
    )
    # The estimates' batches are spilled to files; the groupings into parts carry their paths.
    spill_dir = analysis_spill_dir(output, options.view_as(GoogleCloudOptions).temp_location)
    # Nothing is estimated, written or drawn until every bucket's files agree with its crowd
    # table: the check is a side input of the steps that feed every output (a side input is
    # complete before its consumer runs), which fail on a problem, and the driver refuses the
    # release; no result of a refused release is ever written, not even for a while.
    problems = (
        aggregated.crowd_records,
        aggregated.stated_records,
    ) | "CheckCrowdCounts" >> CheckCrowdCounts()
    checked = beam.pvalue.AsList(problems)
    buckets = aggregated.buckets | "OnlyAgreeingBuckets" >> beam.Map(
        refuse_on_problems, checked, spill_dir
    )
    # The crowd sizes' privacy is evaluated for agreeing releases only, like the rest: a
    # refused release costs no evaluation.
    sizes = aggregated.crowd_sizes | "OnlyAgreeingSizes" >> beam.Map(
        refuse_on_problems, checked, spill_dir
    )
    estimates = buckets | "EstimateBuckets" >> EstimateBuckets(
        config, parts, spill_dir=spill_dir, sizes=sizes
    )
    letters = aggregated.dead_letters | "OnlyAgreeingDeadLetters" >> beam.Map(
        refuse_on_problems, checked, spill_dir
    )
    _ = letters | "WriteDeadLetters" >> WriteDeadLetters(output)
    counts = aggregated.counts | "RefuseDisagreeingReleases" >> beam.Map(
        refuse_on_problems, checked, spill_dir
    )
    _ = (estimates, counts) | "WriteAnalysis" >> WriteAnalysis(output, config, inputs, parts=parts)
    if config.pictured:
        # The pictured crowds are the first in the summary's order, a few crowd IDs over their
        # windows: a few buckets, so mostly one worker's. Drawing one takes ~0.1 s (matplotlib),
        # so they are spread over the workers first (24 took 3.5 s of one worker of two).
        _ = (
            estimates.pictures
            | "SpreadPictures" >> beam.Reshuffle()
            | "DrawPictures" >> beam.ParDo(pictures.DrawPictures(output, book))
        )
    try:
        pipeline.run().wait_until_finish()
    except BaseException:
        refusal = read_refusal(spill_dir)
        remove_results(output)  # nothing half-written stays (nor makes the next run refuse)
        if refusal is not None:
            raise UsageError(refusal) from None
        raise
    finally:  # failed attempts' temporary part files (transforms/common/atomic_files.py)
        for table in (HISTOGRAMS_FILE, LONGITUDINAL_FILE, REPORTS_DIR, WITHHELD_DIR):
            atomic_files.remove_temporary(FileSystems.join(output, table))
        if _exists(spill_dir):  # the estimates' spilled batches
            FileSystems.delete([spill_dir])
    summary = _read_json(FileSystems.join(output, SUMMARY_FILE))
    if summary is None:
        raise RuntimeError(f"the pipeline finished without writing {output}/{SUMMARY_FILE}")
    runs_ledger.record_runs(accepted, values.analyze_runs_ledger)
    summary["seconds"] = round(time.monotonic() - started, 3)
    summary["pictures"] = sorted(
        str(path) for path in Path(output, pictures.PICTURES_DIR).glob("*.png")
    )
    return summary


# ---------------------------------------------------------------------------------------------
# The short table
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _count(value: Any) -> str:
    return "-" if value is None else f"{float(value):,.0f}"


# The console table shows the crowds of the first report parts, at least this many.
TABLE_CROWDS = 40
TABLE_LEGEND = (
    "n: the respondents eps_c is computed for (the fewest any shuffler instance released); "
    "n_eff: sum of pi_u n_u, the crowd the estimates are de-biased with.\n"
    "eps_c: from shuffling alone; eps_c+del: with each instance's randomized deletion composed "
    "in (- without deletion); eps_c 1-msg: eps_c if each report were one message (no "
    "attribute fragmentation, Table X).\n"
    "s.e. (rms): the estimator's standard error, which RMSE against the truth should match; "
    "error bound: Theorem 6's bound on longitudinal estimates (95 %). report.html explains more."
)


def summary_table(
    summary: Mapping[str, Any], reports: Mapping[str, list[dict[str, Any]]] | None = None
) -> str:
    """The short table ``esa analyze``/``esa run`` print: per crowd ε_ℓ, ε_c (bound), n, RMSE.

    ``reports``: ``analysis_reports.read_reports`` lists; by default those of the first parts of
    the analysis in ``summary["inputs"]["output"]`` (at least :data:`TABLE_CROWDS` crowds)."""
    if reports is None:
        reports = read_reports(summary["inputs"]["output"], TABLE_CROWDS)
    header = (
        "crowd", "window", "n", "n_eff", "eps_l_inf", "eps_l_1", "eps_c", "eps_c+del", "bound",
        "eps_c 1-msg", "RMSE", "s.e. (rms)", "error bound",
    )  # fmt: skip
    rows = []
    for crowd in reports["histograms"] + reports["longitudinal"]:
        privacy = crowd.get("privacy", {})
        accuracy = crowd.get("accuracy", {})
        longitudinal = crowd.get("kind") == "longitudinal"
        rows.append(
            (
                pictures.slug(crowd["channel"], crowd["crowd_id"])
                + (" (f̃_t)" if longitudinal else ""),
                pictures.day(crowd["round_start" if longitudinal else "window_start"]),
                _count(privacy.get("respondents")),
                _count(privacy.get("respondents_effective")),
                _fmt(privacy.get("epsilon_local_all")),
                _fmt(privacy.get("epsilon_local_one")),
                _fmt(privacy.get("epsilon_central")),
                _fmt(privacy.get("epsilon_central_total")) if privacy.get("deletion") else "-",
                _fmt(privacy.get("bound")),
                _fmt(privacy.get("epsilon_central_without_attribute_fragmentation")),
                _fmt(accuracy.get("rmse"), ".4g"),
                _fmt(accuracy.get("stderr_rms"), ".4g"),
                f"{crowd['error_bound']:,.0f}" if longitudinal else "-",
            )
        )
    lines = []
    if rows:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for row in rows:
            lines.append("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
        lines.append(TABLE_LEGEND)
    else:
        lines.append("no crowd was estimated")
    for note in withheld_reasons.explain_withheld_in(reports["withheld"], summary):
        lines.append(
            f"note: {note['channel']} {note['crowd_id'] or ''} {pictures.day(note['window_start'])}: "
            f"{note['note']}: {note['reason']}"
        )
    totals = summary.get("reports", {})
    shown = len(reports["histograms"]) + len(reports["longitudinal"])
    more = totals.get("histograms", 0) + totals.get("longitudinal", 0) - shown
    if more > 0:
        lines.append(f"... and {more:,} more in {totals.get('path')}/")
    authentication = summary.get("inputs", {}).get("commit_records")
    if authentication:
        lines.append(f"commit records {authentication}")
    replays = summary.get("inputs", {}).get("replays")
    if replays:
        lines.append(f"replays {replays}")
    metrics = summary.get("metrics", {})
    lines.append(
        f"messages read {metrics.get('read', 0):,}: randomized {metrics.get('messages', 0):,}, "
        f"dead-lettered {metrics.get('dead_lettered', 0):,}"
        + (f", chaff discarded {metrics['chaff']:,}" if metrics.get("chaff") else "")
    )
    return "\n".join(lines)

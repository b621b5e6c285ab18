"""``esa aggregate``: one of the two Prio3 aggregators of a prio3 recipe, in two phases.

    esa aggregate --aggregator J --phase verify --input RELEASE... --recipe R
        --key-ring KEYS_J --verify-key VERIFY_KEY --output DIR_J [--run-id ID]
    esa aggregate --aggregator J --phase finish --output DIR_J --peer DIR_OTHER
        --analyzer-key ANALYZER.public.json [--min-batch N]

samplable-anonymous-aggregation §3.1.2, §4.4.1. The two aggregators run side by side:

1. ``verify``: reads the committed shuffler releases (``--input``: each checked against its
   commit record, and its signature given ``--shuffler-keys``), opens its own input share of every report with its key ring, and writes its
   verifier shares (``DIR/verifier_shares/``, for the other aggregator), its verification states
   (``DIR/private/states/``) and ``DIR/verify.json``: per window and crowd the number of reports
   it initialized and their report-id checksum, and the run id (default: derived from the
   releases' commit records, so both aggregators state the same one).
2. the aggregators exchange ``verifier_shares/`` and ``verify.json`` (``--peer`` names the other's
   directory);
3. ``finish``: joins its states with both aggregators' verifier shares, decides each report's
   proof (a device that sent shares of a non-valid vector is dead-lettered ``prio3_invalid`` and
   never counted), sums the output shares per window and crowd, and publishes in
   ``DIR/aggregate.json`` each crowd's aggregate share sealed to the analyzer
   (``schemas.crypto.prio3_reports``: bound to aggregator, run, recipe, window, crowd, count and
   checksum) only if both aggregators' ``verify.json`` state the same count and checksum for it
   and it holds at least ``--min-batch`` valid reports (default: the recipe's min_crowd_size);
   others are listed as withheld with the reason; with ``--signing-key`` the record is signed
   like a shuffler's commit record (Ed25519, ``schemas.crypto.commit_signing``) and written in
   one step. Then its verification states are deleted.

Rejected records go to ``DIR/private/dead_letters-<phase>/`` with their reason; counters add up
(read = initialized + rejected; initialized = verified + rejected in phase 2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline.flags import with_default_runner
from pipelines.commandline.main import UsageError
from pipelines.engines.new_pipeline import new_pipeline
from schemas.crypto.analyzer_keys import KeyError_, KeyRing, load_public_key
from schemas.crypto.commit_signing import SignatureError, sign_commit
from schemas.crypto.prio3_reports import seal_aggregate_share
from schemas.crypto.signing_keys import load_signing_key
from schemas.crypto.vdaf import VDAF_DRAFT
from schemas.crypto.verify_keys import load_verify_key
from schemas.recipes import RecipeError, load_recipe, recipe_from_dict
from schemas.release import commit as release_commit
from transforms.aggregators.phases import (
    STATE_SCHEMA,
    VERIFIER_SHARE_SCHEMA,
    FinishShares,
    OpenShares,
)
from transforms.aggregators.shares import AggregatorSpec, CrowdKey, summary_line

__all__ = ["register", "run_verify", "run_finish", "VERIFY_FILE", "AGGREGATE_FILE"]

VERIFY_FILE = "verify.json"
AGGREGATE_FILE = "aggregate.json"
VERIFY_FORMAT = "esa-prio3-verify/1"
AGGREGATE_FORMAT = "esa-prio3-aggregate/1"
VERIFIER_SHARES_DIR = "verifier_shares"
STATES_DIR = os.path.join("private", "states")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "aggregate",
        help="A Prio3 aggregator (prio3 recipes): verify shares, then publish a sealed sum.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--aggregator", type=int, choices=(0, 1), required=True)
    parser.add_argument("--phase", choices=("verify", "finish"), required=True)
    parser.add_argument("--output", required=True, help="This aggregator's directory.")
    parser.add_argument("--input", action="append", help="Shuffler release(s) (phase verify).")
    parser.add_argument("--recipe", help="The prio3 recipe (name or JSON file; phase verify).")
    parser.add_argument("--key-ring", help="This aggregator's private key file or directory.")
    parser.add_argument("--verify-key", help="The verify key file both aggregators share.")
    parser.add_argument("--shuffler-keys", help="Require the releases' commit signatures.")
    parser.add_argument("--run-id", help="Default: derived from the releases' commit records.")
    parser.add_argument("--peer", help="The other aggregator's directory (phase finish).")
    parser.add_argument("--analyzer-key", help="The analyzer's public key file (phase finish).")
    parser.add_argument("--min-batch", type=int, help="Default: the recipe's min_crowd_size.")
    parser.add_argument(
        "--signing-key",
        help="Phase finish: sign aggregate.json with this Ed25519 key (esa keys generate "
        "--shuffler-instance J makes one; J is this aggregator's index). Default: unsigned.",
    )
    parser.add_argument("--overwrite", action="store_true", help="Replace an earlier phase 1.")
    parser.set_defaults(handler=_handle, accepts_pipeline_args=True)


def _handle(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    options = with_default_runner(PipelineOptions(pipeline_args))
    if args.phase == "verify":
        for name in ("input", "recipe", "key_ring", "verify_key"):
            if not getattr(args, name):
                raise UsageError(f"--phase verify needs --{name.replace('_', '-')}")
        summary = run_verify(
            args.aggregator,
            args.input,
            args.recipe,
            args.key_ring,
            args.verify_key,
            args.output,
            options,
            run_id=args.run_id,
            shuffler_keys=args.shuffler_keys,
            overwrite=args.overwrite,
        )
    else:
        for name in ("peer", "analyzer_key"):
            if not getattr(args, name):
                raise UsageError(f"--phase finish needs --{name.replace('_', '-')}")
        summary = run_finish(
            args.aggregator,
            args.output,
            args.peer,
            args.analyzer_key,
            options,
            args.min_batch,
            signing_key=args.signing_key,
        )
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0 if summary["adds_up"] else 1


@dataclass(frozen=True)
class _Release:
    path: str
    commit_sha256: str
    message_files: tuple[str, ...]


def _release_dirs(given: str) -> list[str]:
    """``given`` when it holds a commit record, else its children that do."""
    if not os.path.isdir(given):
        raise UsageError(f"--input {given}: no such directory")
    if os.path.exists(os.path.join(given, release_commit.COMMIT_FILE)):
        return [given]
    return sorted(
        os.path.join(given, name)
        for name in os.listdir(given)
        if os.path.exists(os.path.join(given, name, release_commit.COMMIT_FILE))
    ) or [given]


def verified_releases(inputs: list[str], shuffler_keys: Any = None) -> list[_Release]:
    """The shuffler releases ``--input`` names, each checked against its commit record (and its
    signature, given the shufflers' keys: ``schemas.release.commit.verify_release``); only the
    committed message files are read. UsageError (one line) for a release that may not be."""
    releases = []
    for given in inputs:
        for directory in _release_dirs(given.rstrip("/") or "/"):
            commit_path = os.path.join(directory, release_commit.COMMIT_FILE)
            try:
                digest = release_commit.sha256_of(commit_path)
                verified = release_commit.verify_release(
                    directory,
                    formats=(release_commit.RELEASE_FORMAT,),
                    shuffler_keys=shuffler_keys,
                )
            except (release_commit.ReleaseError, OSError) as error:
                raise UsageError(f"refusing release {directory}: {error}") from None
            files = tuple(
                path
                for path, entry in zip(verified.files, verified.entries, strict=True)
                if entry.path.startswith("messages/")
            )
            releases.append(_Release(directory, digest, files))
    if not releases:
        raise UsageError("--input names no release")
    return releases


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{what} {path}: cannot be read: {error}") from None


def _counters(result: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for counter in result.metrics().query()["counters"]:
        if counter.key.metric.namespace == "esa.aggregate":
            name = counter.key.metric.name
            counts[name] = counts.get(name, 0) + int(counter.committed or counter.attempted or 0)
    return counts


def _write_dead_letters(collection: beam.PCollection, directory: Path, label: str) -> None:
    (
        collection
        | f"{label}Json" >> beam.Map(lambda letter: json.dumps(letter, sort_keys=True, default=str))
        | f"{label}Write" >> beam.io.WriteToText(str(directory / "part"), file_name_suffix=".jsonl")
    )


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("part*"))
        for line in path.read_text().splitlines()
        if line
    ]


# -- phase 1 -----------------------------------------------------------------------------------


def run_verify(
    agg_id: int,
    inputs: list[str],
    recipe_name: str,
    key_ring: str,
    verify_key: str,
    output: str,
    options: PipelineOptions,
    run_id: str | None = None,
    shuffler_keys: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        recipe = load_recipe(recipe_name)
    except RecipeError as error:
        raise UsageError(str(error)) from None
    if not recipe.is_prio3:
        raise UsageError(f"--recipe {recipe.id} is not a prio3 recipe")
    try:
        KeyRing.load(key_ring)
        load_verify_key(verify_key)
    except KeyError_ as error:
        raise UsageError(str(error)) from None
    keys = None
    if shuffler_keys:
        from pipelines.commandline.analyzer_key_flags import load_shuffler_keys

        keys = load_shuffler_keys(shuffler_keys)
    releases = verified_releases(inputs, keys)
    if run_id is None:
        digests = sorted(str(r.commit_sha256) for r in releases)
        run_id = hashlib.sha256("\n".join(digests).encode()).hexdigest()[:32]
    directory = Path(output)
    if directory.exists() and any(directory.iterdir()):
        if not overwrite:
            raise UsageError(f"--output {output} exists and is not empty; pass --overwrite")
        shutil.rmtree(directory)
    scratch = directory / "private" / "scratch"
    scratch.mkdir(parents=True)
    spec = AggregatorSpec(agg_id, recipe.to_json(), str(key_ring), str(verify_key))
    paths = [path for r in releases for path in r.message_files]
    pipeline = new_pipeline(options)
    phase = (
        pipeline | "Paths" >> beam.Create(paths, reshuffle=False) | "OpenShares" >> OpenShares(spec)
    )
    phase.verifier_shares | "WriteVerifierShares" >> beam.io.WriteToAvro(
        str(directory / VERIFIER_SHARES_DIR / "part"),
        schema=VERIFIER_SHARE_SCHEMA,
        file_name_suffix=".avro",
    )
    phase.states | "WriteStates" >> beam.io.WriteToAvro(
        str(directory / STATES_DIR / "part"), schema=STATE_SCHEMA, file_name_suffix=".avro"
    )
    (
        phase.summaries
        | "SummaryJson"
        >> beam.MapTuple(
            lambda key, value: json.dumps(summary_line(CrowdKey(*key), value[0], value[1]))
        )
        | "WriteSummary" >> beam.io.WriteToText(str(scratch / "part"), file_name_suffix=".jsonl")
    )
    _write_dead_letters(phase.dead_letters, directory / "private" / "dead_letters-verify", "Dead")
    result = pipeline.run()
    result.wait_until_finish()
    counts = _counters(result)
    crowds = sorted(
        _lines(scratch), key=lambda c: (c["window_start"], c["crowd_id"] or "", c["window_end"])
    )
    shutil.rmtree(scratch)
    rejected = sum(v for k, v in counts.items() if k.startswith("rejected_"))
    record = {
        "format": VERIFY_FORMAT,
        "aggregator": agg_id,
        "run_id": run_id,
        "recipe": json.loads(recipe.to_json()),
        "recipe_id": recipe.id,
        "vdaf_draft": VDAF_DRAFT,
        "releases": [r.path for r in releases],
        "crowds": crowds,
    }
    (directory / VERIFY_FILE).write_text(json.dumps(record, indent=2) + "\n")
    read, initialized = counts.get("read", 0), counts.get("initialized", 0)
    return {
        "phase": "verify",
        "aggregator": agg_id,
        "run_id": run_id,
        "read": read,
        "initialized": initialized,
        "rejected": rejected,
        "rejected_by_reason": {
            k.removeprefix("rejected_"): v for k, v in counts.items() if k.startswith("rejected_")
        },
        "crowds": len(crowds),
        "adds_up": read == initialized + rejected,
        "seconds": round(time.perf_counter() - started, 3),
    }


# -- phase 2 -----------------------------------------------------------------------------------


def _crowd_key(entry: dict[str, Any]) -> CrowdKey:
    return CrowdKey(int(entry["window_start"]), int(entry["window_end"]), entry["crowd_id"])


def agreed_crowds(own: dict[str, Any], peer: dict[str, Any]) -> dict[CrowdKey, str]:
    """Each crowd either aggregator initialized -> "" when both state the same report count and
    checksum for it, else the reason it may not be published."""
    mine = {_crowd_key(c): (c["reports"], c["checksum"]) for c in own["crowds"]}
    theirs = {_crowd_key(c): (c["reports"], c["checksum"]) for c in peer["crowds"]}
    verdict = {}
    for key in mine.keys() | theirs.keys():
        if key not in mine or key not in theirs:
            verdict[key] = "aggregators_disagree: only one aggregator has this crowd"
        elif mine[key][0] != theirs[key][0]:
            verdict[key] = (
                f"aggregators_disagree: report counts {mine[key][0]} and {theirs[key][0]}"
            )
        elif mine[key][1] != theirs[key][1]:
            verdict[key] = "aggregators_disagree: report-id checksums differ"
        else:
            verdict[key] = ""
    return verdict


def run_finish(
    agg_id: int,
    output: str,
    peer: str,
    analyzer_key: str,
    options: PipelineOptions,
    min_batch: int | None = None,
    signing_key: str | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    directory, peer_directory = Path(output), Path(peer)
    signer = None
    if signing_key is not None:
        try:
            signer = load_signing_key(signing_key)
        except KeyError_ as error:
            raise UsageError(str(error)) from None
        if signer.public.instance != agg_id:
            raise UsageError(
                f"--signing-key {signing_key} is for index {signer.public.instance}, this is "
                f"aggregator {agg_id}"
            )
    own = _read_json(directory / VERIFY_FILE, "own verify record")
    other = _read_json(peer_directory / VERIFY_FILE, "peer verify record")
    if own.get("format") != VERIFY_FORMAT or other.get("format") != VERIFY_FORMAT:
        raise UsageError(f"{VERIFY_FILE}: not an {VERIFY_FORMAT} record")
    if own["aggregator"] != agg_id or other["aggregator"] != 1 - agg_id:
        raise UsageError(
            f"--peer {peer} is aggregator {other['aggregator']}'s, this is aggregator "
            f"{own['aggregator']}: give aggregator {1 - agg_id}'s directory"
        )
    if own["run_id"] != other["run_id"] or own["recipe_id"] != other["recipe_id"]:
        raise UsageError(f"--peer {peer} verified another run or recipe; refusing to publish")
    if not (directory / STATES_DIR).is_dir():
        raise UsageError(f"{directory / STATES_DIR}: no verification states (phase verify first)")
    try:
        analyzer = load_public_key(analyzer_key)
    except KeyError_ as error:
        raise UsageError(str(error)) from None
    recipe = recipe_from_dict(own["recipe"], source=str(directory / VERIFY_FILE))
    minimum = recipe.min_crowd_size if min_batch is None else int(min_batch)
    if minimum < 1:
        raise UsageError(f"--min-batch must be >= 1, got {minimum}")
    verdict = agreed_crowds(own, other)
    spec = AggregatorSpec(agg_id, recipe.to_json(), "", "")
    scratch = directory / "private" / "scratch"
    if scratch.exists():
        shutil.rmtree(scratch)
    pipeline = new_pipeline(options)

    def read(label: str, pattern: Path) -> beam.PCollection:
        return pipeline | label >> beam.io.ReadFromAvro(str(pattern))

    inputs = {
        "state": read("ReadStates", directory / STATES_DIR / "part*"),
        f"shares{agg_id}": read("ReadOwnShares", directory / VERIFIER_SHARES_DIR / "part*"),
        f"shares{1 - agg_id}": read(
            "ReadPeerShares", peer_directory / VERIFIER_SHARES_DIR / "part*"
        ),
    }
    phase = inputs | "FinishShares" >> FinishShares(spec)
    (
        phase.aggregates
        | "Json"
        >> beam.MapTuple(
            lambda key, value: json.dumps(
                summary_line(CrowdKey(*key), value[1], value[2], share=value[0].hex())
            )
        )
        | "WriteAggregates" >> beam.io.WriteToText(str(scratch / "part"), file_name_suffix=".jsonl")
    )
    _write_dead_letters(phase.dead_letters, directory / "private" / "dead_letters-finish", "Dead")
    result = pipeline.run()
    result.wait_until_finish()
    counts = _counters(result)
    aggregates = {_crowd_key(a): a for a in _lines(scratch)}
    shutil.rmtree(scratch)
    published, withheld = [], []
    for key in sorted(verdict, key=lambda k: (k.window_start, k.crowd_id or "", k.window_end)):
        entry = aggregates.get(key) or summary_line(key, 0, 0)
        share = entry.pop("share", None)
        reason = verdict[key]
        if not reason and entry["reports"] < minimum:
            reason = f"below_min_batch: {entry['reports']} valid reports < {minimum}"
        if reason or share is None:
            withheld.append(entry | {"reason": reason or "no valid report"})
            continue
        sealed = seal_aggregate_share(
            analyzer,
            bytes.fromhex(share),
            agg_id,
            own["run_id"],
            recipe_id=recipe.id,
            channel=recipe.channel,
            window_start_ms=key.window_start,
            window_end_ms=key.window_end,
            crowd_id=key.crowd_id,
            reports=entry["reports"],
            checksum=int(entry["checksum"], 16),
        )
        published.append(entry | {"sealed_share": sealed.hex()})
    record = {
        "format": AGGREGATE_FORMAT,
        "aggregator": agg_id,
        "run_id": own["run_id"],
        "recipe": own["recipe"],
        "recipe_id": recipe.id,
        "channel": recipe.channel,
        "vdaf_draft": VDAF_DRAFT,
        "analyzer_key_id": analyzer.key_id,
        "min_batch": minimum,
        "published": published,
        "withheld": withheld,
    }
    if signer is not None:
        # The commit-record signature of the shufflers (schemas/crypto/commit_signing.py): its
        # "instance" is the aggregator's index; "format" keeps it from passing as a release.
        try:
            record = sign_commit(record | {"instance": agg_id}, signer)
        except SignatureError as error:
            raise UsageError(f"--signing-key {signing_key}: {error}") from None
    staging = directory / f".{AGGREGATE_FILE}.tmp"
    staging.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(staging, directory / AGGREGATE_FILE)  # committed in one step
    shutil.rmtree(directory / STATES_DIR)  # §4.4.1: verification state goes once published
    initialized = sum(c["reports"] for c in own["crowds"])
    verified = counts.get("verified", 0)
    rejected = {
        k.removeprefix("rejected_"): v for k, v in counts.items() if k.startswith("rejected_")
    }
    own_rejected = sum(v for k, v in rejected.items() if k != "peer_only_report")
    return {
        "phase": "finish",
        "aggregator": agg_id,
        "run_id": own["run_id"],
        "initialized": initialized,
        "verified": verified,
        "rejected_by_reason": rejected,
        "published": len(published),
        "withheld": len(withheld),
        "reports_published": sum(p["reports"] for p in published),
        "adds_up": initialized == verified + own_rejected,
        "seconds": round(time.perf_counter() - started, 3),
    }

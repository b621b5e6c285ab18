"""``esa analysis``: interactive analyses in rounds (samplable-anonymous-aggregation Sections 1, 4).

    esa analysis run --plan plan.json --output DIR [--device-config device.json] [--overwrite]
        [Beam flags]
    esa analysis audit --output DIR --device N

An analysis plan (JSON, :data:`DEFAULT_PLAN` shows every key) learns popular n-grams of what
simulated keyboard users typed (real English: Debian's fortunes, ``simulators.text_corpus``):
round 1 asks every device for a random 2-gram it typed that starts with a known word; round r
sends the prefix tree of round r-1's ``keep`` most popular (r)-grams and asks for an (r+1)-gram
extending one of its leaves (Appendix B bucketing). Each device is a SQLite event store
(``simulators.event_store``) that checks the round's recipe against its own policy (query class,
Checks 1-3, per-field budgets), answers under the database's authorizer and query limits and logs
the query and everything it sent in a hash-chained audit log (``esa analysis audit``).

The plan is the analyst's: it asks for an ``epsilon_local`` per round and never sets a budget.
The devices' privacy policy and query limits are their own configuration
(``simulators.interactive_devices.DeviceConfig``), written into each device at enrollment from
``--device-config`` (the fleet's configuration; default: the configuration devices ship with)
and enforced there; a plan key that would set a budget is refused.

Every size-like plan field has a range (:data:`PLAN_RANGES`, docs/interactive.md), checked with
the rest of the plan before any work: a plan out of range, of the wrong type, or with a NaN or
infinity is one error line (exit 2). The devices' answers then go through the real stages
of ``esa run`` (``pipelines.run.run``: simulate with population ``values:answers.npy``, K
shufflers, analyzer on Beam), and round r+1's recipe is built from round r's histogram.

The analysis' budget composes across rounds by basic composition (the cohort epsilons the devices
were charged add up, as their ledgers enforce; so do the local ones); for equal rounds the report
also gives the tighter of basic and advanced composition (``privacy.accounting.compose``). With ``"sweep"`` in the plan the command also compares,
for each total local epsilon, the interactive rounds with one non-interactive round over the full
3-gram domain at the same total, drawn from the exact aggregate distribution
(``simulators.ngram_sweep``), and draws precision at k against epsilon (``precision_at_k.png``).

Output: ``DIR/analysis.json`` (the device configuration; per round: recipe, device counters
with refusals by reason, privacy report, discovered
n-grams, precision and recall at k; composition; baseline; sweep), ``DIR/round-<r>/`` (the
round's recipe, answers and the ``esa run`` output), ``DIR/devices/`` (one SQLite file per device
and its keystore).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline.flags import INT64_MAX
from pipelines.commandline.main import UsageError
from privacy.accounting import PrivacyLoss, compose, compose_basic
from privacy.ngrams import NgramEncoding, precision_recall_at_k, tokenize, top_k
from simulators import interactive_devices as devices_mod
from simulators import ngram_sweep
from simulators.event_store import LedgerBroken
from simulators.plan import SimulationPlan
from simulators.text_corpus import CorpusUnavailable, load_sentences
from transforms.analyzer.report_files import read_reports

__all__ = ["register", "DEFAULT_PLAN", "load_plan", "run_analysis"]

DAY_MS = 86_400_000
NOW_MS = 1_735_689_600_000  # 2025-01-01: the simulated "now" of round 1; round r is r-1 hours on
HOUR_MS = 3_600_000
# The measured plan (docs/interactive.md): 20,000 keyboards of 10 sentences, 64 known words, two
# rounds of epsilon_local 5 (cohort epsilon 0.742 each at the minimum crowd of 10,000); the
# devices' own analysis and field budgets (1.6, DeviceConfig) admit the two rounds and no third.
DEFAULT_PLAN: dict[str, Any] = {
    "name": "ngram_discovery",
    "seed": 20260101,
    "devices": 20000,
    "sentences_per_device": 10,
    "known_words": 64,
    "k": 10,
    "delta": 1e-6,
    "instances": 2,
    "crowd_threshold": 100,
    "min_crowd_size": 10000,
    "rounds": [{"epsilon_local": 5.0, "keep": 96}, {"epsilon_local": 5.0, "keep": 0}],
    "baseline": True,
    "sweep": None,
    "query": devices_mod.KEYBOARD_QUERY,
}
_PLAN_KEYS = frozenset(DEFAULT_PLAN)
# Keys that would set what only a device sets (its policy and limits: DeviceConfig).
_DEVICE_KEYS = frozenset(
    {
        "analysis_epsilon",
        "field_epsilon",
        "local_epsilon_allowed",
        "reports_allowed",
        "query_limits",
        "device_config",
        "policy",
        "budget",
        "budgets",
    }
)
MAX_ROUNDS = 16
MAX_ROUND_EPSILON = 20.0
# Ranges of the plan's integer fields (inclusive), checked before any work. 100,000 devices is
# five times the measured plan (one SQLite file each, about 1-2 ms per device and round); 256
# known words and keep make at most 1 + 256 x 258 = 66,049 buckets a round.
PLAN_RANGES: dict[str, tuple[int, int]] = {
    "seed": (0, 2**52),
    "devices": (1, 100_000),
    "sentences_per_device": (1, 1_000),
    "known_words": (1, 256),
    "k": (1, 1_000),
    "instances": (1, 64),
    "crowd_threshold": (1, INT64_MAX),
    "min_crowd_size": (1, 10**9),
    "keep": (0, 256),
    "repeats": (1, 100),
}
_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_]{0,47}$")
MAX_QUERY_CHARACTERS = 10_000


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "analysis",
        help="Interactive analyses in rounds: on-device stores, query classes, audit logs.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="analysis_command", required=True, metavar="ACTION")
    run = actions.add_parser("run", help="Run an analysis plan round by round.")
    run.add_argument("--plan", default=None, help="Plan JSON file. Default: DEFAULT_PLAN.")
    run.add_argument("--output", required=True, help="Output directory.")
    run.add_argument(
        "--device-config",
        default=None,
        help="The fleet's device configuration (JSON: analysis_epsilon, field_epsilon, "
        "local_epsilon_allowed, reports_allowed, query_limits), written into every device at "
        "enrollment. Default: what devices ship with (DeviceConfig).",
    )
    run.add_argument("--overwrite", action="store_true", help="Replace an existing --output.")
    run.set_defaults(handler=_handle_run, accepts_pipeline_args=True)
    audit = actions.add_parser("audit", help="Print one device's audit log (JSON).")
    audit.add_argument("--output", required=True, help="An analysis output directory.")
    audit.add_argument("--device", type=int, required=True, help="Device index.")
    audit.set_defaults(handler=_handle_audit)


def _handle_run(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    plan = load_plan(args.plan)
    config = load_device_config(args.device_config)
    result = run_analysis(
        plan, Path(args.output), pipeline_args, args.overwrite, echo=True, device_config=config
    )
    return 0 if result["adds_up"] else 1


def _handle_audit(args: argparse.Namespace) -> int:
    if args.device < 0:
        raise UsageError(f"--device must be >= 0, got {args.device}")
    try:
        entries = devices_mod.read_audit(Path(args.output) / "devices", args.device)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    except LedgerBroken as broken:
        print(f"esa analysis: error: device {args.device}'s audit log is broken: {broken}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(devices_mod.dumps_audit(entries))
    return 0


def _read_json(path: str, flag: str) -> Any:
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(Path(path).read_text(), parse_constant=no_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise UsageError(f"{flag} {path}: cannot be read: {error}") from None


def load_device_config(path: str | None) -> devices_mod.DeviceConfig:
    """The fleet's device configuration at ``path`` (default: ``DeviceConfig()``)."""
    if path is None:
        return devices_mod.DeviceConfig()
    try:
        return devices_mod.DeviceConfig.from_dict(
            _read_json(path, "--device-config"), source=f"--device-config {path}"
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def load_plan(path: str | None) -> dict[str, Any]:
    """The plan at ``path`` over :data:`DEFAULT_PLAN`; a bad plan is one UsageError line."""
    plan = json.loads(json.dumps(DEFAULT_PLAN))
    if path is None:
        return plan
    given = _read_json(path, "--plan")
    if not isinstance(given, dict):
        raise UsageError(f"--plan {path}: must be a JSON object")
    check_plan({**plan, **given}, f"--plan {path}", given_keys=given)
    plan.update(given)
    return plan


def _integer(value: Any, name: str, source: str, field: str | None = None) -> int:
    """An integer in ``PLAN_RANGES[field or name]``."""
    low, high = PLAN_RANGES[field or name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{source}: {name} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise UsageError(f"{source}: {name} must be in [{low}, {high}], got {value}")
    return value


def _number(value: Any, name: str, source: str, low: float, high: float) -> float:
    """A finite number in ``(low, high]``."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low < value <= high
    ):
        raise UsageError(
            f"{source}: {name} must be a finite number in ({low:g}, {high:g}], got {value!r}"
        )
    return float(value)


def check_plan(plan: dict[str, Any], source: str = "plan", given_keys: Any = None) -> None:
    """Refuse (one UsageError line) a plan that sets a device's budget, has an unknown key, or a
    field of the wrong type or outside its documented range (:data:`PLAN_RANGES`; ``delta`` in
    (0, 0.01]; per round ``epsilon_local`` in (0, 20] and ``keep``; 1 to 16 rounds; ``name``
    ``[a-z0-9_]``, at most 48 characters; ``query`` at most 10,000 characters)."""
    keys = set(plan if given_keys is None else given_keys)
    setting = sorted(keys & _DEVICE_KEYS)
    if setting:
        raise UsageError(
            f"{source}: {setting[0]!r} would set the devices' privacy policy, which each device "
            "holds and enforces itself (esa analysis run --device-config configures the fleet); "
            "a plan asks for an epsilon_local per round, and each device checks it"
        )
    unknown = sorted(keys - _PLAN_KEYS)
    if unknown:
        raise UsageError(f"{source}: unknown key {unknown[0]!r} (known: {sorted(_PLAN_KEYS)})")
    missing = sorted(_PLAN_KEYS - set(plan))
    if missing:
        raise UsageError(f"{source}: missing key {missing[0]!r}")
    name = plan["name"]
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise UsageError(f"{source}: name must match {_NAME_PATTERN.pattern}, got {name!r}")
    for key in ("seed", "devices", "sentences_per_device", "known_words", "k", "instances",
                "crowd_threshold", "min_crowd_size"):  # fmt: skip
        _integer(plan[key], key, source)
    _number(plan["delta"], "delta", source, 0.0, 0.01)
    rounds = plan["rounds"]
    if (
        not isinstance(rounds, list)
        or not 1 <= len(rounds) <= MAX_ROUNDS
        or not all(isinstance(r, dict) and set(r) == {"epsilon_local", "keep"} for r in rounds)
    ):
        raise UsageError(
            f"{source}: rounds must be a list of 1 to {MAX_ROUNDS} {{epsilon_local, keep}} "
            "(a round asks for its epsilon_local; the devices hold the budgets)"
        )
    for index, settings in enumerate(rounds):
        _number(settings["epsilon_local"], f"rounds[{index}].epsilon_local", source, 0.0,
                MAX_ROUND_EPSILON)  # fmt: skip
        _integer(settings["keep"], f"rounds[{index}].keep", source, "keep")
    if not isinstance(plan["baseline"], bool):
        raise UsageError(f"{source}: baseline must be true or false, got {plan['baseline']!r}")
    query = plan["query"]
    if not isinstance(query, str) or not 0 < len(query) <= MAX_QUERY_CHARACTERS or "\x00" in query:
        raise UsageError(
            f"{source}: query must be SQL text of 1 to {MAX_QUERY_CHARACTERS:,} characters"
        )
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{source}: query must be UTF-8 text (no lone surrogates)") from None
    sweep = plan["sweep"]
    if sweep is not None:
        if not isinstance(sweep, dict) or not set(sweep) <= {"epsilons_local", "repeats"}:
            raise UsageError(f"{source}: sweep must be null or {{epsilons_local, repeats}}")
        epsilons = sweep.get("epsilons_local")
        if not isinstance(epsilons, list) or not 1 <= len(epsilons) <= MAX_ROUNDS:
            raise UsageError(
                f"{source}: sweep.epsilons_local must be a list of 1 to {MAX_ROUNDS} numbers"
            )
        for index, epsilon in enumerate(epsilons):
            _number(epsilon, f"sweep.epsilons_local[{index}]", source, 0.0, MAX_ROUND_EPSILON)
        if "repeats" in sweep:
            _integer(sweep["repeats"], "sweep.repeats", source, "repeats")


def _typed(plan: dict[str, Any], rng: np.random.Generator) -> tuple[list[list[str]], list[str]]:
    """What each device's user typed (sentences drawn from the corpus) and the known words (the
    keyboard's dictionary: the corpus' most frequent words, assumed public)."""
    try:
        sentences = load_sentences()
    except CorpusUnavailable as error:
        raise UsageError(str(error)) from None
    m = plan["sentences_per_device"]
    if m > len(sentences):
        raise UsageError(f"sentences_per_device {m} exceeds the corpus' {len(sentences)}")
    typed = [[sentences[i] for i in rng.choice(len(sentences), m, replace=False)]
             for _ in range(plan["devices"])]  # fmt: skip
    words = Counter(w for s in sentences for w in tokenize(s))
    known = [w for w, _ in words.most_common(plan["known_words"])]
    return typed, known


def _read_reports(simulation_dir: Path) -> list[dict[str, Any]]:
    import fastavro

    reports: list[dict[str, Any]] = []
    for path in sorted(glob.glob(str(simulation_dir / "instance=*" / "*.avro"))):
        with open(path, "rb") as handle:
            reports.extend(fastavro.reader(handle))
    return reports


def _estimates(histograms: Path, recipe_id: str, domain_size: int) -> np.ndarray | None:
    """Estimated counts per bucket of the recipe's crowds (None when the analyzer estimated none)."""
    table = pq.read_table(histograms, columns=["recipe_id", "bucket", "estimate"]).to_pydict()
    out = np.zeros(domain_size, dtype=np.float64)
    rows = 0
    for rid, bucket, estimate in zip(
        table["recipe_id"], table["bucket"], table["estimate"], strict=True
    ):
        if rid == recipe_id:
            out[int(bucket)] += float(estimate)
            rows += 1
    return out if rows else None


def _privacy(summary_path: Path, recipe_id: str) -> list[dict[str, Any]]:
    """The analyzer's privacy report of each released crowd of the recipe (ε_c with its bound,
    δ, n) as ``reports.jsonl/`` beside ``summary.json`` states it."""
    try:
        reports = read_reports(str(summary_path.parent))
    except (OSError, json.JSONDecodeError):
        return []
    out = []
    for crowd in reports["histograms"]:
        if crowd.get("recipe_id") != recipe_id:
            continue
        privacy = crowd.get("privacy", {})
        out.append(
            {
                "window_start": crowd.get("window_start"),
                "crowd_id": crowd.get("crowd_id"),
                "respondents_effective": crowd.get("respondents_effective"),
                "messages": crowd.get("messages"),
                **{
                    key: privacy.get(key)
                    for key in ("epsilon_local_all", "epsilon_central", "bound", "delta")
                },
            }
        )
    return out


def _compose(epsilons: list[float], deltas: list[float]) -> dict[str, Any]:
    """The rounds composed: basic composition (what the devices' ledgers charge, Section 4.3),
    and the tightest composition ``privacy.accounting.compose`` finds (PLD, basic or advanced)
    at twice the rounds' total delta."""
    if not epsilons:
        return {"bound": "nothing answered", "epsilon": 0.0, "delta": 0.0}
    losses = [PrivacyLoss(e, d, "round") for e, d in zip(epsilons, deltas, strict=True)]
    basic = compose_basic(losses)
    out: dict[str, Any] = {"bound": basic.bound, "epsilon": basic.epsilon, "delta": basic.delta}
    if basic.delta > 0:
        try:
            tight = compose(losses, delta=min(2 * basic.delta, 0.5))
        except ValueError as error:  # a bound outside its range: keep basic composition
            out["tightest"] = f"not available: {error}"
        else:
            out["tightest"] = tight.to_dict()
    return out


def _prepare(output: Path, overwrite: bool) -> None:
    """An empty --output; --overwrite replaces an earlier analysis (a folder with plan.json)
    and nothing else."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()):
        if not overwrite:
            raise UsageError(f"--output {output} exists; pass --overwrite to replace it")
        if not (output / "plan.json").is_file():
            raise UsageError(
                f"--output {output} holds something other than an earlier esa analysis; "
                "--overwrite replaces only that"
            )
        shutil.rmtree(output)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--output {output}: cannot be created: {error.strerror}") from None


def _run_round(
    plan: dict[str, Any],
    index: int,
    encoding: NgramEncoding,
    settings: dict[str, Any],
    output: Path,
    flags: list[str],
    say: Any,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """One round: the recipe, every device's decision under its own configuration, and the
    answers through ``esa run``'s stages (simulate -> K shufflers -> analyzer)."""
    from pipelines import run as run_pipeline

    round_id = f"round-{index}"
    round_dir = output / round_id
    round_dir.mkdir()
    recipe = devices_mod.build_round_recipe(
        plan["name"], round_id, encoding, settings["epsilon_local"], plan["min_crowd_size"],
        plan["delta"], plan["instances"], query=plan["query"],
    )  # fmt: skip
    (round_dir / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2))
    (round_dir / "transport_recipe.json").write_text(recipe.recipe.to_json())
    now_ms = NOW_MS + (index - 1) * HOUR_MS
    began = time.monotonic()
    answers, senders, counters = devices_mod.answer_fleet(
        output / "devices", plan["devices"], recipe, plan["seed"] + index, now_ms, DAY_MS
    )
    say(f"{round_id}: {encoding.n}-grams over {encoding.domain_size} buckets; devices {counters} "
        f"({time.monotonic() - began:.1f} s)")  # fmt: skip
    report: dict[str, Any] = {
        "round": round_id,
        "n": encoding.n,
        "recipe_id": recipe.recipe.id,
        "prefix_tree_sha256": encoding.tree.sha256(),
        "prefix_tree_leaves": len(encoding.tree.leaves),
        "domain_size": encoding.domain_size,
        "devices": counters,
        "epsilon_local": recipe.recipe.epsilon_local,
        "epsilon_central_charged": recipe.recipe.epsilon_central_target,
        "delta": recipe.recipe.delta,
    }
    if answers.size == 0:
        report["stopped"] = "no device answered"
        return report, None
    report["senders"] = int(answers.size)
    np.save(round_dir / "answers.npy", answers)
    np.save(round_dir / "senders.npy", senders)
    seed = plan["seed"] * 1000 + index
    result = run_pipeline.run(
        PipelineOptions(
            flags,
            run_output=str(round_dir / "esa"),
            run_recipe=str(round_dir / "transport_recipe.json"),
            run_population=f"values:{round_dir / 'answers.npy'}",
            run_respondents=int(answers.size),
            run_seed=seed,
            run_crowd_threshold=plan["crowd_threshold"],
            run_parallel_shuffles=1,
        )
    )
    origin_key = SimulationPlan.for_recipe(recipe.recipe, "values", seed).origin_key
    report["messages_logged"] = devices_mod.record_sent(
        output / "devices", round_id, senders, origin_key,
        _read_reports(Path(result["paths"]["simulation"])),
    )  # fmt: skip
    report["messages"] = result["messages"]
    report["adds_up"] = result["adds_up"]
    report["seconds"] = result["seconds"]
    report["privacy_report"] = _privacy(Path(result["paths"]["summary"]), recipe.recipe.id)
    for crowd in report["privacy_report"]:
        say(f"  privacy: epsilon_local {recipe.recipe.epsilon_local}, charged cohort epsilon "
            f"{recipe.recipe.epsilon_central_target}; analyzer epsilon_c {crowd['epsilon_central']} "
            f"({crowd['bound']}, delta {crowd['delta']}, n {crowd['respondents_effective']})")  # fmt: skip
    estimates = _estimates(
        Path(result["paths"]["histograms"]), recipe.recipe.id, encoding.domain_size
    )
    if estimates is None:
        report["stopped"] = (
            f"the analyzer estimated no crowd of {recipe.recipe.id} from {result['messages']} "
            f"messages (see {result['paths']['summary']})"
        )
        report["adds_up"] = False
        say(f"  stopped: {report['stopped']}")
        return report, None
    np.save(round_dir / "estimates.npy", estimates)
    return report, estimates


def run_analysis(
    plan: dict[str, Any],
    output: Path,
    pipeline_args: list[str] | None = None,
    overwrite: bool = False,
    echo: bool = False,
    device_config: devices_mod.DeviceConfig | None = None,
) -> dict[str, Any]:
    """Run ``plan`` into ``output`` with a fleet enrolled under ``device_config`` (default
    ``DeviceConfig()``); returns analysis.json's content. The plan is checked first."""
    check_plan(plan)
    device_config = device_config or devices_mod.DeviceConfig()

    def say(text: str) -> None:
        if echo:
            print(text, flush=True)

    rng = np.random.default_rng(plan["seed"])
    typed, known = _typed(plan, rng)  # refuses a plan the corpus cannot serve, before any file
    _prepare(output, overwrite)
    (output / "plan.json").write_text(json.dumps(plan, indent=2))
    began = time.monotonic()
    in_window = devices_mod.create_fleet(
        output / "devices", typed, NOW_MS, DAY_MS, rng, device_config
    )
    say(f"{plan['devices']} device stores ({time.monotonic() - began:.1f} s); "
        f"{len(known)} known words")  # fmt: skip
    k = plan["k"]
    rounds: list[dict[str, Any]] = []
    tree = ngram_sweep.first_tree(known)
    for index, settings in enumerate(plan["rounds"], start=1):
        encoding = NgramEncoding(tuple(known), tree)
        report, estimates = _run_round(
            plan, index, encoding, settings, output, list(pipeline_args or []), say
        )
        rounds.append(report)
        if estimates is None:
            break
        ngrams = ngram_sweep.device_ngrams(in_window, encoding.n)
        found = top_k(estimates, encoding, k)
        truth = ngram_sweep.true_top(ngrams, known, k)
        precision, recall = precision_recall_at_k(found, truth, k)
        report.update(
            discovered=[" ".join(g) for g in found],
            true_top=[" ".join(g) for g in truth],
            precision_at_k=precision,
            recall_at_k=recall,
            k=k,
        )
        say(f"  precision@{k} {precision:.2f} recall@{k} {recall:.2f}: {report['discovered']}")
        following = ngram_sweep.next_tree(estimates, encoding, settings["keep"])
        if following is None or index == len(plan["rounds"]):
            break
        tree = following
    # A round nobody answered cost nothing; one the devices answered did, whatever came of it.
    answered = [r for r in rounds if r.get("senders", 0) > 0]
    composition = {
        "central": _compose(
            [r["epsilon_central_charged"] for r in answered], [r["delta"] for r in answered]
        ),
        "local": _compose([r["epsilon_local"] for r in answered], [0.0 for _ in answered]),
    }
    result: dict[str, Any] = {
        "plan": plan,
        "device_config": device_config.to_dict(),
        "known_words": known,
        "rounds": rounds,
        "composition": composition,
        "adds_up": all(r.get("adds_up", True) for r in rounds),
    }
    estimated = [r for r in rounds if "precision_at_k" in r]
    if plan["baseline"] and estimated:
        total = composition["central"]["epsilon"]
        local = ngram_sweep.local_for_cohort(total, plan["min_crowd_size"], plan["delta"])
        point = ngram_sweep.baseline_exact(
            in_window, known, estimated[-1]["n"], local, k, rng, epsilon_total=total
        )
        result["baseline"] = {
            **point.__dict__,
            "epsilon_local": local,
            "method": point.method + " (exact aggregate)",
        }
        say(f"baseline: one round over all {estimated[-1]['n']}-grams at the same cohort epsilon "
            f"{total:.3f} (local {local:.3f}): precision@{k} {point.precision:.2f}")  # fmt: skip
    if plan["sweep"]:
        from pipelines import interactive_sweep

        result["sweep"] = interactive_sweep.sweep(plan, in_window, known, output, rng)
    (output / "analysis.json").write_text(json.dumps(result, indent=2, default=str))
    say(f"results: {output / 'analysis.json'}")
    return result

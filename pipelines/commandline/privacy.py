"""``esa privacy``: central-privacy accounting from the command line.

Subcommands (each prints text, or JSON with ``--json``):

* ``amplify``: eps_c of n shuffled eps_l-DP reports and the bound used (all candidates listed;
  the tight variation-ratio bound with its upper and lower bound);
* ``solve``: the largest eps_l meeting a target eps_c (tight bound by default; ``--bound paper``
  reproduces the paper's tables);
* ``crowd``: the smallest crowd meeting a target eps_c (samplable-anonymous-aggregation Check 3);
* ``tight``: upper and lower bounds of the variation-ratio reduction for any shipped randomizer
  (k-RR, LDP-SGD, multi-message ones), and the PLD composition of several such releases;
* ``fragments``: local epsilon of t of tau report fragments (Theorem IV.1);
* ``deletion``: Laplace scale, offset and deletions of randomized report deletion (Algorithm 3);
* ``gaussian``: the Gaussian baseline sigma, as the paper computes it and exactly.

Parameters outside a bound's validity range are refused with a one-line error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from pipelines.commandline.main import UsageError
from privacy import accounting

__all__ = ["register"]


def _number(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise UsageError(f"{flag} must be finite, got {text!r}")
    return value


def _integer(text: str, flag: str, maximum: int | None = None) -> int:
    value = _number(text, flag)
    if value != math.floor(value):
        raise UsageError(f"{flag} must be a whole number, got {text!r}")
    if maximum is not None and not 1 <= value <= maximum:
        raise UsageError(f"{flag} must be between 1 and {maximum:.0e}, got {text!r}")
    return int(value)


def _respondents(text: str) -> int:
    # Refused before any work: the bounds are evaluated in bounded time up to this size.
    return _integer(text, "--respondents", accounting.MAX_RESPONDENTS)


def _emit(payload: dict[str, Any], as_json: bool, lines: list[str]) -> int:
    if as_json:
        print(json.dumps(payload, indent=2, allow_nan=False))
    else:
        print("\n".join(lines))
    return 0


def _bound_line(guarantee: accounting.CentralGuarantee) -> str:
    bound = guarantee.bound
    return f"bound: {bound} ({accounting.BOUND_DESCRIPTIONS.get(bound, bound)})"


def _candidate_lines(candidates: dict[str, Any]) -> list[str]:
    lines = []
    for name, value in candidates.items():
        shown = f"{value:.6g}" if isinstance(value, float) else value
        lines.append(f"  {name}: {shown}")
    return lines


def _tight_lines(tight: Any) -> list[str]:
    """The variation-ratio bound's upper and lower bounds, or why it does not apply."""
    if not isinstance(tight, dict):
        return [f"variation-ratio bound: {tight}"]
    lower = tight["lower"]
    shown = "none" if lower is None else f"{lower:.6g}"
    return [
        f"tight bound (variation-ratio reduction, Wang et al. VLDB 2024): upper = "
        f"{tight['upper']:.6g}, lower = {shown} ({tight['lower_pair']})",
        f"  reduction's own eps lies in [{tight['reduction_lower']:.6g}, {tight['upper']:.6g}]",
    ]


def _amplify(args: argparse.Namespace) -> int:
    guarantee = accounting.amplify(
        _number(args.epsilon_local, "--epsilon-local"),
        _respondents(args.respondents),
        _number(args.delta, "--delta"),
        args.mechanism,
        local_model=args.local_model,
    )
    payload = guarantee.to_dict()
    candidates = payload["details"]["candidates"]
    payload["candidates"] = candidates
    payload["fmt_numerical"] = candidates.get(accounting.FMT_NUMERICAL)
    tight = payload["details"].get("tight")
    payload["tight"] = tight
    lines = [
        f"epsilon_central = {guarantee.epsilon:.6g} at delta = {guarantee.delta:.6g}",
        _bound_line(guarantee),
        *_tight_lines(tight),
        f"epsilon_local = {guarantee.epsilon_local:.6g}, respondents = {guarantee.respondents}, "
        f"mechanism = {args.mechanism}",
        "candidates:",
        *_candidate_lines(candidates),
    ]
    return _emit(payload, args.json, lines)


def _solve(args: argparse.Namespace) -> int:
    guarantee = accounting.solve_epsilon_local(
        _number(args.epsilon_central, "--epsilon-central"),
        _respondents(args.respondents),
        _number(args.delta, "--delta"),
        args.mechanism,
        bound=_chosen_bound(args),
        local_model=args.local_model,
    )
    payload = guarantee.to_dict()
    payload["target_epsilon_central"] = guarantee.details["target_epsilon_central"]
    payload["limited_by_validity_range"] = guarantee.details["limited_by_validity_range"]
    lines = [
        f"epsilon_local = {guarantee.epsilon_local:.6g}",
        f"certifies epsilon_central = {guarantee.epsilon:.6g} <= "
        f"{payload['target_epsilon_central']:.6g} at delta = {guarantee.delta:.6g} "
        f"for {guarantee.respondents} respondents",
        _bound_line(guarantee),
    ]
    if payload["limited_by_validity_range"]:
        lines.append("epsilon_local is capped by the bound's validity range, not by the target")
    return _emit(payload, args.json, lines)


def _crowd(args: argparse.Namespace) -> int:
    guarantee = accounting.min_respondents(
        _number(args.epsilon_central, "--epsilon-central"),
        _number(args.epsilon_local, "--epsilon-local"),
        _number(args.delta, "--delta"),
        args.mechanism,
        bound=_chosen_bound(args),
        local_model=args.local_model,
    )
    payload = guarantee.to_dict()
    payload["target_epsilon_central"] = guarantee.details["target_epsilon_central"]
    lines = [
        f"respondents >= {guarantee.respondents}",
        f"certifies epsilon_central = {guarantee.epsilon:.6g} at delta = {guarantee.delta:.6g} "
        f"for epsilon_local = {guarantee.epsilon_local:.6g}",
        _bound_line(guarantee),
    ]
    return _emit(payload, args.json, lines)


def _tight(args: argparse.Namespace) -> int:
    epsilon_local = (
        None if args.epsilon_local is None else _number(args.epsilon_local, "--epsilon-local")
    )
    if epsilon_local is None and args.randomizer not in ("cheu", "balls_into_bins"):
        raise UsageError(f"--epsilon-local is required for --randomizer {args.randomizer}")
    n = _respondents(args.respondents)
    delta = _number(args.delta, "--delta")
    options: dict[str, Any] = {"categories": _integer(args.categories, "--categories")}
    if args.flip is not None:
        options["flip"] = _number(args.flip, "--flip")
    if args.bins is not None:
        options["bins"] = _integer(args.bins, "--bins")
        options["special_bins"] = _integer(args.special_bins, "--special-bins")
    releases = _integer(args.releases, "--releases", 10**6)
    bound = accounting.tight_bound(args.randomizer, epsilon_local or 1.0, n, delta, **options)
    payload: dict[str, Any] = {
        "epsilon_central": bound.upper,
        "bound": accounting.VARIATION_RATIO,
        "bound_description": accounting.BOUND_DESCRIPTIONS[accounting.VARIATION_RATIO],
        **bound.to_dict(),
    }
    lower = "none" if bound.lower is None else f"{bound.lower:.6g}"
    lines = [
        f"epsilon_central <= {bound.upper:.6g} at delta = {delta:.6g} "
        f"({args.randomizer}, n = {n}; variation-ratio reduction, Wang et al. VLDB 2024)",
        f"lower bound: {lower} ({bound.lower_pair})",
        f"the reduction's own eps lies in [{bound.reduction_lower:.6g}, {bound.upper:.6g}]",
    ]
    if releases > 1:
        curve = accounting.tight_curve(
            args.randomizer, epsilon_local or 1.0, n, delta / (10.0 * releases), **options
        )
        composed = accounting.compose([curve] * releases, delta)
        payload["composed"] = composed.to_dict()
        lines.append(
            f"{releases} such releases: epsilon = {composed.epsilon:.6g} at delta = {delta:.6g} "
            f"({composed.method})"
        )
    return _emit(payload, args.json, lines)


def _fragments(args: argparse.Namespace) -> int:
    backstop = _number(args.epsilon_backstop, "--epsilon-backstop")
    fragments = _integer(args.fragments, "--fragments")
    fragment = (
        None
        if args.epsilon_fragment is None
        else _number(args.epsilon_fragment, "--epsilon-fragment")
    )
    seen = fragments if args.seen is None else _integer(args.seen, "--seen")
    if seen > fragments:
        raise UsageError(f"--seen must be <= --fragments ({fragments}), got {seen}")
    local = accounting.report_fragment_local_guarantee(backstop, fragments, fragment)
    if local.epsilon_fragment is None:
        epsilon_seen = backstop
    else:
        epsilon_seen = accounting.report_fragment_epsilon(backstop, local.epsilon_fragment, seen)
    payload: dict[str, Any] = {
        "epsilon_local": epsilon_seen,
        "seen": seen,
        "epsilon_local_all": local.epsilon_all,
        "epsilon_local_one": local.epsilon_one,
        "epsilon_backstop": local.epsilon_backstop,
        "epsilon_fragment": local.epsilon_fragment,
        "epsilon_fragment_rule": "given"
        if fragment is not None
        else "sinh(eps_f) = sinh(eps_b)/tau",
        "fragments": fragments,
        "bound": "theorem_iv1",
    }
    lines = [
        f"epsilon_local = {epsilon_seen:.6g} for {seen} of {fragments} fragments (Theorem IV.1)",
        f"epsilon_local_all = {local.epsilon_all:.6g}, epsilon_local_one = {local.epsilon_one:.6g}",
        f"epsilon_backstop = {backstop:.6g}, epsilon_fragment = "
        + ("none" if local.epsilon_fragment is None else f"{local.epsilon_fragment:.6g}")
        + ("" if fragment is not None else " (equal-variance rule)"),
    ]
    if (args.respondents is None) != (args.delta is None):
        raise UsageError("--respondents and --delta go together")
    if args.respondents is not None:
        report = accounting.privacy_report(
            backstop,
            _respondents(args.respondents),
            _number(args.delta, "--delta"),
            fragments=fragments,
            epsilon_fragment=local.epsilon_fragment,
        )
        payload["epsilon_central"] = report.central.epsilon
        payload["central"] = report.central.to_dict()
        payload["central_without_attribute_fragmentation"] = (
            report.central_without_attribute_fragmentation.to_dict()
        )
        lines.append(
            f"epsilon_central = {report.central.epsilon:.6g} at delta = {report.central.delta:.6g} "
            f"({report.central.bound}); without attribute fragmentation "
            f"{report.central_without_attribute_fragmentation.epsilon:.6g} "
            f"({report.central_without_attribute_fragmentation.bound})"
        )
    return _emit(payload, args.json, lines)


def _deletion(args: argparse.Namespace) -> int:
    epsilon = _number(args.epsilon_deletion, "--epsilon-deletion")
    delta = _number(args.delta_deletion, "--delta-deletion")
    crowds = _integer(args.crowds, "--crowds")
    noise = accounting.deletion_noise(epsilon, delta)
    bounds = accounting.deletion_bounds(epsilon, delta, crowds)
    payload = {
        "epsilon_central": noise.epsilon,
        "delta": noise.delta,
        "bound": "theorem_v1_v2",
        "crowds": crowds,
        "laplace_scale": noise.scale,
        "offset": noise.offset,
        "offset_records": noise.offset_records,
        "expected_deletions": bounds.expected,
        "expected_deletions_discrete": bounds.expected_discrete,
        "high_probability_deletions": bounds.high_probability,
        "high_probability_deletions_tail": bounds.high_probability_tail,
        "high_probability_deletions_discrete": bounds.high_probability_discrete,
        "abort_probability": bounds.abort_probability,
        "abort_probability_discrete": bounds.abort_probability_discrete,
    }
    lines = [
        f"(epsilon, delta) = ({noise.epsilon:.6g}, {noise.delta:.6g}) on crowd counts (Theorem V.1)",
        f"Laplace scale b = {noise.scale:.6g}, offset = {noise.offset:.6g} "
        f"(discrete noise: offset {noise.offset_records} records)",
        f"expected deletions per crowd = {bounds.expected:.6g} "
        f"(discrete: {bounds.expected_discrete:.6g})",
        f"with probability >= 1 - delta, every one of {crowds} crowds loses at most "
        f"{bounds.high_probability:.6g} reports (Theorem V.2; direct tail bound "
        f"{bounds.high_probability_tail:.6g}, discrete {bounds.high_probability_discrete})",
    ]
    return _emit(payload, args.json, lines)


def _gaussian(args: argparse.Namespace) -> int:
    baseline = accounting.gaussian_baseline(
        _number(args.epsilon_central, "--epsilon-central"),
        _number(args.delta, "--delta"),
        _number(args.sensitivity, "--sensitivity"),
    )
    payload = {
        "epsilon_central": baseline.epsilon,
        "delta": baseline.delta,
        "sensitivity": baseline.sensitivity,
        "bound": "analytic_gaussian",
        "sigma_paper": baseline.sigma_paper,
        "sigma_exact": baseline.sigma_exact,
        "paper_sigma_delta": baseline.paper_delta,
        "paper_sigma_is_private": baseline.paper_sigma_is_private,
    }
    verdict = "meets" if baseline.paper_sigma_is_private else "does NOT meet"
    lines = [
        f"sigma (paper's formula) = {baseline.sigma_paper:.6g}: real delta "
        f"{baseline.paper_delta:.3g}, {verdict} delta = {baseline.delta:.3g}",
        f"sigma (exact analytic Gaussian) = {baseline.sigma_exact:.6g}",
    ]
    return _emit(payload, args.json, lines)


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _add_mechanism(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--mechanism",
        choices=accounting.MECHANISMS,
        default=default,
        help=f"local randomizer (default {default})",
    )
    parser.add_argument(
        "--local-model",
        choices=(accounting.REPLACEMENT, accounting.REMOVAL),
        default=accounting.REPLACEMENT,
        help="neighbouring notion of a generic randomizer's epsilon_local (default replacement)",
    )


def _add_bound(parser: argparse.ArgumentParser) -> None:
    names = sorted({name for m in accounting.MECHANISMS for name in accounting.mechanism_bounds(m)})
    parser.add_argument(
        "--bound",
        choices=[*names, accounting.TIGHTEST, "paper"],
        default=accounting.VARIATION_RATIO,
        help="bound to solve with (default variation_ratio, the tightest; 'paper': the bound "
        "behind the paper's tables for the mechanism)",
    )


def _chosen_bound(args: argparse.Namespace) -> str | None:
    return None if args.bound == "paper" else args.bound


# Help of the required arguments that amplify, solve and crowd share.
_REQUIRED_HELP = {
    "--epsilon-local": "local epsilon of one report",
    "--epsilon-central": "target central epsilon",
    "--respondents": "crowd size n",
    "--delta": "central delta",
}


def _add_required(parser: argparse.ArgumentParser, *flags: str) -> None:
    for flag in flags:
        parser.add_argument(flag, required=True, help=_REQUIRED_HELP[flag])


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``esa privacy`` and its subcommands."""
    privacy = subparsers.add_parser(
        "privacy",
        help="central-privacy accounting (amplification by shuffling and friends)",
        description=__doc__.splitlines()[0],
    )
    commands = privacy.add_subparsers(dest="privacy_command", required=True, metavar="SUBCOMMAND")

    amplify = commands.add_parser("amplify", help="central epsilon of n shuffled reports")
    _add_required(amplify, "--epsilon-local", "--respondents", "--delta")
    _add_mechanism(amplify, accounting.GENERIC)
    _add_json(amplify)
    amplify.set_defaults(handler=_amplify)

    solve = commands.add_parser("solve", help="largest epsilon_local for a target epsilon_central")
    _add_required(solve, "--epsilon-central", "--respondents", "--delta")
    _add_mechanism(solve, accounting.ONE_HOT_RAPPOR)
    _add_bound(solve)
    _add_json(solve)
    solve.set_defaults(handler=_solve)

    crowd = commands.add_parser("crowd", help="smallest crowd for a target epsilon_central")
    _add_required(crowd, "--epsilon-central", "--epsilon-local", "--delta")
    _add_mechanism(crowd, accounting.GENERIC)
    _add_bound(crowd)
    _add_json(crowd)
    crowd.set_defaults(handler=_crowd)

    tight = commands.add_parser(
        "tight", help="tight upper and lower bounds for a randomizer (variation-ratio reduction)"
    )
    tight.add_argument(
        "--randomizer", choices=accounting.RANDOMIZERS, default="generic",
        help="local randomizer (default generic eps_0-LDP)",
    )  # fmt: skip
    tight.add_argument("--epsilon-local", default=None, help="local epsilon eps_0")
    _add_required(tight, "--respondents", "--delta")
    tight.add_argument("--categories", default="2", help="k of k_rr (default 2)")
    tight.add_argument("--flip", default=None, help="flip probability of cheu")
    tight.add_argument("--bins", default=None, help="bins of balls_into_bins")
    tight.add_argument("--special-bins", default="1", help="special bins of balls_into_bins")
    tight.add_argument(
        "--releases", default="1", help="compose this many such releases (PLD composition)"
    )
    _add_json(tight)
    tight.set_defaults(handler=_tight)

    fragments = commands.add_parser("fragments", help="local epsilon of report fragments")
    fragments.add_argument("--epsilon-backstop", required=True, help="backstop epsilon eps_b")
    fragments.add_argument(
        "--epsilon-fragment",
        default=None,
        help="fragment epsilon eps_f (default: sinh(eps_f) = sinh(eps_b)/tau, the paper's rule)",
    )
    fragments.add_argument("--fragments", required=True, help="fragments per report, tau")
    fragments.add_argument(
        "--seen", default=None, help="fragments an adversary sees, t (default tau)"
    )
    fragments.add_argument("--respondents", default=None, help="crowd size, to add epsilon_central")
    fragments.add_argument("--delta", default=None, help="central delta, with --respondents")
    _add_json(fragments)
    fragments.set_defaults(handler=_fragments)

    deletion = commands.add_parser("deletion", help="randomized report deletion (Algorithm 3)")
    deletion.add_argument("--epsilon-deletion", required=True, help="epsilon_cr")
    deletion.add_argument("--delta-deletion", required=True, help="delta_cr")
    deletion.add_argument("--crowds", default="1", help="number of crowds P (default 1)")
    _add_json(deletion)
    deletion.set_defaults(handler=_deletion)

    gaussian = commands.add_parser("gaussian", help="Gaussian-mechanism baseline sigma")
    gaussian.add_argument("--epsilon-central", required=True, help="central epsilon")
    gaussian.add_argument("--delta", required=True, help="central delta")
    gaussian.add_argument("--sensitivity", default="1", help="L2 sensitivity (default 1)")
    _add_json(gaussian)
    gaussian.set_defaults(handler=_gaussian)

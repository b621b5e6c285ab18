"""Entry points: the tightest valid central guarantee, the solvers behind the paper's tables and
samplable-anonymous-aggregation's Check 3, and the analyzer's privacy report."""

from __future__ import annotations

import math
import pickle
import threading
from collections.abc import Callable, Mapping
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from privacy.accounting.core import (
    FMT_CLOSED_FORM,
    FMT_NUMERICAL,
    LEMMA_II6,
    LOCAL,
    THEOREM_III1_EXACT,
    THEOREM_III1_SIMPLIFIED,
    VARIATION_RATIO,
    BoundOutOfRange,
    CentralGuarantee,
    check_count,
    check_delta,
    check_epsilon,
    last_positive,
)
from privacy.accounting.shuffle import (
    fmt_closed_form_epsilon,
    fmt_closed_form_max_epsilon_local,
    fmt_numerical_delta,
    fmt_numerical_epsilon,
    theorem_iii1_epsilon,
    theorem_iii1_range,
)
from privacy.accounting.tight import WINDOW_SHARE, tight_bound
from privacy.accounting.variation_ratio import (
    LARGEST_EPSILON as VR_LARGEST_EPSILON,
)
from privacy.accounting.variation_ratio import (
    MAX_RESPONDENTS,
    ReducedPair,
    variation_ratio_parameters,
)

__all__ = [
    "ONE_HOT_RAPPOR",
    "BINARY_RR",
    "GENERIC",
    "MECHANISMS",
    "REPLACEMENT",
    "REMOVAL",
    "TIGHTEST",
    "PAPER_BOUNDS",
    "mechanism_bounds",
    "central_epsilon",
    "amplify",
    "recorded_amplifications",
    "remember_amplifications",
    "cohort_epsilon",
    "solve_epsilon_local",
    "min_respondents",
    "check_respondents",
]

ONE_HOT_RAPPOR = "one_hot_rappor"
BINARY_RR = "binary_rr"
GENERIC = "generic"
MECHANISMS = (ONE_HOT_RAPPOR, BINARY_RR, GENERIC)
REPLACEMENT = "replacement"
REMOVAL = "removal"
TIGHTEST = "tightest"

# The bound each mechanism's solver uses by default: the one behind the paper's tables for
# attribute-fragmented k-RAPPOR (Theorem III.1 in its exact Lemma II.6 form), Lemma II.6 for binary
# randomized response, and the FMT numerical bound for any other randomizer.
PAPER_BOUNDS: Mapping[str, str] = MappingProxyType(
    {ONE_HOT_RAPPOR: THEOREM_III1_EXACT, BINARY_RR: LEMMA_II6, GENERIC: FMT_NUMERICAL}
)

_MECHANISM_BOUNDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        ONE_HOT_RAPPOR: (
            VARIATION_RATIO,
            THEOREM_III1_EXACT,
            THEOREM_III1_SIMPLIFIED,
            FMT_NUMERICAL,
            FMT_CLOSED_FORM,
        ),
        BINARY_RR: (VARIATION_RATIO, LEMMA_II6, FMT_NUMERICAL, FMT_CLOSED_FORM),
        GENERIC: (VARIATION_RATIO, FMT_NUMERICAL, FMT_CLOSED_FORM),
    }
)


def _check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}; got {mechanism!r}")
    return mechanism


def _check_local_model(local_model: str) -> str:
    if local_model not in (REPLACEMENT, REMOVAL):
        raise ValueError(f"local_model must be {REPLACEMENT!r} or {REMOVAL!r}; got {local_model!r}")
    return local_model


def mechanism_bounds(mechanism: str) -> tuple[str, ...]:
    """The amplification bounds that apply to a mechanism, in the order they are tried."""
    return _MECHANISM_BOUNDS[_check_mechanism(mechanism)]


def _fmt_epsilon0(epsilon_local: float, mechanism: str, local_model: str) -> float:
    """The replacement eps_0 the FMT bounds take. Attribute-fragmented k-RAPPOR is bounded per
    attribute, as in the proof of Theorem III.1: each shuffler receives n bits, each an eps_l
    (replacement) randomized response, and removing a respondent changes one bit of one attribute.
    A removal eps_l-DP generic randomizer is replacement 2 eps_l-DP (samplable-anonymous-aggregation
    after Theorem 3.1)."""
    if mechanism == GENERIC and local_model == REMOVAL:
        return 2.0 * epsilon_local
    return epsilon_local


def _randomizer(mechanism: str) -> str:
    """The variation-ratio randomizer of a mechanism: one attribute of attribute-fragmented
    k-RAPPOR is binary randomized response (Theorem III.1's setting); any other randomizer gets
    the generic eps_0-LDP parameters (removal eps_l as replacement 2 eps_l, as for FMT)."""
    return "generic" if mechanism == GENERIC else "binary_rr"


def check_respondents(respondents: object) -> int:
    """A crowd size the bounds are evaluated for in bounded time (1 <= n <= MAX_RESPONDENTS)."""
    n = check_count(respondents, "respondents")
    if n > MAX_RESPONDENTS:
        raise ValueError(f"respondents must be <= {MAX_RESPONDENTS:.0e}, got {respondents!r}")
    return n


def _tight_delta(
    eps: float, mechanism: str, local_model: str, n: int, d: float, target: float
) -> float:
    """Certified delta of the variation-ratio bound at ``target`` for eps_l."""
    eps0 = _fmt_epsilon0(eps, mechanism, local_model)
    parameters = variation_ratio_parameters(_randomizer(mechanism), eps0)
    return ReducedPair(parameters, n, WINDOW_SHARE * d).delta(target)[1]


def central_epsilon(
    bound: str,
    epsilon_local: float,
    respondents: int,
    delta: float,
    mechanism: str = GENERIC,
    local_model: str = REPLACEMENT,
) -> float:
    """The central epsilon one named bound gives (BoundOutOfRange outside its range, ValueError
    for a bound that does not apply to the mechanism)."""
    mechanism = _check_mechanism(mechanism)
    local_model = _check_local_model(local_model)
    if bound not in _MECHANISM_BOUNDS[mechanism]:
        raise ValueError(
            f"bound {bound!r} does not apply to mechanism {mechanism!r}; "
            f"use one of {', '.join(_MECHANISM_BOUNDS[mechanism])}"
        )
    eps = check_epsilon(epsilon_local, "epsilon_local")
    n = check_respondents(respondents)
    d = check_delta(delta)
    if bound == VARIATION_RATIO:
        eps0 = _fmt_epsilon0(eps, mechanism, local_model)
        return tight_bound(_randomizer(mechanism), eps0, n, d, with_lower=False).upper
    if bound == THEOREM_III1_EXACT:
        return theorem_iii1_epsilon(eps, n, d, "exact")
    if bound == THEOREM_III1_SIMPLIFIED:
        return theorem_iii1_epsilon(eps, n, d, "simplified")
    if bound == LEMMA_II6:
        # Lemma II.6 with lambda = 2n/(1+e^eps_l): the same expression as Theorem III.1's exact
        # form, whose range check is the lambda condition (and clamps rounding at its ends).
        return theorem_iii1_epsilon(eps, n, d, "exact")
    eps0 = _fmt_epsilon0(eps, mechanism, local_model)
    if bound == FMT_CLOSED_FORM:
        return fmt_closed_form_epsilon(eps0, n, d)
    return fmt_numerical_epsilon(eps0, n, d)


def amplify(
    epsilon_local: float,
    respondents: int,
    delta: float,
    mechanism: str = GENERIC,
    *,
    local_model: str = REPLACEMENT,
) -> CentralGuarantee:
    """The tightest valid central (eps_c, delta) guarantee of n shuffled eps_l-DP reports.

    ``mechanism``:

    * ``one_hot_rappor``: attribute-fragmented k-RAPPOR (Algorithm 1), eps_l the per-bit
      randomized-response parameter (removal eps_l-LDP). Theorem III.1 (exact and simplified) and
      the FMT bounds applied per attribute (see :func:`_fmt_epsilon0`).
    * ``binary_rr``: one eps_l randomized-response bit per respondent: Lemma II.6 and FMT.
    * ``generic``: any eps_l-DP local randomizer (``local_model`` says replacement or removal):
      the FMT numerical bound, with the closed form where it holds.

    The local guarantee itself (no amplification) is always a candidate. Every candidate is
    evaluated; ``details["candidates"]`` holds each value or the reason it does not apply, and
    ``bound`` names the smallest.

    Each distinct (eps_l, n, delta, mechanism, local model) is evaluated once per process and
    kept (:data:`AMPLIFIED_KEPT` of them; the memo empties when full), or taken from evaluations
    another process made (:func:`remember_amplifications`): it is a pure function of them, and
    its root searches take milliseconds (7-10 ms at a few hundred respondents on 2 cores, tens
    of milliseconds for large crowds), which every crowd of that size, every recipe of those
    parameters and every report's comparison bound would repeat. Each call gets a fresh copy.
    """
    mechanism = _check_mechanism(mechanism)
    local_model = _check_local_model(local_model)
    eps = check_epsilon(epsilon_local, "epsilon_local")
    n = check_respondents(respondents)
    d = check_delta(delta)
    key = (eps, n, d, mechanism, local_model)
    found = _GIVEN.get(key) or _AMPLIFIED.get(key)
    if found is None:
        found = _amplified(*key)
        if len(_AMPLIFIED) >= AMPLIFIED_KEPT:
            _AMPLIFIED.clear()
        _AMPLIFIED[key] = found
    recording = getattr(_RECORDING, "entries", None)
    if recording is not None:
        recording[key] = found
    epsilon, bound, details = found
    return CentralGuarantee(
        epsilon=epsilon,
        delta=d,
        bound=bound,
        epsilon_local=eps,
        respondents=n,
        details=pickle.loads(details),
    )


# Distinct amplify() arguments kept per process (a few KB each).
AMPLIFIED_KEPT = 4096
# amplify()'s arguments -> (epsilon, bound, pickled details): evaluated here, and given.
_Amplified = dict[tuple[float, int, float, str, str], tuple[float, str, bytes]]
_AMPLIFIED: _Amplified = {}
_GIVEN: _Amplified = {}
_RECORDING = threading.local()


def recorded_amplifications(compute: Callable[[], Any]) -> _Amplified:
    """Every :func:`amplify` evaluation ``compute()`` needs (made, or found kept), as entries
    for :func:`remember_amplifications` in another process; what ``compute`` raises propagates."""
    entries: _Amplified = {}
    outer = getattr(_RECORDING, "entries", None)
    _RECORDING.entries = entries
    try:
        compute()
    finally:
        _RECORDING.entries = outer
    if outer is not None:
        outer.update(entries)
    return entries


def remember_amplifications(entries: _Amplified) -> None:
    """Let :func:`amplify` answer from ``entries`` (:func:`recorded_amplifications` of the same
    code), in place of those given before: evaluations spread over processes once, instead of
    made again by every process that needs them."""
    global _GIVEN
    _GIVEN = dict(entries)


def _amplified(
    eps: float, n: int, d: float, mechanism: str, local_model: str
) -> tuple[float, str, bytes]:
    """:func:`amplify`'s epsilon, bound and details (pickled) for checked arguments."""
    candidates: dict[str, float | str] = {}
    tight: dict[str, Any] | str
    try:
        found = tight_bound(
            _randomizer(mechanism), _fmt_epsilon0(eps, mechanism, local_model), n, d
        )
        tight = found.to_dict()
        candidates[VARIATION_RATIO] = found.upper
    except BoundOutOfRange as error:
        tight = f"not applicable: {error}"
    for bound in _MECHANISM_BOUNDS[mechanism]:
        if bound == VARIATION_RATIO:
            candidates.setdefault(bound, str(tight))
            continue
        try:
            candidates[bound] = central_epsilon(bound, eps, n, d, mechanism, local_model)
        except BoundOutOfRange as error:
            candidates[bound] = f"not applicable: {error}"
    candidates[LOCAL] = eps
    best = _smallest_candidate(candidates)
    details = {
        "mechanism": mechanism,
        "local_model": REMOVAL if mechanism == ONE_HOT_RAPPOR else local_model,
        "fmt_epsilon_0": _fmt_epsilon0(eps, mechanism, local_model),
        "candidates": candidates,
        "tight": tight,
    }
    return float(candidates[best]), best, pickle.dumps(details, pickle.HIGHEST_PROTOCOL)


def _smallest_candidate(candidates: Mapping[str, float | str]) -> str:
    """The bound with the smallest central epsilon (strings are reasons a bound does not apply)."""
    return min(
        (name for name, value in candidates.items() if isinstance(value, float)),
        key=lambda name: candidates[name],
    )


def cohort_epsilon(epsilon_local: float, respondents: int, delta: float) -> float:
    """Central epsilon of aggregating n replacement eps_0-DP reports (generic randomizer): the
    ``cohort_bound`` callable of ``privacy.budget`` for Check 3."""
    return amplify(epsilon_local, respondents, delta, GENERIC).epsilon


def charged_cohort_epsilon(epsilon_local: float, respondents: int, delta: float) -> float:
    """What a device is charged for one of ``respondents`` ε_ℓ-DP reports: :func:`cohort_epsilon`
    where a shuffle bound holds, never more than ε_ℓ itself (the report alone is ε_ℓ-DP, and
    shuffling is post-processing); ε_ℓ where no bound is valid at these parameters."""
    try:
        return min(epsilon_local, float(cohort_epsilon(epsilon_local, respondents, delta)))
    except (ValueError, OverflowError):
        return epsilon_local


# ---------------------------------------------------------------------------------------------
# Solvers
# ---------------------------------------------------------------------------------------------


def _fmt_delta(
    eps: float, mechanism: str, local_model: str, n: int, d: float, target: float
) -> float:
    """Upper bound on the delta at which the FMT numerical bound certifies ``target`` for eps_l:
    one delta evaluation instead of a search over epsilon."""
    eps0 = _fmt_epsilon0(eps, mechanism, local_model)
    return fmt_numerical_delta(eps0, n, target, tail_mass=1e-4 * d).upper


def _fmt_margin(
    eps: float, mechanism: str, local_model: str, n: int, d: float, target: float
) -> float:
    """log(delta(target)) - log(delta) of the FMT numerical bound at eps_l: <= 0 exactly when
    the bound certifies (target, delta)."""
    upper = _fmt_delta(eps, mechanism, local_model, n, d, target)
    return math.log(max(upper, 1e-300)) - math.log(d)


def _tight_margin(
    eps: float, mechanism: str, local_model: str, n: int, d: float, target: float
) -> float:
    """log(delta(target)) - log(delta) of the variation-ratio bound at eps_l (<= 0: certified)."""
    upper = _tight_delta(eps, mechanism, local_model, n, d, target)
    return math.log(max(upper, 1e-300)) - math.log(d)


def _epsilon_local_range(
    bound: str, mechanism: str, local_model: str, n: int, d: float, target: float
) -> tuple[float, float]:
    """Interval of eps_l on which ``bound`` holds (for FMT numerical, which holds everywhere: up
    to where it exceeds the target)."""
    if bound in (THEOREM_III1_EXACT, LEMMA_II6):
        return theorem_iii1_range(n, d, "exact")
    if bound == THEOREM_III1_SIMPLIFIED:
        return theorem_iii1_range(n, d, "simplified")
    factor = 2.0 if (mechanism == GENERIC and local_model == REMOVAL) else 1.0
    if bound == FMT_CLOSED_FORM:
        return 1e-9, fmt_closed_form_max_epsilon_local(n, d) / factor
    margin = _tight_margin if bound == VARIATION_RATIO else _fmt_margin
    cap = (VR_LARGEST_EPSILON if bound == VARIATION_RATIO else _LARGEST_EPSILON) / factor
    high = min(max(target, 1.0), cap)
    while high < cap and margin(high, mechanism, local_model, n, d, target) <= 0:
        high = min(2.0 * high, cap)
    return 1e-9, high


_LARGEST_EPSILON = 700.0  # e^eps overflows past ~709


def _largest_below(
    margin: Callable[[float], float], low: float, high: float, step: float
) -> tuple[float, bool] | None:
    """Largest x in [low, high] with margin(x) <= 0 for an increasing margin, and whether the
    range end stopped it; None if even ``low`` fails."""
    if margin(high) <= 0:
        return high, True
    if margin(low) > 0:
        return None
    # Largest x with margin(x) <= 0 is the last point where -margin is >= 0; bounded search.
    answer = last_positive(lambda x: -margin(x) + 1e-300, low, high, step / max(high, 1e-9))
    return answer, False


def _chosen_bound(mechanism: str, bound: str | None) -> str:
    """The bound a solver uses: ``bound``, or the mechanism's paper bound when None."""
    name = PAPER_BOUNDS[mechanism] if bound is None else bound
    if name not in _MECHANISM_BOUNDS[mechanism]:
        raise ValueError(
            f"bound {name!r} does not apply to mechanism {mechanism!r}; use one of "
            f"{', '.join(_MECHANISM_BOUNDS[mechanism] + (TIGHTEST,))}"
        )
    return name


def _tightest(
    solver: Callable[..., CentralGuarantee],
    pick: Callable[..., CentralGuarantee],
    field: str,
    arguments: tuple[float, float, float],
    mechanism: str,
    local_model: str,
) -> CentralGuarantee:
    """``bound="tightest"``: ``solver(*arguments, mechanism, ...)`` with every bound of the
    mechanism, and of the solutions of the bounds that apply the one whose ``field`` is ``pick``
    (max or min, the first on ties); BoundOutOfRange with every bound's reason when none applies."""
    solutions, reasons = [], []
    for name in _MECHANISM_BOUNDS[mechanism]:
        try:
            solutions.append(solver(*arguments, mechanism, bound=name, local_model=local_model))
        except BoundOutOfRange as error:
            reasons.append(f"{name}: {error}")
    if not solutions:
        raise BoundOutOfRange("no bound applies: " + "; ".join(reasons))
    return pick(solutions, key=attrgetter(field))


def solve_epsilon_local(
    epsilon_central: float,
    respondents: int,
    delta: float,
    mechanism: str = ONE_HOT_RAPPOR,
    *,
    bound: str | None = None,
    local_model: str = REPLACEMENT,
) -> CentralGuarantee:
    """The largest eps_l whose n shuffled reports are (eps_c, delta)-DP by ``bound``.

    This is how the paper's tables are made (Section VII-A: "the corresponding eps_l computed
    using Theorem III.1"). By default each mechanism uses ``PAPER_BOUNDS``: for
    ``one_hot_rappor``, Theorem III.1 in its exact form (Lemma II.6 with lambda = 2n/(1+e^eps_l)),
    which reproduces the eps_l_inf of Tables I, III, IV, VIII and IX (e.g. Horse, n = 1,914,589,
    delta = 5e-8, eps_c = 1 gives 8.55); the simplified form sqrt(64 e^eps_l log(4/delta)/n) does
    not (it gives 7.40 there). The Map entries (Table VIII) come out 0.003-0.012 below the printed
    ones with Table II's n = 236,559,063; every one of them fits n between 2.382e8 and 2.394e8,
    so the paper seems to have used a slightly larger Map crowd. ``bound="tightest"`` takes the
    largest eps_l any applicable bound
    allows. The result is the guarantee at the solution: ``epsilon`` <= eps_c is what the bound
    certifies there, ``details`` holds the target and whether the bound's validity range, rather
    than the target, capped eps_l. Found by root-finding on the (increasing) bound, then rounded
    down until the bound holds.
    """
    mechanism = _check_mechanism(mechanism)
    local_model = _check_local_model(local_model)
    target = check_epsilon(epsilon_central, "epsilon_central")
    n = check_respondents(respondents)
    d = check_delta(delta)
    if bound == TIGHTEST:
        return _tightest(
            solve_epsilon_local, max, "epsilon_local", (target, n, d), mechanism, local_model
        )
    name = _chosen_bound(mechanism, bound)
    low, high = _epsilon_local_range(name, mechanism, local_model, n, d, target)

    def certified(eps: float) -> float:
        return central_epsilon(name, max(eps, 1e-12), n, d, mechanism, local_model)

    def margin(eps: float) -> float:
        if name == FMT_NUMERICAL:
            return _fmt_margin(max(eps, 1e-12), mechanism, local_model, n, d, target)
        if name == VARIATION_RATIO:
            return _tight_margin(max(eps, 1e-12), mechanism, local_model, n, d, target)
        return certified(eps) - target

    found = _largest_below(margin, low, high, step=1e-7)
    if found is None:
        raise BoundOutOfRange(
            f"{name}: no epsilon_local in [{low:.6g}, {high:.6g}] meets epsilon_central = "
            f"{target:.6g} for n = {n}, delta = {d:.6g}: even epsilon_local = {low:.6g} gives "
            f"{certified(low):.6g}; more respondents are needed"
        )
    solution, capped = found
    # margin(solution) <= 0 certifies (target, delta); the bound's own value may be lower (or, for
    # the numerical bound, a rounding step above the target it certified).
    return CentralGuarantee(
        epsilon=min(certified(solution), target),
        delta=d,
        bound=name,
        epsilon_local=max(solution, 1e-12),
        respondents=n,
        details={
            "target_epsilon_central": target,
            "mechanism": mechanism,
            "epsilon_local_range": [low, high],
            "limited_by_validity_range": capped,
        },
    )


def _meets(
    bound: str, eps: float, n: int, d: float, target: float, mechanism: str, local_model: str
) -> bool:
    if bound == FMT_NUMERICAL:
        return _fmt_delta(eps, mechanism, local_model, n, d, target) <= d
    if bound == VARIATION_RATIO:
        return _tight_delta(eps, mechanism, local_model, n, d, target) <= d
    try:
        return central_epsilon(bound, eps, n, d, mechanism, local_model) <= target
    except BoundOutOfRange:
        return False


_MAX_RESPONDENTS = 2**33  # the largest power of two below MAX_RESPONDENTS


def min_respondents(
    epsilon_central: float,
    epsilon_local: float,
    delta: float,
    mechanism: str = GENERIC,
    *,
    bound: str | None = None,
    local_model: str = REPLACEMENT,
) -> CentralGuarantee:
    """The smallest crowd n for which n shuffled eps_l-DP reports are (eps_c, delta)-DP: the
    minimum cohort m of samplable-anonymous-aggregation Section 4, Check 3. Bounds as in
    :func:`solve_epsilon_local` (the FMT numerical bound for ``generic``); the guarantee shrinks
    as n grows, so n is found by doubling and then bisection, and checked at the end.
    """
    mechanism = _check_mechanism(mechanism)
    local_model = _check_local_model(local_model)
    target = check_epsilon(epsilon_central, "epsilon_central")
    eps = check_epsilon(epsilon_local, "epsilon_local")
    d = check_delta(delta)
    if bound == TIGHTEST:
        return _tightest(
            min_respondents, min, "respondents", (target, eps, d), mechanism, local_model
        )
    name = _chosen_bound(mechanism, bound)

    def meets(n: int) -> bool:
        return _meets(name, eps, n, d, target, mechanism, local_model)

    high = 1
    while not meets(high):
        if high >= _MAX_RESPONDENTS:
            raise BoundOutOfRange(
                f"{name}: no crowd of up to 2^33 respondents gives epsilon_central <= {target:.6g} "
                f"for epsilon_local = {eps:.6g}, delta = {d:.6g}"
            )
        high *= 2
    low = high // 2  # fails (or is 0)
    while high - low > 1:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    return CentralGuarantee(
        epsilon=min(central_epsilon(name, eps, high, d, mechanism, local_model), target),
        delta=d,
        bound=name,
        epsilon_local=eps,
        respondents=high,
        details={"target_epsilon_central": target, "mechanism": mechanism},
    )

"""The privacy side of a scenario: its local budget solved from the central target (Theorem III.1),
its report-fragment split (Theorem IV.1, Section VII-A), the Gaussian baseline, and the one-hot
randomizer that spends it."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.scenarios import GAUSSIAN, SKETCH_EXACT, Scenario
from privacy.accounting import (
    ONE_HOT_RAPPOR,
    THEOREM_III1_EXACT,
    BoundOutOfRange,
    central_epsilon,
    gaussian_baseline,
    report_fragment_local_guarantee,
    solve_epsilon_local,
)
from privacy.randomizers import OneHotRappor, ReportFragmented
from simulators.exact import Dataset

# --------------------------------------------------------------------------------------------
# Privacy parameters of a scenario
# --------------------------------------------------------------------------------------------

GAUSSIAN_BOUND = "analytic_gaussian"
SKETCH_BOUND = "none_known"
NO_PRIVACY = "no_privacy"
COMPOSED_BOUND = "basic_composition_of_local"


@dataclass(frozen=True)
class ScenarioPrivacy:
    """How a scenario's budget was set and what it guarantees.

    epsilon_local: the respondent's whole local budget eps_l (Theorem III.1 solution for the
    target eps_c, or the fixed eps_l); epsilon_per_split: eps_l / splits, the budget of one run or
    hash function; epsilon_backstop / epsilon_fragment: eps_b and eps_f of report fragments
    (sinh(eps_f) = sinh(eps_b)/tau, Section VII-A); epsilon_all / epsilon_one: eps_l_inf and eps_l1
    (Theorem IV.1 with t = tau and t = 1); epsilon_central: what ``bound`` certifies (None when no
    bound is known, as for sketches); sigma_paper / sigma_exact / paper_sigma_delta: the Gaussian
    baseline's sigma as the paper computes it, the exact analytic sigma, and the delta the paper's
    sigma really gives. ``reason`` says why a scenario could not be run (its bound's range).
    """

    epsilon_local: float | None = None
    epsilon_per_split: float | None = None
    epsilon_backstop: float | None = None
    epsilon_fragment: float | None = None
    epsilon_all: float | None = None
    epsilon_one: float | None = None
    epsilon_central: float | None = None
    bound: str = ""
    sigma_paper: float | None = None
    sigma_exact: float | None = None
    paper_sigma_delta: float | None = None
    reason: str = ""

    @property
    def applicable(self) -> bool:
        return not self.reason


def scenario_privacy(scenario: Scenario, dataset: Dataset) -> ScenarioPrivacy:
    """Privacy parameters of a scenario at the dataset's n and delta (Theorems III.1 and IV.1,
    Section VII-A's equal-variance fragments, the paper's and the exact Gaussian sigma)."""
    n, delta = dataset.respondents, dataset.delta
    if scenario.mechanism == SKETCH_EXACT:
        return ScenarioPrivacy(bound=NO_PRIVACY)
    if scenario.mechanism == GAUSSIAN:
        baseline = gaussian_baseline(scenario.central_epsilon, delta)
        return ScenarioPrivacy(
            epsilon_central=scenario.central_epsilon,
            bound=GAUSSIAN_BOUND,
            sigma_paper=baseline.sigma_paper,
            sigma_exact=baseline.sigma_exact,
            paper_sigma_delta=baseline.paper_delta,
        )
    if scenario.local_epsilon is not None:
        total = scenario.local_epsilon
        try:
            certified = central_epsilon(THEOREM_III1_EXACT, total, n, delta, ONE_HOT_RAPPOR)
            bound = THEOREM_III1_EXACT
        except BoundOutOfRange as error:
            # A fixed eps_l runs anyway; only the central guarantee is missing.
            certified, bound = None, f"out of range: {error}"
    else:
        try:
            solved = solve_epsilon_local(
                scenario.central_epsilon, n, delta, ONE_HOT_RAPPOR, bound=scenario.bound
            )
        except BoundOutOfRange as error:
            return ScenarioPrivacy(reason=str(error))
        total, certified, bound = solved.epsilon_local, solved.epsilon, solved.bound
    per_split = total / scenario.splits
    local = report_fragment_local_guarantee(per_split, scenario.fragments)
    epsilon_all = total if scenario.splits > 1 else local.epsilon_all
    if scenario.is_sketch:
        # Section III: no analysis is known that certifies eps_c for sketches with attribute
        # fragments; known analyses only give target <= eps_c <= eps_l_inf.
        certified, bound = None, SKETCH_BOUND
    elif scenario.splits > 1:
        certified, bound = None, COMPOSED_BOUND
    return ScenarioPrivacy(
        epsilon_local=total,
        epsilon_per_split=per_split,
        epsilon_backstop=local.epsilon_backstop,
        epsilon_fragment=local.epsilon_fragment,
        epsilon_all=epsilon_all,
        epsilon_one=local.epsilon_one,
        epsilon_central=certified,
        bound=bound,
    )


def one_hot_randomizer(
    privacy: ScenarioPrivacy, fragments: int, domain_size: int
) -> OneHotRappor | ReportFragmented:
    """The randomizer of one run: att-frag k-RAPPOR (Algorithm 1) or its report-fragmented
    version r-frag (Algorithm 2) with the scenario's eps_b and eps_f."""
    if fragments > 1:
        return ReportFragmented(
            backstop_epsilon=privacy.epsilon_backstop,
            fragment_epsilon=privacy.epsilon_fragment,
            fragments=fragments,
            domain_size=domain_size,
        )
    return OneHotRappor(domain_size=domain_size, epsilon=privacy.epsilon_per_split)

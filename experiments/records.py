"""Pieces every table builder shares: the CSV record of a scenario, the texts of its cells and the
notes on method."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from experiments.budgets import ScenarioPrivacy
from experiments.lab import ExperimentLab, Outcome
from experiments.render import Table, fmt, paper_fmt
from experiments.scenarios import Scenario
from privacy.accounting import (
    THEOREM_III1_EXACT,
)

OUTCOME_COLUMNS = (
    "table",
    "dataset",
    "respondents",
    "domain_size",
    "delta",
    "seed",
    "scenario",
    "mechanism",
    "fragments",
    "splits",
    "target_eps_c",
    "eps_l",
    "eps_backstop",
    "eps_fragment",
    "eps_l_inf",
    "eps_l1",
    "eps_c_certified",
    "bound",
    "sigma_paper",
    "sigma_exact",
    "paper_sigma_delta",
    "messages_per_respondent",
    "rmse",
    "rmse_theory",
    "rmse_over_theory",
    "rmse_norm_sub",
    "top_items",
    "top_recovered",
    "seconds",
    "paper_eps_l_inf",
    "paper_eps_l1",
    "paper_sigma",
    "paper_rmse",
    "paper_messages",
    "paper_eps_c",
    "note",
)


def outcome_record(table: str, outcome: Outcome, lab: ExperimentLab, **paper: float | None) -> dict:
    """The CSV record of one scenario (``paper`` adds the paper_* columns)."""
    scenario, privacy = outcome.scenario, outcome.privacy
    dataset = lab.dataset(scenario.dataset)
    top = outcome.top_recovered is not None and scenario.dataset == "heavy-hitters"
    record = dict(
        table=table,
        dataset=dataset.key,
        respondents=outcome.respondents,
        domain_size=outcome.domain_size,
        delta=dataset.delta,
        seed=lab.config.seed,
        scenario=scenario.name,
        mechanism=scenario.mechanism,
        fragments=scenario.fragments,
        splits=scenario.splits,
        target_eps_c=scenario.central_epsilon,
        eps_l=privacy.epsilon_local,
        eps_backstop=privacy.epsilon_backstop,
        eps_fragment=privacy.epsilon_fragment,
        eps_l_inf=privacy.epsilon_all,
        eps_l1=privacy.epsilon_one,
        eps_c_certified=privacy.epsilon_central,
        bound=privacy.bound,
        sigma_paper=privacy.sigma_paper,
        sigma_exact=privacy.sigma_exact,
        paper_sigma_delta=privacy.paper_sigma_delta,
        messages_per_respondent=outcome.messages_per_respondent,
        rmse=outcome.rmse,
        rmse_theory=outcome.rmse_theory,
        rmse_over_theory=outcome.rmse_ratio,
        rmse_norm_sub=outcome.rmse_projected,
        top_items=lab.config.top_items if top else None,
        top_recovered=outcome.top_recovered if top else None,
        seconds=outcome.seconds,
        note=privacy.reason,
    )
    record.update({f"paper_{name}": value for name, value in paper.items()})
    return record


def rmse_text(outcome: Outcome, paper: float | None = None) -> str:
    """'RMSE = x (theory y; norm-sub z; paper w)'."""
    if not outcome.privacy.applicable:
        return f"not run: {outcome.privacy.reason}"
    parts = [f"theory {fmt(outcome.rmse_theory)}", f"norm-sub {fmt(outcome.rmse_projected)}"]
    if paper is not None:
        parts.append(f"paper {paper_fmt(paper)}")
    return f"RMSE = {fmt(outcome.rmse)} ({'; '.join(parts)})"


def epsilon_text(privacy: ScenarioPrivacy, paper_all: float | None, paper_one: float | None) -> str:
    text = f"ε_ℓ∞ = {fmt(privacy.epsilon_all)}, ε_ℓ1 = {fmt(privacy.epsilon_one)}"
    if paper_all is not None:
        text += (
            f" (paper {paper_fmt(paper_all)}, {paper_fmt(paper_one if paper_one else paper_all)})"
        )
    return text


def gaussian_text(outcome: Outcome, paper_sigma: float | None, paper_rmse: float | None) -> str:
    privacy = outcome.privacy
    paper = f" (paper {paper_fmt(paper_sigma)})" if paper_sigma is not None else ""
    return (
        f"σ = {fmt(privacy.sigma_paper)}{paper}, which is (ε_c, "
        f"{privacy.paper_sigma_delta:.2g})-DP<br>exact σ = {fmt(privacy.sigma_exact)}, "
        f"(ε_c, δ)-DP<br>{rmse_text(outcome, paper_rmse)}"
    )


def common_notes(lab: ExperimentLab, keys: Sequence[str], sketch: bool, gaussian: bool) -> list:
    config = lab.config
    notes = []
    for key in keys:
        dataset = lab.dataset(key)
        notes.append(
            f"{dataset.title}: seed {config.seed}, n = {dataset.respondents:,}, "
            f"d = {dataset.domain_size:,}, δ = {dataset.delta:g}. {dataset.source}."
        )
    notes.append(
        "ε_ℓ is the largest per-bit randomized-response ε whose attribute-fragmented reports are "
        "(ε_c, δ)-DP by Theorem III.1 in its exact form (Lemma II.6 with λ = 2n/(1+e^ε_ℓ), bound "
        f"'{THEOREM_III1_EXACT}'). Report fragments: backstop ε_b = ε_ℓ and sinh(ε_f) = "
        "sinh(ε_b)/τ, the rule that reproduces the paper's columns; ε_ℓ∞ and ε_ℓ1 are Theorem "
        "IV.1 with t = τ and t = 1, in log-sum-exp form. The paper describes the rule as equal "
        "variance in the two randomization steps; that holds for large ε (ε_f ≈ ε_b − ln τ), but "
        "at small ε the τ fragments together are far noisier than the backstop (equal variance "
        "would be sinh(ε_f/2) = sinh(ε_b/2)/√τ), which is why τ = 256 costs so much at small ε_c "
        "in the unbiased RMSE."
    )
    notes.append(
        "RMSE is over all d values of the unbiased estimate (respondents per value) and is "
        "compared with the estimator's theoretical standard error ('theory'), not with the "
        "paper's RMSE, which depends on the paper's own data; 'norm-sub' is the RMSE after our "
        "consistency projection (non-negative, summing to n), a post-processing that improves "
        "on the unbiased estimate wherever many values are near zero."
    )
    if gaussian:
        notes.append(
            "Gaussian mechanism: the paper's σ = (√L + √(L+2ε_c))/(2ε_c), L = ln(1/(2δ)), is "
            "shown with the δ it really gives for sensitivity 1: it is the privacy loss at √L "
            "standard deviations, which meets δ only for very small ε_c (in Table I at ε_c = "
            "0.0025); at larger ε_c it is below the exact σ and its real δ exceeds the stated "
            "one. The exact analytic "
            "Gaussian σ (Balle and Wang) is (ε_c, δ)-DP and is the noise our Gaussian RMSE uses."
        )
    if sketch:
        notes.append(
            f"Count sketch: {config.sketch_hashes:,} hash functions × {config.sketch_width:,} "
            "bits, one hash function per report. No analysis certifies ε_c for sketches with "
            "attribute fragments (Section III): known analyses only give target ≤ ε_c ≤ ε_ℓ∞. "
            "Simulated exactly from the distribution of the sketch cells (each report picks a row "
            "uniformly: multinomial row counts; per-bit randomized response: binomial cell sums); "
            "hash family: CountMeanSketch's multiply-add-shift of scrambled keys, hash seed = "
            "the experiment seed."
        )
    notes.append(
        "#msgs: expected messages (set bits) per respondent, p_one + (d − 1)·p_zero for one-hot "
        "(Section II-B), τ times the per-fragment count with report fragments."
    )
    return notes


def timed(builder: Callable[[ExperimentLab], Table]) -> Callable[[ExperimentLab], Table]:
    def build(lab: ExperimentLab) -> Table:
        started = time.perf_counter()
        table = builder(lab)
        return table.with_seconds(time.perf_counter() - started)

    build.__name__ = builder.__name__
    build.__doc__ = builder.__doc__
    return build


def by_key(outcomes: dict[Scenario, Outcome]) -> dict[tuple, Outcome]:
    """Outcomes by (mechanism, eps_c, eps_l, fragments, splits), plus the solving bound as a
    sixth element for scenarios solved with another bound than the paper's."""
    return {
        (s.mechanism, s.central_epsilon, s.local_epsilon, s.fragments, s.splits)
        + (() if s.bound is None else (s.bound,)): o
        for s, o in outcomes.items()
    }


def tight_text(tight: Outcome, paper: Outcome) -> str:
    """The "tight" cell: eps_l solved with the tight bound at the row's eps_c and its RMSE,
    beside the paper's eps_l (Theorem III.1) and RMSE."""
    if not tight.privacy.applicable:
        return f"not run: {tight.privacy.reason}"
    return (
        f"ε_ℓ = {fmt(tight.privacy.epsilon_local)} (Theorem III.1: "
        f"{fmt(paper.privacy.epsilon_local)})<br>{rmse_text(tight)}"
        f"<br>Theorem III.1's RMSE = {fmt(paper.rmse)}"
    )


def roman_value(key: str) -> int:
    """The value of a Roman numeral (a table's key: "VIII" -> 8)."""
    values = {"I": 1, "V": 5, "X": 10}
    total = 0
    for index, char in enumerate(key):
        value = values[char]
        following = values[key[index + 1]] if index + 1 < len(key) else 0
        total += -value if value < following else value
    return total

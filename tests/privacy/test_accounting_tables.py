"""Tests of privacy.accounting against the paper's tables (esa-privacy-revisited Tables I-IX):
epsilon_local solved for each epsilon_c, report-fragment columns and the Gaussian sigma column."""

from __future__ import annotations

import math

import pytest

from privacy import accounting as acc
from tests.privacy.accounting_references import DATASETS

# eps_c -> eps_l_inf (attribute fragmenting) from Tables I (heavy hitter), IV (horse),
# VIII (map), IX (child); Table III repeats eps_c = 0.05 and 1.0 (map 0.05: 7.385).
PUBLISHED_EPSILON_LOCAL = {
    "heavy_hitter": {0.0025: 1.78, 0.01: 4.07, 0.05: 7.235, 0.25: 10.40, 1.0: 12.99},
    "horse": {0.05: 2.94, 0.25: 5.96, 0.5: 7.28, 0.75: 8.03, 1.0: 8.55},
    "map": {0.05: 7.385, 0.25: 10.56, 0.5: 11.88, 0.75: 12.63, 1.0: 13.14},
    "child": {0.05: 5.95, 0.25: 9.11, 0.5: 10.435, 0.75: 11.18, 1.0: 11.7},
}

# Report-fragment columns: eps_c -> [(eps_l_inf, eps_l1) for tau = 4, 16, 256]; None where the
# table prints only one eps_l_inf for the row; OUTLIER for Table I's 1.52, which no tau can give
# (see test_heavy_hitter_tau_256_outlier_is_beyond_the_rules_limit).
TAUS = (4, 16, 256)
OUTLIER = "outlier"
PUBLISHED_FRAGMENTS = {
    "heavy_hitter": {
        0.0025: [(1.45, 0.47), (1.50, 0.13), (OUTLIER, 0.01)],
        0.01: [(None, 2.47), (None, 1.30), (None, 0.11)],
        0.05: [(None, 5.63), (None, 4.40), (None, 1.72)],
        0.25: [(None, 8.79), (None, 7.56), (None, 4.85)],
        1.0: [(None, 11.38), (None, 10.15), (None, 7.44)],
    },
    "horse": {
        0.05: [(2.91, 1.37), (2.94, 0.50), (2.94, 0.03)],
        0.25: [(5.96, 4.35), (5.96, 3.13), (5.96, 0.70)],
        0.5: [(7.28, 5.67), (7.28, 4.45), (7.28, 1.76)],
        0.75: [(8.03, 6.42), (8.03, 5.19), (8.03, 2.49)],
        1.0: [(8.55, 6.94), (8.55, 5.71), (8.55, 3.00)],
    },
    "map": {
        0.05: [(7.39, 5.78), (7.39, 4.55), (7.39, 1.86)],
        0.25: [(10.56, 8.95), (10.56, 7.72), (10.56, 5.01)],
        0.5: [(11.88, 10.27), (11.88, 9.04), (11.88, 6.33)],
        0.75: [(12.63, 11.02), (12.63, 9.79), (12.63, 7.08)],
        1.0: [(13.14, 11.53), (13.14, 10.30), (13.14, 7.59)],
    },
    "child": {
        0.05: [(5.95, 4.34), (5.95, 3.12), (5.95, 0.69)],
        0.25: [(9.11, 7.50), (9.11, 6.27), (9.11, 3.56)],
        0.5: [(10.435, 8.83), (10.435, 7.60), (10.435, 4.89)],
        0.75: [(11.18, 9.57), (11.18, 8.34), (11.18, 5.63)],
        1.0: [(11.7, 10.09), (11.7, 8.86), (11.7, 6.15)],
    },
}

# Gaussian sigma column ("No LDP") of Tables I, IV, VIII, IX.
PUBLISHED_SIGMA = {
    "heavy_hitter": {0.0025: 1821.02, 0.01: 455.34, 0.05: 91.16, 0.25: 18.32, 1.0: 4.66},
    "horse": {0.05: 80.42, 0.25: 16.18, 0.5: 8.15, 0.75: 5.47, 1.0: 4.14},
    "map": {0.05: 91.16, 0.25: 18.32, 0.5: 9.21, 0.75: 6.18, 1.0: 4.66},
    "child": {0.05: 85.95, 0.25: 17.28, 0.5: 8.70, 0.75: 5.84, 1.0: 4.41},
}


def tolerance(dataset: str) -> float:
    """Two-decimal agreement (0.005) plus the rounding slack of the printed values. Map is the
    exception: its tables fit a crowd about 0.7% larger than Table II's 236,559,063 (n between
    2.382e8 and 2.394e8 reproduces every Map entry to the printed digits), so with Table II's n
    its entries come out 0.003-0.012 lower."""
    return 0.0125 if dataset == "map" else 0.0051


def table_cases():
    for dataset, rows in PUBLISHED_EPSILON_LOCAL.items():
        for epsilon_central, published in rows.items():
            yield pytest.param(
                dataset, epsilon_central, published, id=f"{dataset}-{epsilon_central}"
            )


@pytest.mark.parametrize(("dataset", "epsilon_central", "published"), list(table_cases()))
def test_solver_reproduces_published_epsilon_local(dataset, epsilon_central, published):
    n, delta = DATASETS[dataset]
    result = acc.solve_epsilon_local(epsilon_central, n, delta, acc.ONE_HOT_RAPPOR)
    assert result.bound == acc.THEOREM_III1_EXACT
    assert result.epsilon_local == pytest.approx(published, abs=tolerance(dataset))
    assert result.epsilon <= epsilon_central
    assert not result.details["limited_by_validity_range"]


def test_tables_follow_the_exact_form_not_the_simplified_one():
    n, delta = DATASETS["horse"]
    exact = acc.solve_epsilon_local(1.0, n, delta, bound=acc.THEOREM_III1_EXACT)
    simplified = acc.solve_epsilon_local(1.0, n, delta, bound=acc.THEOREM_III1_SIMPLIFIED)
    assert round(exact.epsilon_local, 2) == 8.55
    assert simplified.epsilon_local < 7.5  # 7.40: the simplified form is not what the paper used


def fragment_cases():
    for dataset, rows in PUBLISHED_FRAGMENTS.items():
        for epsilon_central, columns in rows.items():
            for tau, (all_fragments, one_fragment) in zip(TAUS, columns, strict=True):
                yield pytest.param(
                    dataset,
                    epsilon_central,
                    tau,
                    all_fragments,
                    one_fragment,
                    id=f"{dataset}-{epsilon_central}-{tau}",
                )


@pytest.mark.parametrize(
    ("dataset", "epsilon_central", "tau", "all_fragments", "one_fragment"), list(fragment_cases())
)
def test_report_fragment_columns(dataset, epsilon_central, tau, all_fragments, one_fragment):
    n, delta = DATASETS[dataset]
    backstop = acc.solve_epsilon_local(epsilon_central, n, delta).epsilon_local
    local = acc.report_fragment_local_guarantee(backstop, tau)
    assert math.sinh(local.epsilon_fragment) == pytest.approx(math.sinh(backstop) / tau)
    slack = 0.011 if dataset != "map" else 0.0135
    if all_fragments is None:
        all_fragments = PUBLISHED_EPSILON_LOCAL[dataset][epsilon_central]
    if all_fragments != OUTLIER:
        assert local.epsilon_all == pytest.approx(all_fragments, abs=slack)
    assert local.epsilon_one == pytest.approx(one_fragment, abs=slack)


def test_heavy_hitter_tau_256_outlier_is_beyond_the_rules_limit():
    # Table I prints eps_l_inf = 1.52 for tau = 256 at eps_c = 0.0025. Under sinh(eps_f) =
    # sinh(eps_b)/tau, tau eps_f -> sinh(eps_b) as tau grows, so eps_l_inf tends to
    # ln((e^(b + sinh b) + 1) / (e^b + e^sinh b)) < 1.51 and no tau gives 1.52.
    n, delta = DATASETS["heavy_hitter"]
    backstop = acc.solve_epsilon_local(0.0025, n, delta).epsilon_local
    limit = math.log(
        (math.exp(backstop + math.sinh(backstop)) + 1)
        / (math.exp(backstop) + math.exp(math.sinh(backstop)))
    )
    values = [
        acc.report_fragment_local_guarantee(backstop, tau).epsilon_all
        for tau in (4, 16, 256, 10**6)
    ]
    assert values == sorted(values)
    assert values[-1] == pytest.approx(limit, abs=1e-6)
    assert limit < 1.51


@pytest.mark.parametrize("dataset", list(PUBLISHED_SIGMA))
def test_gaussian_paper_sigma_reproduces_tables(dataset):
    _, delta = DATASETS[dataset]
    for epsilon, sigma in PUBLISHED_SIGMA[dataset].items():
        assert acc.gaussian_sigma_paper(epsilon, delta) == pytest.approx(sigma, abs=0.006)

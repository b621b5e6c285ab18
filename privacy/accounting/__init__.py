"""Central-privacy accounting for the ESA pipeline (pure numpy/scipy; scipy is imported inside
the functions that use it, so that shuffler and analyzer workers that only carry recipes do not
load it: about 1 s of start-up per process).

What anonymity buys: the central (eps_c, delta) guarantee of n shuffled eps_l-DP reports, with the
bound that produced it, and the parameters of the other privacy mechanisms of esa-privacy-revisited.
Every bound refuses parameters outside its validity range with :class:`BoundOutOfRange` (a
``ValueError`` whose message names the condition) instead of returning a number that does not
hold: outside their conditions closed forms can fall below the true epsilon.

* ``shuffle``: Lemma II.6, Theorem III.1 (exact and simplified), FMT closed form and FMT numerical.
* ``variation_ratio`` and ``tight``: the variation-ratio reduction of Wang et al. (VLDB 2024), the
  default tightest bound, with a lower bound from an explicit pair of neighbouring datasets.
* ``pld``: :func:`compose` of several releases (PLDs from dp-accounting, basic, advanced).
* ``fragments``: Theorem IV.1 (t of tau fragments), Theorem IV.2, the equal-variance eps_f rule.
* ``composition``: basic and advanced (Theorem II.7) composition of plain guarantees.
* ``deletion``: Algorithm 3, Theorems V.1 and V.2 (Laplace scale and offset for the shuffler).
* ``gaussian``: the "No LDP" baseline sigma, as the paper computes it and exactly.
* ``solvers``: :func:`amplify` (tightest valid guarantee), :func:`solve_epsilon_local` (the tables'
  eps_l for a target eps_c), :func:`min_respondents` (Check 3), :func:`privacy_report`.

What reproduces the paper's tables (tests/privacy/test_accounting_tables.py): the eps_l_inf columns
are Theorem III.1 in its exact form (Lemma II.6 with lambda = 2n/(1+e^eps_l)) solved for eps_c; the
report-fragment columns follow sinh(eps_f) = sinh(eps_b)/tau with Theorem IV.1 at t = tau and
t = 1; the Gaussian sigma column is :func:`gaussian_sigma_paper`. Table III's first row (eps_l = 2,
printed with two significant digits) is within 5% of the FMT numerical bound applied per attribute
(0.00125 vs 0.0012 for the heavy-hitter data), not Theorem III.1, which gives 2.5 times as much. Theorem IV.2's first
term, as printed, does not hold and is not used (see :func:`theorem_iv2_epsilon`).
"""

from privacy.accounting.composition import compose_advanced, compose_basic, compose_repeated
from privacy.accounting.core import (
    ADVANCED_COMPOSITION,
    BASIC_COMPOSITION,
    BOUND_DESCRIPTIONS,
    FMT_CLOSED_FORM,
    FMT_NUMERICAL,
    LEMMA_II6,
    LOCAL,
    THEOREM_III1_EXACT,
    THEOREM_III1_SIMPLIFIED,
    THEOREM_IV2,
    VARIATION_RATIO,
    BoundOutOfRange,
    CentralGuarantee,
    PrivacyLoss,
)
from privacy.accounting.deletion import (
    DeletionBounds,
    DeletionNoise,
    deletion_bounds,
    deletion_noise,
)
from privacy.accounting.fragments import (
    LocalGuarantee,
    equal_variance_fragment_epsilon,
    report_fragment_epsilon,
    report_fragment_local_guarantee,
    theorem_iv2_epsilon,
)
from privacy.accounting.gaussian import (
    GaussianBaseline,
    gaussian_baseline,
    gaussian_delta,
    gaussian_sigma_exact,
    gaussian_sigma_paper,
)
from privacy.accounting.pld import (
    PLD_COMPOSITION,
    ComposedGuarantee,
    PrivacyCurve,
    compose,
    compose_prefixes,
    tight_curve,
)
from privacy.accounting.report import PrivacyReport, privacy_report, randomizer_central
from privacy.accounting.shuffle import (
    DeltaBracket,
    binary_rr_lambda,
    fmt_closed_form_epsilon,
    fmt_closed_form_max_epsilon_local,
    fmt_numerical_delta,
    fmt_numerical_epsilon,
    lemma_ii6_epsilon,
    theorem_iii1_epsilon,
    theorem_iii1_range,
)
from privacy.accounting.solvers import (
    BINARY_RR,
    GENERIC,
    MECHANISMS,
    ONE_HOT_RAPPOR,
    PAPER_BOUNDS,
    REMOVAL,
    REPLACEMENT,
    TIGHTEST,
    amplify,
    central_epsilon,
    charged_cohort_epsilon,
    cohort_epsilon,
    mechanism_bounds,
    min_respondents,
    recorded_amplifications,
    remember_amplifications,
    solve_epsilon_local,
)
from privacy.accounting.tight import (
    RANDOMIZERS,
    TightBound,
    binary_rr_pair_delta,
    binary_rr_pair_epsilon,
    tight_bound,
    variation_ratio_delta,
    variation_ratio_epsilon,
)
from privacy.accounting.variation_ratio import (
    MAX_RESPONDENTS,
    ReducedPair,
    VariationRatio,
    variation_ratio_parameters,
)

__all__ = [
    "MAX_RESPONDENTS",
    "PLD_COMPOSITION",
    "RANDOMIZERS",
    "VARIATION_RATIO",
    "ComposedGuarantee",
    "PrivacyCurve",
    "ReducedPair",
    "TightBound",
    "VariationRatio",
    "binary_rr_pair_delta",
    "binary_rr_pair_epsilon",
    "compose_prefixes",
    "compose_repeated",
    "tight_bound",
    "tight_curve",
    "variation_ratio_delta",
    "variation_ratio_epsilon",
    "variation_ratio_parameters",
    "ADVANCED_COMPOSITION",
    "BASIC_COMPOSITION",
    "BINARY_RR",
    "BOUND_DESCRIPTIONS",
    "FMT_CLOSED_FORM",
    "FMT_NUMERICAL",
    "GENERIC",
    "LEMMA_II6",
    "LOCAL",
    "MECHANISMS",
    "ONE_HOT_RAPPOR",
    "PAPER_BOUNDS",
    "REMOVAL",
    "REPLACEMENT",
    "THEOREM_III1_EXACT",
    "THEOREM_III1_SIMPLIFIED",
    "THEOREM_IV2",
    "TIGHTEST",
    "BoundOutOfRange",
    "CentralGuarantee",
    "DeletionBounds",
    "DeletionNoise",
    "DeltaBracket",
    "GaussianBaseline",
    "LocalGuarantee",
    "PrivacyLoss",
    "PrivacyReport",
    "amplify",
    "binary_rr_lambda",
    "central_epsilon",
    "charged_cohort_epsilon",
    "cohort_epsilon",
    "compose",
    "compose_advanced",
    "compose_basic",
    "deletion_bounds",
    "deletion_noise",
    "equal_variance_fragment_epsilon",
    "fmt_closed_form_epsilon",
    "fmt_closed_form_max_epsilon_local",
    "fmt_numerical_delta",
    "fmt_numerical_epsilon",
    "gaussian_baseline",
    "gaussian_delta",
    "gaussian_sigma_exact",
    "gaussian_sigma_paper",
    "lemma_ii6_epsilon",
    "mechanism_bounds",
    "min_respondents",
    "privacy_report",
    "randomizer_central",
    "recorded_amplifications",
    "remember_amplifications",
    "report_fragment_epsilon",
    "report_fragment_local_guarantee",
    "solve_epsilon_local",
    "theorem_iii1_epsilon",
    "theorem_iii1_range",
    "theorem_iv2_epsilon",
]

"""The analyzer's privacy report of one crowd (DESIGN.md, Results; Table X of
esa-privacy-revisited)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from privacy.accounting.core import (
    LOCAL,
    CentralGuarantee,
    check_delta,
    check_epsilon,
    to_plain,
)
from privacy.accounting.fragments import LocalGuarantee, report_fragment_local_guarantee
from privacy.accounting.solvers import (
    BINARY_RR,
    GENERIC,
    ONE_HOT_RAPPOR,
    REMOVAL,
    _smallest_candidate,
    amplify,
    check_respondents,
)
from privacy.randomizers import (
    BinaryRandomizedResponse,
    OneHotRappor,
    ReportFragmented,
    SymmetricOneHot,
)

__all__ = ["PrivacyReport", "privacy_report", "randomizer_central"]


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivacyReport:
    """What the analyzer states about one crowd (DESIGN.md, Results).

    ``local``: eps_l_inf and eps_l1 (Theorem IV.1 with t = tau and t = 1; both eps_l without
    report fragmentation). ``central``: eps_c of the attribute-fragmented reports (tightest valid
    bound for the backstop eps_l, see :func:`amplify`: report fragments are a post-processing of
    the shuffled backstop reports). ``central_without_attribute_
    fragmentation``: Table X's comparison, the minimum of the local guarantee and a generic
    amplification bound for the whole report (removal eps_l, so eps_0 = 2 eps_l). Table X used
    Balle et al.'s bound; the FMT numerical bound used here is tighter.
    """

    local: LocalGuarantee
    central: CentralGuarantee
    central_without_attribute_fragmentation: CentralGuarantee

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon_local": self.local.epsilon_backstop,
            "epsilon_local_all": self.local.epsilon_all,
            "epsilon_local_one": self.local.epsilon_one,
            "epsilon_fragment": self.local.epsilon_fragment,
            "fragments": self.local.fragments,
            "epsilon_central": self.central.epsilon,
            "delta": self.central.delta,
            "bound": self.central.bound,
            "respondents": self.central.respondents,
            "central": self.central.to_dict(),
            "central_without_attribute_fragmentation": (
                self.central_without_attribute_fragmentation.to_dict()
            ),
        }


def privacy_report(
    epsilon_local: float,
    respondents: int,
    delta: float,
    *,
    fragments: int = 1,
    epsilon_fragment: float | None = None,
) -> PrivacyReport:
    """The privacy report of one crowd of n respondents using attribute-fragmented one-hot
    randomized response with backstop eps_l and, optionally, tau report fragments of eps_f each
    (the paper's equal-variance eps_f when not given)."""
    eps_b = check_epsilon(epsilon_local, "epsilon_local")
    n = check_respondents(respondents)
    d = check_delta(delta)
    local = report_fragment_local_guarantee(eps_b, fragments, epsilon_fragment)

    # Report fragments are a post-processing of the shuffled backstop reports (proof of Theorem
    # IV.2), so the backstop's guarantee holds for them; Theorem IV.2's own backstop term is
    # Theorem III.1's simplified form, already among the candidates.
    central = _with_local_candidate(amplify(eps_b, n, d, ONE_HOT_RAPPOR), local.epsilon_all)
    without = _with_local_candidate(
        amplify(eps_b, n, d, GENERIC, local_model=REMOVAL), local.epsilon_all
    )
    return PrivacyReport(
        local=local, central=central, central_without_attribute_fragmentation=without
    )


def _with_local_candidate(base: CentralGuarantee, epsilon_local_all: float) -> CentralGuarantee:
    """``base`` (an :func:`amplify` result) with eps_l_inf of the report fragments as the local
    candidate instead of the backstop's eps_l."""
    candidates = dict(base.details["candidates"])
    candidates[LOCAL] = epsilon_local_all
    best = _smallest_candidate(candidates)
    details = dict(to_plain(base.details))
    details["candidates"] = candidates
    details["epsilon_local_all"] = epsilon_local_all
    return CentralGuarantee(
        epsilon=float(candidates[best]),
        delta=base.delta,
        bound=best,
        epsilon_local=base.epsilon_local,
        respondents=base.respondents,
        details=details,
    )


def randomizer_central(
    randomizer: Any, respondents: int, delta: float, epsilon_local: float | None = None
) -> tuple[CentralGuarantee, CentralGuarantee | None]:
    """The central guarantee of ``respondents`` shuffled reports of ``randomizer`` by the
    tightest valid bound for what it sends, and Table X's comparison without attribute
    fragmentation where that applies (else None). One definition for the analyzer's privacy
    report and the devices' Check 3 (samplable-anonymous-aggregation §4.3), so a device never
    admits a query whose stated ε_c is larger than the one it charged for.

    * attribute-fragmented one-hot randomizers (k-RAPPOR, symmetric one-hot) and report
      fragmentation: :func:`privacy_report` (Theorem III.1 among the candidates; report fragments
      the backstop's guarantee, Theorem IV.2);
    * binary randomized response: Lemma II.6 (``amplify(..., "binary_rr")``);
    * anything else: the numerical shuffle bound for the whole report in the randomizer's own
      neighbouring model (``local_model``: removal-model randomizers count twice).

    ``epsilon_local``: the ε_ℓ a device is asked to report at (interactive rounds ask per
    round); default the randomizer's own. ValueError where no bound is valid (``amplify``)."""
    if isinstance(randomizer, ReportFragmented):
        report = privacy_report(
            randomizer.backstop_epsilon,
            respondents,
            delta,
            fragments=randomizer.fragments,
            epsilon_fragment=randomizer.fragment_epsilon,
        )
        return report.central, report.central_without_attribute_fragmentation
    if isinstance(randomizer, OneHotRappor | SymmetricOneHot):
        epsilon = randomizer.epsilon if epsilon_local is None else epsilon_local
        report = privacy_report(epsilon, respondents, delta)
        return report.central, report.central_without_attribute_fragmentation
    epsilon = float(randomizer.epsilon_local if epsilon_local is None else epsilon_local)
    if isinstance(randomizer, BinaryRandomizedResponse):
        return amplify(epsilon, respondents, delta, BINARY_RR), None
    return amplify(epsilon, respondents, delta, GENERIC, local_model=randomizer.ldp_kind), None

"""Central privacy of LDP-SGD over T epochs (esa-privacy-revisited, Theorem VI.1).

The proof of Theorem VI.1 (Appendix D) has two steps, and so does this module:

1. per epoch, amplification by shuffling of n eps_le-LDP reports (the paper cites Erlingsson et
   al.'s Corollary 5.3.1; we use :func:`privacy.accounting.amplify` for a generic replacement
   randomizer, whose tightest valid bound is Feldman-McMillan-Talwar's, numerical or closed form,
   at a per-epoch delta_e);
2. composition over the T epochs (each epoch is its own shuffler run): the tighter of basic and
   advanced composition (Theorem II.7), with slack delta', and the composition of the epochs'
   privacy curves (the tight variation-ratio bound's, at every eps) through privacy-loss
   distributions (:func:`privacy.accounting.pld.compose_prefixes`, dp-accounting), which needs
   no split of delta and is much tighter over many epochs.

For basic and advanced composition the total delta is split as delta' = delta/2 and
delta_e = delta/(2T), so delta' + T delta_e = delta; ``epoch`` is the per-epoch guarantee at
delta_e. Theorem VI.1 itself is an O(.) statement, eps_c = O((e^eps_le - 1)/sqrt(n)
sqrt(T log^2(T/delta))) for eps_le <= log(n)/4; its expression without the constant is reported
as ``theorem_vi1_order`` for comparison, never as a guarantee.

A device that sends tau reports per epoch (Section VII-C's "report fragmenting" simulates larger
batches that way) is tau eps_le-LDP per epoch by basic composition on the device, and that is
what is amplified here: shuffling single messages is a post-processing of shuffling each device's
tau-tuple, so the bound for n devices holds. (The paper instead counts tau n reports at eps_le,
which treats each copy as a different person.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from privacy.accounting.composition import compose_repeated
from privacy.accounting.core import (
    BoundOutOfRange,
    CentralGuarantee,
    check_count,
    check_delta,
    check_epsilon,
)
from privacy.accounting.pld import PLD_COMPOSITION, compose_prefixes, tight_curve
from privacy.accounting.solvers import GENERIC, REPLACEMENT, amplify

__all__ = ["LdpSgdGuarantee", "ldp_sgd_guarantee", "theorem_vi1_order"]


def theorem_vi1_order(epsilon_epoch: float, respondents: int, epochs: int, delta: float) -> float:
    """(e^eps - 1)/sqrt(n) * sqrt(T log^2(T/delta)): Theorem VI.1's eps_c without its O-constant."""
    eps = check_epsilon(epsilon_epoch, "epsilon_epoch")
    n = check_count(respondents, "respondents")
    t = check_count(epochs, "epochs")
    d = check_delta(delta)
    return math.expm1(eps) / math.sqrt(n) * math.sqrt(t) * math.log(t / d)


@dataclass(frozen=True)
class LdpSgdGuarantee:
    """The privacy report of one LDP-SGD training: per epoch and over all epochs."""

    epsilon_local_epoch: float
    reports_per_device: int
    respondents: int
    epochs: int
    delta: float
    epoch: CentralGuarantee
    epsilon_central: float
    composition_bound: str
    epsilon_central_so_far: tuple[float, ...]

    @property
    def epsilon_local_device(self) -> float:
        """The device's local eps per epoch: tau eps_le (basic composition of its reports)."""
        return self.reports_per_device * self.epsilon_local_epoch

    @property
    def theorem_vi1_condition(self) -> bool:
        """Theorem VI.1's condition eps_le <= log(n)/4 (our bound does not need it)."""
        return self.epsilon_local_device <= math.log(self.respondents) / 4.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon_local_epoch": self.epsilon_local_epoch,
            "reports_per_device": self.reports_per_device,
            "epsilon_local_device_epoch": self.epsilon_local_device,
            "respondents": self.respondents,
            "epochs": self.epochs,
            "delta": self.delta,
            "epsilon_central_epoch": self.epoch.epsilon,
            "delta_epoch": self.epoch.delta,
            "epoch_bound": self.epoch.bound,
            "epsilon_central": self.epsilon_central,
            "composition_bound": self.composition_bound,
            "epsilon_central_so_far": list(self.epsilon_central_so_far),
            "theorem_vi1_order": theorem_vi1_order(
                self.epsilon_local_device, self.respondents, self.epochs, self.delta
            ),
            "theorem_vi1_condition_eps_le_log_n_over_4": self.theorem_vi1_condition,
        }


def ldp_sgd_guarantee(
    epsilon_epoch: float,
    respondents: int,
    epochs: int,
    delta: float,
    reports_per_device: int = 1,
) -> LdpSgdGuarantee:
    """(eps_c, delta) of T epochs of LDP-SGD, each epoch shuffling the reports of at least
    ``respondents`` devices (the smallest crowd any one shuffler released), see module doc."""
    eps = check_epsilon(epsilon_epoch, "epsilon_epoch")
    n = check_count(respondents, "respondents")
    t = check_count(epochs, "epochs")
    d = check_delta(delta)
    tau = check_count(reports_per_device, "reports_per_device")
    per_epoch = amplify(tau * eps, n, d / (2.0 * t), GENERIC, local_model=REPLACEMENT)
    try:
        curve = tight_curve("ldp_sgd", tau * eps, n, d / (10.0 * t))
        by_pld = compose_prefixes(curve, t, d)
    except (BoundOutOfRange, ValueError, ArithmeticError):
        by_pld = [math.inf] * t
    so_far = []
    bound = ""
    for k in range(1, t + 1):
        loss = compose_repeated(per_epoch.epsilon, per_epoch.delta, k, d / 2.0)
        if by_pld[k - 1] < loss.epsilon:
            so_far.append(by_pld[k - 1])
            bound = PLD_COMPOSITION
        else:
            so_far.append(loss.epsilon)
            bound = loss.bound
    return LdpSgdGuarantee(
        epsilon_local_epoch=eps,
        reports_per_device=tau,
        respondents=n,
        epochs=t,
        delta=d,
        epoch=per_epoch,
        epsilon_central=so_far[-1],
        composition_bound=bound,
        epsilon_central_so_far=tuple(so_far),
    )

"""LDP-SGD (esa-privacy-revisited, Section VI): the client randomizer and the server's step.

Client, Algorithm 4 (after Duchi, Jordan and Wainwright's l2-ball randomizer): clip the gradient
x to l2 norm L; pick z = +L x/|x| with probability 1/2 + |x|/(2L), else -L x/|x|; sample v
uniformly on the unit sphere S^{d-1}; report sgn(<z, v>) v with probability e^eps/(1+e^eps), else
-sgn(<z, v>) v.

Communication (Section VI, "Reducing communication cost using PRGs"): v depends on no data, so a
device sends a 128-bit seed s and one sign; v = Samp(PRG(s)). Here PRG is SHAKE-128 (a
cryptographic extendable-output function, FIPS 202) over a domain-separation prefix and s, and
Samp turns its output into d standard normals (Box-Muller on 32-bit uniforms) normalized to unit
length. Devices draw s and the coins from a ``numpy.random.Generator`` like every randomizer of
the project: seeded from the operating system's CSPRNG in production
(``privacy.rng.secure_generator``), with a fixed seed in tests.

Privacy: given s (independent of the data), the sign is +sgn(<x, v>) with probability
1/2 + (|x|/(2L)) tanh(eps/2) (:func:`sign_probability`), which lies in
[1/(1+e^eps), e^eps/(1+e^eps)] for every |x| <= L: the report (s, sign) is replacement eps-LDP,
exactly (attained at |x| = L).

Server, Algorithm 5: g_t = scale * mean_i(sign_i v_i), theta_{t+1} = Pi_C(theta_t - eta_t g_t).
Algorithm 5 prints scale = (L sqrt(pi)/2) Gamma((d-1)/2 + 1)/Gamma(d/2 + 1) (e^eps+1)/(e^eps-1);
an unbiased g_t needs d times that (Duchi et al.'s B: E|v_1| = Gamma(d/2)/(sqrt(pi)
Gamma((d+1)/2)) on S^{d-1}), which is what :func:`unbiased_scale` returns; the printed constant is
:func:`paper_scale` (its shortfall only rescales the learning rate). The learning rate is the
one the proof of Theorem VI.1 instantiates from Theorem .4: eta_t = c/sqrt(t), c = |C|_2 / G with
G = scale / sqrt(n) the root mean square norm of g_t's noise (:func:`learning_rate`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = [
    "SEED_BYTES",
    "PRG_DOMAIN",
    "LdpSgdRandomizer",
    "RandomizedGradients",
    "clip_gradients",
    "directions_from_seeds",
    "sign_probability",
    "paper_scale",
    "unbiased_scale",
    "learning_rate",
    "project_to_ball",
    "server_step",
]

SEED_BYTES = 16  # 128-bit seeds, as in Section VI
PRG_DOMAIN = b"esa/ldp-sgd/direction/v1\x00"
_UNIFORM_SCALE = 2.0**-53


def _check_positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


def clip_gradients(gradients: np.ndarray, clip_norm: float) -> np.ndarray:
    """Algorithm 4, step 1: each row scaled by min(1, L / |row|_2)."""
    clip = _check_positive(clip_norm, "clip_norm")
    rows = np.atleast_2d(np.asarray(gradients, dtype=np.float64))
    norms = np.linalg.norm(rows, axis=1)
    factors = np.minimum(1.0, clip / np.maximum(norms, np.finfo(np.float64).tiny))
    return rows * factors[:, None]


def directions_from_seeds(seeds: np.ndarray, dimension: int) -> np.ndarray:
    """Samp(PRG(s)) for every 16-byte seed row: an (n, d) array of unit vectors, uniform on
    S^{d-1} when PRG's output is uniform.

    SHAKE-128 of ``PRG_DOMAIN || d || s`` gives 4 bytes per coordinate (d rounded up to even);
    each 32-bit word makes a uniform in (0, 1); Box-Muller pairs make normals; each row is
    normalized (float32). One hash call per seed (C speed); everything else is vectorized.
    """
    rows = np.ascontiguousarray(np.asarray(seeds, dtype=np.uint8))
    if rows.ndim != 2 or rows.shape[1] != SEED_BYTES:
        raise ValueError(f"seeds must be an (n, {SEED_BYTES}) uint8 array, got shape {rows.shape}")
    if not isinstance(dimension, int) or dimension < 1:
        raise ValueError(f"dimension must be a positive integer, got {dimension!r}")
    n = rows.shape[0]
    even = dimension + (dimension & 1)
    prefix = PRG_DOMAIN + dimension.to_bytes(4, "big")
    raw, width = rows.tobytes(), 4 * even
    blob = b"".join(
        hashlib.shake_128(prefix + raw[k : k + SEED_BYTES]).digest(width)
        for k in range(0, len(raw), SEED_BYTES)
    )
    words = np.frombuffer(blob, dtype="<u4").reshape(n, even)
    # Directions affect utility only (privacy comes from the sign), so single precision will do.
    uniforms = (words.astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-32)
    uniforms = np.minimum(uniforms, np.float32(1.0 - 2.0**-24))  # float32 rounding can reach 1
    radius = np.sqrt(np.float32(-2.0) * np.log(uniforms[:, 0::2]))
    angle = np.float32(2.0 * math.pi) * uniforms[:, 1::2]
    normals = np.empty((n, even), dtype=np.float32)
    normals[:, 0::2] = radius * np.cos(angle)
    normals[:, 1::2] = radius * np.sin(angle)
    normals = normals[:, :dimension]
    return normals / np.linalg.norm(normals, axis=1, keepdims=True)


def sign_probability(
    clipped: np.ndarray, directions: np.ndarray, epsilon: float, clip_norm: float
) -> np.ndarray:
    """P(reported sign = +1 | x, v) of Algorithm 4 with both coins combined (rows paired).

    With q = 1/2 + |x|/(2L) and p = e^eps/(1+e^eps), the sign equals sgn(<x, v>) with probability
    q p + (1-q)(1-p) = 1/2 + (|x|/(2L)) tanh(eps/2); for x = 0 (or <x, v> = 0) it is 1/2.
    """
    x = np.atleast_2d(np.asarray(clipped, dtype=np.float64))
    v = np.atleast_2d(np.asarray(directions, dtype=np.float64))
    clip = _check_positive(clip_norm, "clip_norm")
    eps = _check_positive(epsilon, "epsilon")
    norms = np.minimum(np.linalg.norm(x, axis=1) / clip, 1.0)
    aligned = np.sign(np.einsum("ij,ij->i", x, v))
    return 0.5 + 0.5 * aligned * norms * math.tanh(eps / 2.0)


def _log_gamma_ratio(dimension: int) -> float:
    """log(Gamma((d+1)/2) / Gamma(d/2))."""
    return float(special.gammaln((dimension + 1) / 2.0) - special.gammaln(dimension / 2.0))


def paper_scale(epsilon: float, clip_norm: float, dimension: int) -> float:
    """Algorithm 5, step 5, as printed: (L sqrt(pi)/2) Gamma((d-1)/2+1)/Gamma(d/2+1)
    (e^eps+1)/(e^eps-1). It is 1/d of :func:`unbiased_scale`."""
    return unbiased_scale(epsilon, clip_norm, dimension) / dimension


def unbiased_scale(epsilon: float, clip_norm: float, dimension: int) -> float:
    """Duchi et al.'s B = L sqrt(pi) Gamma((d+1)/2)/Gamma(d/2) (e^eps+1)/(e^eps-1): with it,
    E[B sign v] = x for every clipped x (1/E|v_1| undoes the projection on a uniform direction,
    the last factor undoes the flip). Also the exact norm of every scaled report."""
    eps = _check_positive(epsilon, "epsilon")
    clip = _check_positive(clip_norm, "clip_norm")
    if not isinstance(dimension, int) or dimension < 1:
        raise ValueError(f"dimension must be a positive integer, got {dimension!r}")
    return clip * math.sqrt(math.pi) * math.exp(_log_gamma_ratio(dimension)) / math.tanh(eps / 2.0)


@dataclass(frozen=True)
class RandomizedGradients:
    """What devices send: one 16-byte seed row and one sign (+1/-1) per report."""

    seeds: np.ndarray  # (n, 16) uint8
    signs: np.ndarray  # (n,) int8

    def __len__(self) -> int:
        return int(self.signs.shape[0])


@dataclass(frozen=True)
class LdpSgdRandomizer:
    """Algorithm 4 with the PRG-seed encoding: (clipped gradient) -> (seed, sign), eps-LDP."""

    epsilon: float
    clip_norm: float
    dimension: int

    def __post_init__(self) -> None:
        _check_positive(self.epsilon, "epsilon")
        _check_positive(self.clip_norm, "clip_norm")
        if not isinstance(self.dimension, int) or self.dimension < 1:
            raise ValueError(f"dimension must be a positive integer, got {self.dimension!r}")

    @property
    def epsilon_local(self) -> float:
        """Replacement eps of one report (exact: :func:`sign_probability`)."""
        return float(self.epsilon)

    @property
    def scale(self) -> float:
        return unbiased_scale(self.epsilon, self.clip_norm, self.dimension)

    def randomize(self, gradients: np.ndarray, source: np.random.Generator) -> RandomizedGradients:
        """Algorithm 4 for each row of ``gradients`` (clipped here), with the seed encoding."""
        x = clip_gradients(gradients, self.clip_norm)
        if x.shape[1] != self.dimension:
            raise ValueError(f"gradients must have {self.dimension} columns, got {x.shape[1]}")
        n = x.shape[0]
        seeds = np.frombuffer(source.bytes(SEED_BYTES * n), dtype=np.uint8).reshape(n, SEED_BYTES)
        directions = directions_from_seeds(seeds, self.dimension)
        norms = np.linalg.norm(x, axis=1)
        # Step 2: z = +-L x/|x|; only sgn(<z, v>) is ever used, so keep the sign of z.
        z_sign = np.where(source.random(n) < 0.5 + norms / (2.0 * self.clip_norm), 1, -1)
        aligned = np.sign(np.einsum("ij,ij->i", x, directions))
        aligned[aligned == 0] = 1  # x = 0: z's coin alone makes the sign uniform
        # Step 4: keep sgn(<z, v>) with probability e^eps / (1 + e^eps).
        keep = source.random(n) < special.expit(self.epsilon)
        signs = (z_sign * aligned * np.where(keep, 1, -1)).astype(np.int8)
        return RandomizedGradients(seeds=seeds.copy(), signs=signs)

    def decode_sum(self, seeds: np.ndarray, signs: np.ndarray, chunk: int = 4096) -> np.ndarray:
        """sum_i sign_i v_i, regenerating the directions from the seeds ``chunk`` rows at a time
        (memory ~ chunk * d doubles, whatever the number of reports)."""
        total = np.zeros(self.dimension, dtype=np.float64)
        signs = np.asarray(signs, dtype=np.float64)
        for begin in range(0, signs.shape[0], chunk):
            block = directions_from_seeds(seeds[begin : begin + chunk], self.dimension)
            total += signs[begin : begin + chunk] @ block
        return total


def learning_rate(
    step: int, diameter: float, reports: int, epsilon: float, clip_norm: float, dimension: int
) -> float:
    """eta_t = c / sqrt(t), c = |C|_2 / G, G = B / sqrt(n) (proof of Theorem VI.1 with Theorem .4;
    B = :func:`unbiased_scale`). Up to sqrt(pi/2) this is Algorithm 5's
    |C|_2 sqrt(n) / (L sqrt(d)) (e^eps-1)/(e^eps+1), decayed by 1/sqrt(t) as Theorem .4 needs."""
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be an integer >= 1, got {step!r}")
    if not isinstance(reports, int) or reports < 1:
        raise ValueError(f"reports must be an integer >= 1, got {reports!r}")
    size = _check_positive(diameter, "diameter")
    noise = unbiased_scale(epsilon, clip_norm, dimension) / math.sqrt(reports)
    return size / noise / math.sqrt(step)


def project_to_ball(theta: np.ndarray, radius: float) -> np.ndarray:
    """Pi_C for C the l2 ball of ``radius`` around 0 (diameter |C|_2 = 2 radius)."""
    limit = _check_positive(radius, "radius")
    norm = float(np.linalg.norm(theta))
    return theta if norm <= limit else theta * (limit / norm)


def server_step(
    theta: np.ndarray,
    direction_sum: np.ndarray,
    reports: int,
    step: int,
    randomizer: LdpSgdRandomizer,
    radius: float,
    rate_scale: float = 1.0,
) -> tuple[np.ndarray, float, float]:
    """Algorithm 5, steps 5-6 for epoch ``step`` (1-based): returns (theta_next, eta_t, |g_t|).

    ``rate_scale`` k multiplies eta_t (k c/sqrt(t)): Theorem .4's c minimizes a worst-case bound,
    and a smaller constant trades its guarantee for less noise per step; any k is
    post-processing of the released reports, so the privacy is the same."""
    if not isinstance(reports, int) or reports < 1:
        raise ValueError(f"reports must be an integer >= 1, got {reports!r}")
    scale = _check_positive(rate_scale, "rate_scale")
    gradient = randomizer.scale * np.asarray(direction_sum, dtype=np.float64) / reports
    eta = scale * learning_rate(
        step, 2.0 * radius, reports, randomizer.epsilon, randomizer.clip_norm, randomizer.dimension
    )
    return project_to_ball(theta - eta * gradient, radius), eta, float(np.linalg.norm(gradient))

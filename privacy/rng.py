"""Where randomness comes from.

Production paths draw a generator seeded from the operating system's CSPRNG; tests pass a seeded
one. Randomness is always injected as an argument, never taken from a global (RAPPOR's habit).
"""

from __future__ import annotations

import secrets

import numpy as np


def secure_generator() -> np.random.Generator:
    """A numpy Generator seeded with 256 bits from the OS CSPRNG (for randomizers and simulation).

    Decisions that release data (randomized deletion) do not use this; they use
    ``privacy.noise`` samplers that draw integers straight from the OS CSPRNG.
    """
    return np.random.Generator(np.random.PCG64DXSM(secrets.randbits(256)))


def seeded_generator(seed: int | None) -> np.random.Generator:
    """A reproducible generator for tests and simulations; ``None`` means a secure one."""
    if seed is None:
        return secure_generator()
    return np.random.Generator(np.random.PCG64DXSM(seed))

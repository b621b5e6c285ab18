"""Tolerances and exact distributions shared by the randomizer tests.

Randomized tests use fixed seeds; each check sits at 4.5 standard deviations (two-sided normal
tail ~6.8e-6) or at a p-value of 1e-6, so a correct implementation fails a given test with
probability below ~1e-4 for a fresh seed.
"""

from __future__ import annotations

import itertools

import numpy as np

from privacy.randomizers import LongitudinalClient

Z = 4.5  # two-sided normal tail ~6.8e-6 per check
P_VALUE = 1e-6


def longitudinal_output_log_probabilities(client: LongitudinalClient, changes: np.ndarray):
    """Exact log P(h*, u_1..u_H) of Algorithm 1 for one change vector, outputs in a fixed order."""
    d, k, levels, keep = client.periods, client.max_changes, client.levels, client.node_keep
    change_times = np.flatnonzero(changes)
    logs = []
    for level in range(1, levels + 1):
        nodes = d >> (level - 1)
        patterns = np.array(list(itertools.product([-1, 1], repeat=nodes)))
        probability = np.zeros(patterns.shape[0])
        for chosen in range(k):
            held = np.zeros(nodes, dtype=int)
            if chosen < change_times.size:
                time = change_times[chosen]
                held[time >> (level - 1)] = changes[time]
            node_probability = np.where(held == 0, 0.5, np.where(patterns == held, keep, 1 - keep))
            probability += np.prod(node_probability, axis=1) / k
        logs.append(np.log(probability / levels))
    return np.concatenate(logs)

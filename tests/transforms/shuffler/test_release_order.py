"""A crowd's release order is uniform when its messages are scattered by several shards and its
groups permuted apart (the argument: transforms/shuffler/release.py's docstring).

The steps are the shuffler's own, in its order: each shard draws uniform slots
(``decide.assign_groups``, as ``DeleteAndScatter``) and keeps its rows per slot in slot order;
the bucket's slots merge into groups (``decide.complete_groups``, as ``CompleteBucket``, pieces
sorted by slot); each group is ordered by ``crowd_release_order`` (as ``PermuteGroup``). Crowd A
(4 messages over two shards) shares its bucket with crowd B (3 messages) and is written over two
groups. Each chi-square check rejects at p < 1e-5; three checks on a fixed seed: a correct
shuffler fails with probability < 3e-5 over seeds."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
from scipy import stats

from privacy.noise import seeded_random_source
from transforms.shuffler import decide
from transforms.shuffler.release import crowd_release_order

P_FAIL = 1e-5
# (crowd, message) rows of each shard: crowd 0 is A (messages 0-3), crowd 1 is B.
SHARDS = [[(0, 0), (0, 1), (1, 0)], [(0, 2), (1, 1), (0, 3), (1, 2)]]
RELEASED = 7
MESSAGES_PER_FILE = 4  # 7 released at 4 per file: 2 groups
SLOT_BITS = decide.split_bits(RELEASED, 2)  # 4 slots, as Decide would draw for 2 per file
DRAWS = 30_000


def _release(source) -> dict[int, list[tuple[int, int]]]:
    """The groups' rows of one run (by group), each group in its release order."""
    slotted = []  # (slot, shard, rows of that slot in that shard)
    for shard, rows in enumerate(SHARDS):
        slots = decide.assign_groups(len(rows), 1 << SLOT_BITS, source)
        order = np.argsort(slots, kind="stable")
        for slot in np.unique(slots).tolist():
            slotted.append((slot, shard, [rows[i] for i in order if slots[i] == slot]))
    slotted.sort(key=lambda item: item[:2])
    groups = decide.complete_groups(
        [slot for slot, _, _ in slotted], SLOT_BITS, RELEASED, MESSAGES_PER_FILE
    )
    released = {}
    for group, indices in groups.items():
        rows = [row for index in indices for row in slotted[index][2]]
        order = crowd_release_order(np.array([crowd for crowd, _ in rows]), source)
        released[group] = [rows[i] for i in order.tolist()]
    return released


def test_a_crowd_written_over_several_groups_is_in_uniform_order_given_its_group_sizes() -> None:
    source = seeded_random_source(23)
    permutations = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    table = np.zeros((5, len(permutations)), dtype=np.int64)  # crowd A's size in group 0 x order
    groups_seen = Counter()
    for _ in range(DRAWS):
        released = _release(source)
        assert set(released) <= {0, 1}
        groups_seen[len(released)] += 1
        for rows in released.values():  # every group holds its crowds in order: A's, then B's
            crowds = [crowd for crowd, _ in rows]
            assert crowds == sorted(crowds)
        in_a = {
            g: [message for crowd, message in rows if crowd == 0] for g, rows in released.items()
        }
        order = tuple(message for group in sorted(in_a) for message in in_a[group])
        table[len(in_a.get(0, [])), permutations[order]] += 1
    assert groups_seen[2] > 0.95 * DRAWS  # written over 2 groups
    # Every order of A equally likely...
    assert stats.chisquare(table.sum(axis=0)).pvalue > P_FAIL
    # ...whatever A's group sizes (order independent of the sizes)...
    assert stats.chi2_contingency(table[table.sum(axis=1) > 0]).pvalue > P_FAIL
    # ...and the sizes binomial: each message's group uniform and independent.
    expected = stats.binom.pmf(np.arange(5), 4, 0.5) * DRAWS
    assert stats.chisquare(table.sum(axis=1), expected).pvalue > P_FAIL

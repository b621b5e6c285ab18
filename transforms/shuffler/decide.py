"""Release decisions of the ESA shuffler as pure functions with an injected random source.

Every choice that shapes what a shuffler releases is made here, on integers and numpy arrays, from
a :class:`privacy.noise.RandomSource` passed in by the caller: the operating system's CSPRNG in
production (``privacy.noise.os_random_source``), a seeded source in tests. The Beam DoFns in
``transforms/shuffler/shuffle.py`` only read rows and call these functions. Decisions:

* per-origin screening of a crowd's messages (:func:`screen_origin_messages`): one presence
  message per origin counts, extras are ``duplicate_presence``; data messages beyond the recipe's
  cap are ``over_origin_cap`` (:func:`max_messages_per_respondent`), so one device can push at
  most a bounded number of messages into a histogram and move a crowd's respondent count by one;
* threshold and randomized deletion (:func:`decide_crowd`): Algorithm 3 of
  esa-privacy-revisited (Section V) on distinct respondents, discrete Laplace noise of scale
  2/eps_cr sampled exactly (``privacy.noise``, Canonne-Kamath-Steinke 2020), Theorem V.1;
* deletion scatter over origin shards (:func:`split_deletions`, multivariate hypergeometric) and
  inside a shard (:func:`kept_rows`): the deleted respondents are a uniform subset of the crowd;
* group completion (:func:`complete_groups`): uniform buckets merged into 2**g output groups, g
  from the released message count only;
* release permutation (:func:`release_order`): uniform, from fresh secure randomness only
  (Section II-C: origin, order and timing must be hidden).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from privacy import noise
from privacy.accounting import binomial
from privacy.noise import RandomSource

# Tail probability up to which an honest device's messages to one crowd stay within the cap.
CAP_TAIL_PROBABILITY = 1e-12

# Screening codes of a crowd's messages (one per row, :func:`screen_origin_messages`).
DATA = 0
PRESENCE = 1
DUPLICATE_PRESENCE = 2
OVER_ORIGIN_CAP = 3
DUPLICATE_PAYLOAD = 4  # a repeat of a sealed payload of the crowd (schemas/replays.py)
SCREEN_REASONS = {
    DUPLICATE_PRESENCE: "duplicate_presence",
    OVER_ORIGIN_CAP: "over_origin_cap",
    DUPLICATE_PAYLOAD: "duplicate_payload",
}


class DeletionLike(Protocol):
    """What :func:`decide_crowd` needs of ``shuffle_params.DeletionParameters``."""

    @property
    def scale(self) -> Any: ...

    @property
    def offset(self) -> int: ...


# ---------------------------------------------------------------------------------------------
# Per-origin caps (presence messages and data messages)
# ---------------------------------------------------------------------------------------------


def _two_binomial_quantile(n1: int, p1: float, n2: int, p2: float, tail: float) -> int:
    """Smallest m with P(X1 + X2 > m) <= tail, X1 ~ Bin(n1, p1), X2 ~ Bin(n2, p2) independent.

    Computed as sum_x P(X1 = x) P(X2 > m - x) with the binomial pmf and survival function
    (``privacy.accounting.binomial``: scipy's, bit for bit, without importing ``scipy.stats``;
    accurate in the far tail, unlike 1 - cdf); m by bisection, the tail being monotone in m.
    """
    n1, n2 = int(n1), int(n2)
    p1, p2 = min(max(float(p1), 0.0), 1.0), min(max(float(p2), 0.0), 1.0)
    x = np.arange(n1 + 1)
    weights = binomial.pmf(x, n1, p1)

    def tail_above(m: int) -> float:
        return float(np.sum(weights * binomial.sf(m - x, n2, p2)))

    low, high = 0, n1 + n2
    while low < high:
        middle = (low + high) // 2
        if tail_above(middle) <= tail:
            high = middle
        else:
            low = middle + 1
    return low


def reports_per_crowd(shuffler_window_ms: int | None, recipe_window_ms: int) -> int:
    """How many of its reports one device can send into one crowd window: the number of recipe
    windows (one report each) that a shuffler window overlaps (aligned when one divides the
    other, at most two more when they do not)."""
    if shuffler_window_ms is None or shuffler_window_ms <= recipe_window_ms:
        aligned = shuffler_window_ms is None or recipe_window_ms % shuffler_window_ms == 0
        return 1 if aligned else 2
    whole, rest = divmod(int(shuffler_window_ms), int(recipe_window_ms))
    return whole if rest == 0 else whole + 2


def max_messages_per_respondent(
    randomizer: Any,
    weight: float,
    reports: int = 1,
    chaff: int = 0,
    tail: float = CAP_TAIL_PROBABILITY,
) -> int:
    """The most data messages an honest respondent sends to one crowd of one shuffler instance,
    up to probability ``tail`` (1e-12): the cap on one origin's data messages per crowd.

    Each message goes to instance u with probability ``weight`` = pi_u, independently (the
    recipe's routing weights), and a device sends ``reports`` reports into one crowd. With
    thinning, the count of messages reaching u is a sum of two binomials, whose exact tail is
    computed by :func:`_two_binomial_quantile`:

    * one-hot families (k-RAPPOR Algorithm 1 of esa-privacy-revisited, symmetric and asymmetric
      one-hot of samplable-anonymous-aggregation): own bit Bin(r, p_one pi) plus the other d - 1
      bits Bin(r (d - 1), p_zero pi); count-mean sketch likewise over the ``width`` bits of a row;
    * binary randomized response: at most one message per report, Bin(r, max(p_one, p_zero) pi);
    * zero-sum histogram (shuffled-model-histograms, Figure 2): 1 + Bin(d, p) copies per report,
      thinned: Bin(r, pi) + Bin(r d, p pi);
    * longitudinal tree client (amplification-by-shuffling, Algorithm 1): at most one message per
      period, Bin(r, pi);
    * report fragmentation (Algorithm 2 of esa-privacy-revisited): tau fragments, each a
      re-randomized copy of a permanent backstop with B set bits. The count is stochastically
      increasing in B (fragment keep probability > 1/2), so with b* the (tail/2)-quantile of
      B ~ Bin(1, a) + Bin(d - 1, 1 - a), the cap is the (tail/2)-quantile of
      Bin(r tau b*, q pi) + Bin(r tau (d - b*), (1 - q) pi): total tail <= tail.

    ``chaff``: extra messages per report the recipe allows (``Recipe.chaff_allowance``: sealed
    cover messages a device sends per crowd and instance, ``simulators/sealing.py``).
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    if reports < 1 or chaff < 0 or not 0.0 < tail < 1.0:
        raise ValueError("need reports >= 1, chaff >= 0 and 0 < tail < 1")
    name = getattr(randomizer, "name", "")
    r = int(reports)
    if name in ("one_hot_rappor", "symmetric_one_hot", "asymmetric_one_hot"):
        d = int(randomizer.domain_size)
        cap = _two_binomial_quantile(
            r, randomizer.p_one * weight, r * (d - 1), randomizer.p_zero * weight, tail
        )
    elif name == "count_mean_sketch":
        w = int(randomizer.width)
        cap = _two_binomial_quantile(
            r, randomizer.p_one * weight, r * (w - 1), randomizer.p_zero * weight, tail
        )
    elif name == "binary_rr":
        p = max(randomizer.p_one, randomizer.p_zero) * weight
        cap = _two_binomial_quantile(r, p, 0, 0.0, tail)
    elif name == "zero_sum_histogram":
        d = int(randomizer.domain_size)
        cap = _two_binomial_quantile(r, weight, r * d, randomizer.p * weight, tail)
    elif name == "longitudinal":
        cap = _two_binomial_quantile(r, weight, 0, 0.0, tail)
    elif name == "report_fragmented":
        d, tau = int(randomizer.domain_size), int(randomizer.fragments)
        a, q = randomizer.backstop_keep, randomizer.fragment_keep
        bits = _two_binomial_quantile(1, a, d - 1, 1 - a, tail / 2)
        cap = _two_binomial_quantile(
            r * tau * bits, q * weight, r * tau * (d - bits), (1 - q) * weight, tail / 2
        )
    else:
        raise ValueError(f"no message cap is known for randomizer {name!r}")
    return int(cap) + r * int(chaff)


def recipe_origin_caps(recipe: Any, window_ms: int | None = None) -> tuple[int, ...]:
    """:func:`max_messages_per_respondent` for every shuffler instance of a recipe
    (``schemas.recipes.Recipe``), for crowds of a ``window_ms`` shuffler window, plus
    the recipe's chaff allowance (``Recipe.chaff_allowance``, sealed cover messages a device adds
    per crowd, recipe window and instance), so an honest device's chaff is never
    ``over_origin_cap``. A prio3 recipe's device sends one report per recipe window: its cap is
    the number of recipe windows in a crowd."""
    reports = reports_per_crowd(window_ms, int(recipe.window_seconds) * 1000)
    if getattr(recipe, "is_prio3", False):
        # Aggregate model: a device's whole randomized report is ONE message per recipe window
        # (simulators/prio3_devices.py), so a second report of one origin is never counted.
        return (reports,) * int(recipe.shuffler_instances)
    randomizer = recipe.build_randomizer()
    chaff = int(getattr(recipe, "chaff_allowance", 0) or 0)
    return tuple(
        max_messages_per_respondent(randomizer, float(weight), reports, chaff)
        for weight in recipe.instance_weights
    )


def screen_origin_messages(
    origin_hashes: np.ndarray, presence: np.ndarray, cap: int | None
) -> np.ndarray:
    """One screening code per message of a crowd (all messages of each origin must be given).

    ``PRESENCE`` for the first presence message (empty payload) of each origin and
    ``DUPLICATE_PRESENCE`` for the others; ``DATA`` for the first ``cap`` data messages of each
    origin and ``OVER_ORIGIN_CAP`` for the rest (SPEC: presence messages and per-origin caps).
    "First" is the order given, so the result is a deterministic function of the rows: a shard
    read twice is screened the same way.
    """
    hashes = np.asarray(origin_hashes, dtype=np.uint64)
    caps = np.full(hashes.size, -1 if cap is None else int(cap), dtype=np.int64)
    return screen_crowd_messages(np.zeros(hashes.size, np.int64), hashes, presence, caps)


class ScreenedMessages(NamedTuple):
    """:func:`screen_crowd_messages_and_origins`: a screening code per message, the distinct
    origins of each crowd and each message's origin code in its crowd (the rank of its origin
    hash among the crowd's distinct ones)."""

    codes: np.ndarray
    distinct: np.ndarray
    origins: np.ndarray


def screen_crowd_messages(
    crowds: np.ndarray, origin_hashes: np.ndarray, presence: np.ndarray, caps: np.ndarray
) -> np.ndarray:
    """:func:`screen_origin_messages` for the messages of many crowds at once: ``crowds`` gives
    each message's crowd (an integer code), ``caps`` its crowd's per-origin cap (-1: none). An
    origin is screened within each crowd separately (a cap is per origin and crowd)."""
    crowds = np.asarray(crowds, dtype=np.int64)
    count = int(crowds.max()) + 1 if crowds.size else 0
    return screen_crowd_messages_and_origins(crowds, origin_hashes, presence, caps, count).codes


def _by_crowd_origin_kind(
    crowds: np.ndarray, hashes: np.ndarray, presence: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(order, new_origin, new_run)``: the rows sorted by (crowd, origin hash, presence, row),
    and in that order where a (crowd, origin) and where a (crowd, origin, presence) begins.

    ``np.lexsort`` as three stable passes, least significant key first: the presence flags and
    crowd codes sorted by radix (small keys), the hashes by numpy's timsort, fast on a shard's
    rows, which come as runs sorted by hash (one per spill piece)."""
    rows = hashes.size
    order = np.argsort(presence.view(np.uint8), kind="stable") if presence.any() else None
    ordered = hashes if order is None else hashes[order]
    by_hash = np.argsort(ordered, kind="stable")
    order = by_hash if order is None else order[by_hash]
    if count > 1:
        order = order[stable_order(crowds[order], count)]
    sorted_hashes, sorted_crowds = hashes[order], crowds[order]
    new_origin = np.empty(rows, dtype=bool)
    new_origin[0] = True
    np.not_equal(sorted_hashes[1:], sorted_hashes[:-1], out=new_origin[1:])
    if count > 1:
        new_origin[1:] |= sorted_crowds[1:] != sorted_crowds[:-1]
    new_run = new_origin.copy()
    sorted_presence = presence[order]
    new_run[1:] |= sorted_presence[1:] != sorted_presence[:-1]
    return order, new_origin, new_run


def screen_crowd_messages_and_origins(
    crowds: np.ndarray,
    origin_hashes: np.ndarray,
    presence: np.ndarray,
    caps: np.ndarray,
    count: int,
) -> ScreenedMessages:
    """:func:`screen_crowd_messages` of messages of ``count`` crowds, with the distinct origins
    of each crowd and each message's origin code (what ``steps.origin_codes`` gives for the same
    rows), from one sort of the rows by (crowd, origin, kind, row)."""
    crowds = np.asarray(crowds, dtype=np.int64)
    hashes = np.asarray(origin_hashes, dtype=np.uint64)
    presence = np.asarray(presence, dtype=bool)
    caps = np.asarray(caps, dtype=np.int64)
    codes = np.where(presence, PRESENCE, DATA).astype(np.uint8)
    rows = hashes.size
    if rows == 0:
        return ScreenedMessages(codes, np.zeros(count, dtype=np.int64), np.zeros(0, np.int64))
    order, new_origin, new_run = _by_crowd_origin_kind(crowds, hashes, presence, count)
    # Rank of each message among its origin's messages of the same kind and crowd, in the given
    # order.
    positions = np.arange(rows)
    rank = np.empty(rows, dtype=np.int64)
    rank[order] = positions - np.maximum.accumulate(np.where(new_run, positions, 0))
    codes[presence & (rank >= 1)] = DUPLICATE_PRESENCE
    codes[~presence & (caps >= 0) & (rank >= caps)] = OVER_ORIGIN_CAP
    distinct, origins = number_origins(order, new_origin, crowds[order], count)
    return ScreenedMessages(codes, distinct, origins)


def number_origins(
    order: np.ndarray, new_origin: np.ndarray, sorted_crowds: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, origins)`` of rows sorted by (crowd, origin hash) (``order``; in that order,
    ``new_origin`` where a (crowd, origin) begins and ``sorted_crowds`` the crowd codes): the
    distinct origins of each of ``count`` crowds and each row's origin code in its crowd, the
    (crowd, origin) pairs numbered in sorted order less the crowd's first number."""
    distinct = np.bincount(sorted_crowds[new_origin], minlength=count).astype(np.int64)
    bases = np.zeros(count, dtype=np.int64)
    np.cumsum(distinct[:-1], out=bases[1:])
    origins = np.empty(order.size, dtype=np.int64)
    origins[order] = np.cumsum(new_origin) - 1 - bases[sorted_crowds]
    return distinct, origins


RELEASED = "RELEASED"
WITHHELD = "WITHHELD"
BELOW_THRESHOLD = "below_threshold"
DELETION_ABORTED = "deletion_aborted"
BELOW_THRESHOLD_AFTER_DELETION = "below_threshold_after_deletion"


def crowd_threshold(configured: int, recipe_minimum: int, message_minimums: int) -> int:
    """max(configured threshold, the recipe's minimum crowd, every message's minimum crowd)."""
    return max(int(configured), int(recipe_minimum), int(message_minimums), 1)


@dataclass(frozen=True)
class CrowdDecision:
    """What happens to one crowd: released with ``respondents_kept`` respondents, or withheld."""

    respondents: int
    threshold: int
    status: str
    withheld_reason: str | None
    respondents_kept: int

    @property
    def respondents_deleted(self) -> int:
        return self.respondents - self.respondents_kept if self.status == RELEASED else 0


def decide_crowd(
    respondents: int,
    threshold: int,
    deletion: DeletionLike | None,
    source: RandomSource,
) -> CrowdDecision:
    """Threshold and Algorithm 3 (esa-privacy-revisited, Section V) for one crowd of respondents.

    n = distinct respondents. Below the threshold nothing is drawn: withheld. Otherwise
    n_hat = max(n + Z - offset, 0) with Z discrete Laplace of scale 2/eps_cr (line 3); abort
    (withhold) when n_hat > n (line 7); keep n_hat respondents (line 5), and, as the paper applies
    the fixed threshold after dropping reports, withhold again when n_hat < threshold, so that no
    released crowd has fewer respondents than any of its devices demanded. Without deletion
    parameters every respondent of a crowd at or above the threshold is kept.
    """
    if respondents < 0 or threshold < 1:
        raise ValueError("respondents must be >= 0 and threshold >= 1")
    if respondents < threshold:
        return CrowdDecision(respondents, threshold, WITHHELD, BELOW_THRESHOLD, 0)
    if deletion is None:
        return CrowdDecision(respondents, threshold, RELEASED, None, respondents)
    z = int(noise.sample_discrete_laplace(deletion.scale, source))
    target = max(respondents + z - deletion.offset, 0)
    if target > respondents:
        return CrowdDecision(respondents, threshold, WITHHELD, DELETION_ABORTED, 0)
    if target < threshold:
        return CrowdDecision(respondents, threshold, WITHHELD, BELOW_THRESHOLD_AFTER_DELETION, 0)
    return CrowdDecision(respondents, threshold, RELEASED, None, target)


def released_respondents_pmf(
    respondents: int, threshold: int, deletion: DeletionLike
) -> tuple[np.ndarray, float]:
    """Exact distribution of :func:`decide_crowd`: ``(p, p_withheld)`` where ``p[k]`` is the
    probability of releasing exactly k respondents (k = 0..n) and ``p_withheld`` the rest."""
    n = int(respondents)
    probabilities = np.zeros(n + 1)
    if n < threshold:
        return probabilities, 1.0
    released = np.arange(max(threshold, 1), n + 1)
    # n_hat = k >= 1 happens exactly when Z = k - n + offset.
    probabilities[released] = noise.discrete_laplace_pmf(
        released - n + deletion.offset, deletion.scale
    )
    return probabilities, float(max(0.0, 1.0 - probabilities.sum()))


def uniform_subset(population: int, size: int, source: RandomSource) -> np.ndarray:
    """A uniformly random ``size``-subset of ``range(population)`` (sorted int64).

    The first ``size`` distinct values of an i.i.d. uniform sequence: their set is uniform over
    all subsets by symmetry, and the work is O(size), not O(population). Subsets larger than half
    the population are drawn as complements.
    """
    if population < 0 or not 0 <= size <= population:
        raise ValueError(f"need 0 <= size <= population, got size={size}, population={population}")
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    if 2 * size > population:
        keep = np.ones(population, dtype=bool)
        keep[uniform_subset(population, population - size, source)] = False
        return np.flatnonzero(keep).astype(np.int64)
    drawn = np.zeros(0, dtype=np.int64)
    while True:
        batch = noise.uniform_below(population, source, size=2 * size + 16)
        drawn = np.concatenate((drawn, batch))
        values, first = np.unique(drawn, return_index=True)
        if values.size >= size:
            chosen = drawn[np.sort(first)[:size]]
            return np.sort(chosen)


def split_deletions(
    shard_respondents: np.ndarray, deleted: int, source: RandomSource
) -> np.ndarray:
    """Multivariate hypergeometric split of ``deleted`` respondents over shards.

    Respondents are laid out shard after shard; a uniform ``deleted``-subset of all of them is
    counted per shard, so the split is exactly multivariate hypergeometric and, with a uniform
    choice inside each shard, the deleted set is a uniform subset of the whole crowd.
    """
    shard_respondents = np.asarray(shard_respondents, dtype=np.int64)
    if np.any(shard_respondents < 0):
        raise ValueError("shard_respondents must be >= 0")
    total = int(shard_respondents.sum())
    chosen = uniform_subset(total, int(deleted), source)
    boundaries = np.cumsum(shard_respondents)
    shard_of = np.searchsorted(boundaries, chosen, side="right")
    return np.bincount(shard_of, minlength=shard_respondents.size).astype(np.int64)


def kept_rows(
    origin_codes: np.ndarray, distinct: int, deleted: int, source: RandomSource
) -> np.ndarray:
    """Boolean mask of rows kept when ``deleted`` of the ``distinct`` origins (rows carry their
    origin's code in [0, distinct)) are chosen uniformly and all their messages dropped."""
    drop = np.zeros(distinct, dtype=bool)
    drop[noise.secure_sample_without_replacement(distinct, int(deleted), source)] = True
    return ~drop[np.asarray(origin_codes, dtype=np.int64)]


def group_of_bucket(buckets: np.ndarray, bucket_bits: int, group_bits: int) -> np.ndarray:
    """Merge 2**bucket_bits uniform buckets into 2**group_bits groups (contiguous ranges).

    A message in a uniform bucket of [2**bucket_bits] lands in a uniform group of [2**group_bits]
    (group_bits <= bucket_bits): the bucket count is fixed before the release size is known, the
    group count is chosen from the released number of messages only.
    """
    if not 0 <= group_bits <= bucket_bits:
        raise ValueError(f"need 0 <= group_bits <= bucket_bits, got {group_bits}, {bucket_bits}")
    return np.asarray(buckets, dtype=np.int64) >> (bucket_bits - group_bits)


def assign_groups(messages: int, groups: int, source: RandomSource) -> np.ndarray:
    """A fresh uniform group in [0, groups) for every message (secure, independent of all data).

    Uniform i.i.d. groups followed by a uniform permutation inside each group make the
    concatenation a uniform permutation of the crowd.
    """
    if groups == 1:
        return np.zeros(messages, dtype=np.int64)
    return noise.uniform_below(groups, source, size=messages)


def stable_order(values: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` of integers in ``[0, bound)``; as 16-bit keys where
    they fit, which numpy sorts by radix (several times faster than a 64-bit merge sort)."""
    if bound <= 1 << 16:
        return np.argsort(np.asarray(values).astype(np.uint16), kind="stable")
    return np.argsort(values, kind="stable")


def release_order(messages: int, source: RandomSource) -> np.ndarray:
    """A uniformly random order of ``messages`` messages from the secure source."""
    return noise.secure_permutation(messages, source)


def group_bits(bucket_bits: int, released_messages: int, messages_per_file: int) -> int:
    """log2 of the number of output groups of a crowd bucket (one file each): from its released
    message count only
    (which the analyzer sees anyway), never more than the buckets drawn."""
    return min(int(bucket_bits), split_bits(int(released_messages), int(messages_per_file)))


def complete_groups(
    buckets: Sequence[int], bucket_bits: int, released_messages: int, messages_per_file: int
) -> dict[int, list[int]]:
    """Group completion: ``{group: [indices of the buckets it holds]}`` for a crowd bucket whose
    surviving messages (``buckets`` here: the uniform slots they drew) were scattered over uniform buckets (:func:`assign_groups`). Buckets are
    merged by contiguous ranges (:func:`group_of_bucket`), so every message's group is uniform and
    independent of everything else, and the groups are listed in order."""
    bits = group_bits(bucket_bits, released_messages, messages_per_file)
    if not len(buckets):
        return {}
    groups = group_of_bucket(np.asarray(buckets, dtype=np.int64), bucket_bits, bits)
    completed: dict[int, list[int]] = {}
    for index, group in enumerate(groups.tolist()):
        completed.setdefault(int(group), []).append(index)
    return dict(sorted(completed.items()))


def split_bits(messages: int, target: int, max_bits: int = 16) -> int:
    """log2 of the number of parts (origin shards, output groups) of a crowd: the smallest power
    of two that keeps a part at about ``target`` messages or fewer (at most 2**max_bits parts)."""
    if messages < 0 or target < 1:
        raise ValueError("messages must be >= 0 and target >= 1")
    needed = max(1, math.ceil(messages / target))
    return min(max_bits, (needed - 1).bit_length())


def origin_shard_bits(
    messages: int, pieces: int, messages_per_shard: int, shard_piece_rows: int, workers: int = 1
) -> int:
    """log2 of the origin shards of a bucket of ``messages`` messages in ``pieces`` spill pieces.

    As many as keep a shard at about ``messages_per_shard`` messages (:func:`split_bits`), but no
    more than leave each shard about ``min(messages_per_shard, shard_piece_rows)`` rows of every
    piece (each shard reads its range of every piece, so the reads stay linear in the data), and
    no fewer than ``workers`` where the first bound allows: the pieces grow with the workers
    (each reads its own ranges of the input), and the second bound alone gave a bucket of
    1,922,707 messages in about 200 pieces 8 shards on 16 workers, half of them idle."""
    if min(pieces, messages_per_shard, shard_piece_rows, workers) < 1:
        raise ValueError("pieces, messages_per_shard, shard_piece_rows and workers must be >= 1")
    by_size = split_bits(messages, messages_per_shard)
    most = messages // (pieces * min(messages_per_shard, shard_piece_rows))
    by_reads = max(0, most.bit_length() - 1)
    return min(by_size, max(by_reads, (workers - 1).bit_length()))

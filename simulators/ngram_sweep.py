"""Interactive vs non-interactive n-gram discovery, drawn from the exact aggregate distribution.

``esa analysis run`` sends every round through the real stages (SQLite devices, ``esa simulate``,
shufflers, analyzer). Sweeping epsilon that way costs minutes per point, and the non-interactive
baseline over the full 3-gram domain (1 + V^2 (V + 2) buckets: 115,201 for V = 48 known words)
would make ~2,000 messages per device. Here both are drawn instead from the exact distribution of
what the analyzer de-biases: the same device rule (a uniformly chosen n-gram among the device's
own that extend the prefix tree, else a uniformly random bucket), then the released bucket sums
S_j = Bin(c_j, p_one) + Bin(n - c_j, p_zero) of asymmetric one-hot encoding
(``sample_bucket_sums``; samplable-anonymous-aggregation Algorithm 1) and the unbiased estimate
of Algorithm 2 (``privacy.estimators.debias_one_hot``). Shuffler thresholds and deletion are not
modelled (no deletion; every crowd is far above the threshold).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privacy.accounting import charged_cohort_epsilon as cohort_epsilon
from privacy.estimators import debias_one_hot
from privacy.ngrams import (
    END,
    OOV,
    NgramEncoding,
    PrefixTree,
    precision_recall_at_k,
    sentence_ngrams,
    tokenize,
    top_k,
)
from privacy.randomizers import AsymmetricOneHot

__all__ = [
    "device_ngrams",
    "device_answers",
    "estimate_exact",
    "next_tree",
    "first_tree",
    "full_tree",
    "true_top",
    "cohort_epsilon",
    "local_for_cohort",
    "SweepPoint",
    "interactive_exact",
    "baseline_exact",
]


def device_ngrams(typed: Sequence[Sequence[str]], n: int) -> list[list[tuple[str, ...]]]:
    """Per device, the n-grams of the sentences it holds (tokenized as the devices do)."""
    return [[g for s in sentences for g in sentence_ngrams(tokenize(s), n)] for sentences in typed]


def _ngrams(
    typed: Sequence[Sequence[str]] | dict[int, list[list[tuple[str, ...]]]], n: int
) -> list[list[tuple[str, ...]]]:
    """``typed`` is either sentences per device or already ``{n: n-grams per device}``."""
    if isinstance(typed, dict):
        return typed[n]
    return device_ngrams(typed, n)


def device_answers(
    ngrams: Sequence[Sequence[tuple[str, ...]]], encoding: NgramEncoding, rng: np.random.Generator
) -> np.ndarray:
    """Each device's bucket under the rule of ``simulators.interactive_devices.answer``."""
    out = np.empty(len(ngrams), dtype=np.int64)
    for device, grams in enumerate(ngrams):
        candidates = encoding.matching_buckets(grams)
        if candidates:
            out[device] = candidates[int(rng.integers(len(candidates)))]
        else:
            out[device] = int(rng.integers(encoding.domain_size))
    return out


def estimate_exact(
    values: np.ndarray, domain_size: int, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """De-biased counts of ``values`` after asymmetric one-hot encoding at ``epsilon``."""
    randomizer = AsymmetricOneHot(domain_size=domain_size, epsilon=epsilon)
    counts = np.bincount(values, minlength=domain_size)
    sums = randomizer.sample_bucket_sums(counts, rng)
    return debias_one_hot(sums, values.size, randomizer.p_one, randomizer.p_zero).estimate


def local_for_cohort(target: float, n: int, delta: float) -> float:
    """The largest epsilon_local (to 1e-4) whose cohort epsilon at ``n`` is at most ``target``:
    the non-interactive round's local epsilon at the interactive rounds' total budget."""
    low, high = 0.0, max(target, 1e-3)
    while cohort_epsilon(high, n, delta) <= target and high < 64:
        low, high = high, 2 * high
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (mid, high) if cohort_epsilon(mid, n, delta) <= target else (low, mid)
    return low


def first_tree(known_words: Sequence[str]) -> PrefixTree:
    """Round 1's tree: every known word is a leaf (2-grams that start with a known word)."""
    return PrefixTree(tuple((w,) for w in known_words))


def full_tree(known_words: Sequence[str], depth: int) -> PrefixTree:
    """The non-interactive tree: every sequence of ``depth`` known words is a leaf."""
    return PrefixTree(tuple(itertools.product(known_words, repeat=depth)))


def next_tree(estimates: np.ndarray, encoding: NgramEncoding, keep: int) -> PrefixTree | None:
    """The next round's tree: the ``keep`` most popular n-grams that can be extended (no OOV,
    no END); None when there are none."""
    leaves = [
        g for g in top_k(estimates, encoding, encoding.domain_size) if OOV not in g and END not in g
    ][:keep]
    return PrefixTree(tuple(leaves)) if leaves else None


def true_top(
    ngrams: Sequence[Sequence[tuple[str, ...]]], known_words: Sequence[str], k: int
) -> list[tuple[str, ...]]:
    """The k most frequent n-grams the devices hold whose words are all known (END allowed
    last): what a keyboard with this dictionary could learn at best."""
    known = set(known_words) | {END}
    counts: dict[tuple[str, ...], int] = {}
    for grams in ngrams:
        for g in grams:
            if all(w in known for w in g):
                counts[g] = counts.get(g, 0) + 1
    return [g for g, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]]


@dataclass(frozen=True)
class SweepPoint:
    epsilon_total: float
    method: str
    n: int
    precision: float
    recall: float


def interactive_exact(
    typed: Sequence[Sequence[str]] | dict[int, list[list[tuple[str, ...]]]],
    known_words: Sequence[str],
    epsilons: Sequence[float],
    keep: Sequence[int],
    k: int,
    rng: np.random.Generator,
    crowd: int,
    delta: float,
) -> list[SweepPoint]:
    """Rounds n = 2, 3, ... (one per local epsilon): precision and recall at k of each round's
    n-grams; ``epsilon_total`` is the cohort budget the rounds compose to (basic composition of
    :func:`cohort_epsilon` at ``crowd`` reports)."""
    points: list[SweepPoint] = []
    tree = first_tree(known_words)
    total = float(sum(cohort_epsilon(e, crowd, delta) for e in epsilons))
    for depth, (epsilon, kept) in enumerate(zip(epsilons, keep, strict=True), start=1):
        encoding = NgramEncoding(tuple(known_words), tree)
        ngrams = _ngrams(typed, encoding.n)
        estimates = estimate_exact(
            device_answers(ngrams, encoding, rng), encoding.domain_size, epsilon, rng
        )
        found = top_k(estimates, encoding, k)
        precision, recall = precision_recall_at_k(found, true_top(ngrams, known_words, k), k)
        points.append(
            SweepPoint(total, f"interactive {encoding.n}-grams", encoding.n, precision, recall)
        )
        following = next_tree(estimates, encoding, kept) if depth < len(epsilons) else None
        if following is None:
            break
        tree = following
    return points


def baseline_exact(
    typed: Sequence[Sequence[str]] | dict[int, list[list[tuple[str, ...]]]],
    known_words: Sequence[str],
    n: int,
    epsilon: float,
    k: int,
    rng: np.random.Generator,
    epsilon_total: float | None = None,
) -> SweepPoint:
    """One non-interactive round over every n-gram of known words at local ``epsilon``
    (``epsilon_total``: the cohort budget it is charged, for the record)."""
    encoding = NgramEncoding(tuple(known_words), full_tree(known_words, n - 1))
    ngrams = _ngrams(typed, n)
    estimates = estimate_exact(
        device_answers(ngrams, encoding, rng), encoding.domain_size, epsilon, rng
    )
    precision, recall = precision_recall_at_k(
        top_k(estimates, encoding, k), true_top(ngrams, known_words, k), k
    )
    total = epsilon if epsilon_total is None else epsilon_total
    return SweepPoint(total, f"non-interactive {n}-grams", n, precision, recall)

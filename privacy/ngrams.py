"""n-grams, prefix trees and their one-hot bucketing (samplable-anonymous-aggregation, Appendix B).

Learning popular n-grams interactively (Section 1 and Section 4.1): round 1 learns popular 2-grams
of known words; the server sends the devices a prefix tree of them, and round 2 asks for a
3-gram that extends a leaf of the tree. The one-hot encoding scheme of Appendix B makes the
domain: every combination of a prefix-tree leaf and a continuation is a bucket, where a
continuation is a known word of the recipe, ``OOV`` (a word not in the list) or ``END`` (the
sentence ended after the leaf, which tells whether a leaf is a leaf as well), plus one ``OOV``
bucket for everything that extends no leaf. Round 1 is the same scheme with the known words as
the leaves of a depth-1 tree, so the 2-gram domain is 1 + V (V + 2) buckets rather than the
V^3-sized domain a non-interactive round over all 3-grams needs.

Pure Python and numpy: no files, no Beam.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "OOV",
    "END",
    "tokenize",
    "sentence_ngrams",
    "ngram_counts",
    "PrefixTree",
    "NgramEncoding",
    "top_k",
    "precision_recall_at_k",
]

OOV = "<oov>"
END = "<end>"
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def tokenize(text: str) -> list[str]:
    """Lower-case words of ``text`` (letters with an inner apostrophe); punctuation splits."""
    return _WORD.findall(text.lower())


def sentence_ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The n-grams of one sentence, plus the ones that end it: ``(..., END)`` (Appendix B)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    padded = list(words) + [END]
    return [tuple(padded[i : i + n]) for i in range(len(padded) - n + 1) if padded[i] != END]


def ngram_counts(sentences: Iterable[Sequence[str]], n: int) -> Counter[tuple[str, ...]]:
    """How often each n-gram (END-terminated, see :func:`sentence_ngrams`) occurs."""
    counts: Counter[tuple[str, ...]] = Counter()
    for words in sentences:
        counts.update(sentence_ngrams(words, n))
    return counts


@dataclass(frozen=True)
class PrefixTree:
    """A set of word prefixes of one length, as a tree (the server-supplied list of Section 4.1).

    Leaves are stored sorted, so equal trees have equal :meth:`sha256`: a recipe may carry the
    hash instead of the tree (footnote 3), and a device checks the tree it holds against it.
    """

    leaves: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        leaves = tuple(sorted({tuple(leaf) for leaf in self.leaves}))
        if not leaves:
            raise ValueError("a prefix tree needs at least one leaf")
        depths = {len(leaf) for leaf in leaves}
        if len(depths) != 1 or 0 in depths:
            raise ValueError(f"prefix tree leaves must be non-empty and of one length: {depths}")
        for leaf in leaves:
            if not all(isinstance(word, str) and word for word in leaf):
                raise ValueError(f"prefix tree leaf {leaf!r} holds a non-word")
        object.__setattr__(self, "leaves", leaves)

    @property
    def depth(self) -> int:
        return len(self.leaves[0])

    def children(self) -> dict[tuple[str, ...], list[str]]:
        """Interior node -> its children's words (the tree form of the leaf list)."""
        tree: dict[tuple[str, ...], list[str]] = {}
        for leaf in self.leaves:
            for i in range(len(leaf)):
                kids = tree.setdefault(leaf[:i], [])
                if leaf[i] not in kids:
                    kids.append(leaf[i])
        return tree

    def to_json(self) -> str:
        return json.dumps([list(leaf) for leaf in self.leaves], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PrefixTree:
        return cls(tuple(tuple(leaf) for leaf in json.loads(text)))

    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()


@dataclass(frozen=True)
class NgramEncoding:
    """The one-hot encoding scheme of Appendix B for (n)-grams extending a prefix tree's leaves.

    Bucket 0 is ``OOV`` (the n-gram extends no leaf); bucket ``1 + i (V + 2) + j`` is leaf ``i``
    followed by continuation ``j`` of ``known_words + (OOV, END)``. A continuation outside
    ``known_words`` is read as ``OOV``; the leaf must match word for word.
    """

    known_words: tuple[str, ...]
    tree: PrefixTree
    prefer_known: bool = True
    _leaf_index: Mapping[tuple[str, ...], int] = field(init=False, repr=False, compare=False)
    _next_index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        words = tuple(self.known_words)
        if not words or len(set(words)) != len(words) or OOV in words or END in words:
            raise ValueError("known_words must be distinct words, without the OOV/END tokens")
        object.__setattr__(self, "known_words", words)
        object.__setattr__(
            self, "_leaf_index", {leaf: i for i, leaf in enumerate(self.tree.leaves)}
        )
        continuations = (*words, OOV, END)
        object.__setattr__(self, "_next_index", {w: j for j, w in enumerate(continuations)})

    @property
    def n(self) -> int:
        """Length of the n-grams this scheme buckets (tree depth + 1)."""
        return self.tree.depth + 1

    @property
    def continuations(self) -> int:
        return len(self.known_words) + 2

    @property
    def domain_size(self) -> int:
        return 1 + len(self.tree.leaves) * self.continuations

    def normalize(self, ngram: Sequence[str]) -> tuple[str, ...]:
        """Words outside the known list become OOV (END stays END)."""
        known = self._next_index
        return tuple(w if (w in known and w != OOV) else OOV for w in ngram)

    def bucket(self, ngram: Sequence[str]) -> int:
        """The bucket of one n-gram (0 when it extends no leaf)."""
        if len(ngram) != self.n:
            raise ValueError(f"expected a {self.n}-gram, got {ngram!r}")
        leaf = self._leaf_index.get(tuple(ngram[:-1]))
        if leaf is None:
            return 0
        last = self.normalize(ngram[-1:])[0]
        return 1 + leaf * self.continuations + self._next_index[last]

    def ngram(self, bucket: int) -> tuple[str, ...] | None:
        """The n-gram of a bucket (None for the OOV bucket 0)."""
        if not 0 <= bucket < self.domain_size:
            raise ValueError(f"bucket {bucket} outside [0, {self.domain_size})")
        if bucket == 0:
            return None
        leaf, j = divmod(bucket - 1, self.continuations)
        return (*self.tree.leaves[leaf], (*self.known_words, OOV, END)[j])

    def matching_buckets(self, ngrams: Iterable[Sequence[str]]) -> list[int]:
        """Buckets of those ``ngrams`` that extend a leaf (the query's candidates); with
        ``prefer_known``, only those continued by a known word or END when there are any (a
        report on "leaf OOV" teaches the analyst nothing new)."""
        matches = [b for b in (self.bucket(g) for g in ngrams) if b != 0]
        if self.prefer_known:
            oov = len(self.known_words)  # continuation index of OOV
            known = [b for b in matches if (b - 1) % self.continuations != oov]
            if known:
                return known
        return matches

    def to_dict(self) -> dict[str, object]:
        return {
            "n": self.n,
            "known_words": list(self.known_words),
            "prefix_tree": [list(leaf) for leaf in self.tree.leaves],
            "prefix_tree_sha256": self.tree.sha256(),
            "prefer_known": self.prefer_known,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> NgramEncoding:
        tree = PrefixTree(tuple(tuple(leaf) for leaf in data["prefix_tree"]))  # type: ignore[union-attr]
        stated = data.get("prefix_tree_sha256")
        if stated is not None and stated != tree.sha256():
            raise ValueError("prefix tree does not match its sha256 in the recipe")
        encoding = cls(
            tuple(data["known_words"]),  # type: ignore[arg-type]
            tree,
            bool(data.get("prefer_known", True)),
        )
        if "n" in data and data["n"] != encoding.n:
            raise ValueError(f"n={data['n']} does not match the prefix tree depth + 1")
        return encoding


def top_k(
    estimates: np.ndarray, encoding: NgramEncoding, k: int, informative_only: bool = True
) -> list[tuple[str, ...]]:
    """The ``k`` n-grams with the largest estimates (skipping OOV, and by default n-grams that
    end in OOV: those name no word)."""
    order = np.argsort(-np.asarray(estimates, dtype=np.float64), kind="stable")
    found: list[tuple[str, ...]] = []
    for bucket in order:
        gram = encoding.ngram(int(bucket))
        if gram is None or (informative_only and OOV in gram):
            continue
        found.append(gram)
        if len(found) == k:
            break
    return found


def precision_recall_at_k(
    found: Sequence[tuple[str, ...]], truth: Sequence[tuple[str, ...]], k: int
) -> tuple[float, float]:
    """Precision@k (share of the first k found that are among the true top k) and recall@k
    (share of the true top k that were found among the first k). They differ only when fewer
    than k were found or the truth is shorter than k."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    got = list(found)[:k]
    true = set(list(truth)[:k])
    hits = sum(1 for g in got if g in true)
    precision = hits / len(got) if got else 0.0
    recall = hits / len(true) if true else 0.0
    return precision, recall

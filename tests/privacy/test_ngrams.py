"""n-grams, prefix trees and Appendix B bucketing (privacy/ngrams.py)."""

from __future__ import annotations

import numpy as np
import pytest

from privacy.ngrams import (
    END,
    OOV,
    NgramEncoding,
    PrefixTree,
    ngram_counts,
    precision_recall_at_k,
    sentence_ngrams,
    tokenize,
    top_k,
)


def test_tokenize_and_sentence_ngrams_end_token():
    words = tokenize("Hello, World! It's   me.")
    assert words == ["hello", "world", "it's", "me"]
    assert sentence_ngrams(["a", "b"], 2) == [("a", "b"), ("b", END)]
    assert sentence_ngrams(["a", "b"], 3) == [("a", "b", END)]
    assert sentence_ngrams([], 2) == []
    assert ngram_counts([["a", "b"], ["a", "b"]], 2)[("a", "b")] == 2


def test_prefix_tree_hash_is_order_free_and_round_trips():
    one = PrefixTree((("hello", "world"), ("i", "got")))
    two = PrefixTree((("i", "got"), ("hello", "world"), ("i", "got")))
    assert one == two and one.sha256() == two.sha256()
    assert PrefixTree.from_json(one.to_json()) == one
    assert one.children()[()] == ["hello", "i"]
    assert one.sha256() != PrefixTree((("hello", "world"),)).sha256()
    with pytest.raises(ValueError, match="one length"):
        PrefixTree((("a",), ("a", "b")))


def test_appendix_b_bucket_count_and_round_trip():
    # Figure 4: three 2-gram leaves and nine known words give 1 + 3 x (1 + 1 + 9) buckets.
    known = tuple(f"w{i}" for i in range(9))
    tree = PrefixTree((("hello", "world"), ("i", "got"), ("w0", "w1")))
    encoding = NgramEncoding(known, tree, prefer_known=False)
    assert encoding.domain_size == 1 + 3 * (1 + 1 + 9)
    for bucket in range(1, encoding.domain_size):
        gram = encoding.ngram(bucket)
        assert encoding.bucket(gram) == bucket
    assert encoding.ngram(0) is None
    assert encoding.bucket(("no", "such", "leaf")) == 0
    assert encoding.ngram(encoding.bucket(("hello", "world", "zebra"))) == ("hello", "world", OOV)
    assert encoding.ngram(encoding.bucket(("i", "got", END))) == ("i", "got", END)
    assert NgramEncoding.from_dict(encoding.to_dict()) == encoding


def test_tampered_tree_is_refused_by_its_hash():
    encoding = NgramEncoding(("a", "b"), PrefixTree((("a",),)))
    data = encoding.to_dict()
    data["prefix_tree"] = [["b"]]
    with pytest.raises(ValueError, match="sha256"):
        NgramEncoding.from_dict(data)


def test_matching_prefers_known_continuations():
    encoding = NgramEncoding(("a", "b"), PrefixTree((("a",),)))
    grams = [("a", "zebra"), ("a", "b"), ("b", "a")]
    assert [encoding.ngram(b) for b in encoding.matching_buckets(grams)] == [("a", "b")]
    assert [encoding.ngram(b) for b in encoding.matching_buckets([("a", "zebra")])] == [("a", OOV)]
    plain = NgramEncoding(("a", "b"), PrefixTree((("a",),)), prefer_known=False)
    assert len(plain.matching_buckets(grams)) == 2


def test_top_k_skips_oov_and_precision_recall():
    encoding = NgramEncoding(("a", "b"), PrefixTree((("a",), ("b",))))
    estimates = np.zeros(encoding.domain_size)
    estimates[0] = 100  # OOV bucket
    estimates[encoding.bucket(("a", "zebra"))] = 90
    estimates[encoding.bucket(("a", "b"))] = 50
    estimates[encoding.bucket(("b", END))] = 40
    assert top_k(estimates, encoding, 2) == [("a", "b"), ("b", END)]
    assert precision_recall_at_k([("a", "b"), ("b", END)], [("a", "b"), ("a", "a")], 2) == (
        0.5,
        0.5,
    )
    assert precision_recall_at_k([("a", "b")], [("a", "b"), ("a", "a")], 2) == (1.0, 0.5)

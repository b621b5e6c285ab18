"""Crowd buckets (schemas/release/crowd_buckets.py): stable, uniform placement and the file layout."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from schemas.release import crowd_buckets as cb


def test_bucket_is_the_digest_prefix_modulo_buckets() -> None:
    digest = hashlib.sha256(b'["app","app-v1","c1"]').digest()
    assert cb.crowd_bucket("app", "app-v1", "c1", 1000) == int.from_bytes(digest[:8], "big") % 1000
    assert cb.crowd_bucket("app", "app-v1", None, 1) == 0


def test_null_and_string_crowd_ids_differ_and_order_nulls_first() -> None:
    keys = {cb.crowd_bucket("a", "r", crowd, 1 << 16) for crowd in (None, "null", "")}
    assert len(keys) == 3
    assert (
        sorted([("a", "r", "x"), ("a", "r", None)], key=lambda k: cb.crowd_order(*k))[0][2] is None
    )


def test_buckets_are_uniform() -> None:
    # 20,000 crowds over 16 buckets: chi-square with 15 degrees of freedom; 37.7 is its 0.999
    # quantile, so an honest hash fails this test with probability 1e-3 (fixed names: never).
    counts = np.bincount(
        [cb.crowd_bucket("ch", "r", f"crowd-{i}", 16) for i in range(20_000)], minlength=16
    )
    expected = 20_000 / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 37.7


@pytest.mark.parametrize("buckets", [0, -1, cb.MAX_CROWD_BUCKETS + 1, 2.0, True])
def test_bad_bucket_counts_are_refused(buckets) -> None:
    with pytest.raises(ValueError, match="crowd buckets"):
        cb.crowd_bucket("a", "r", "c", buckets)


def test_paths_round_trip() -> None:
    key = cb.BucketKey(-86_400_000, 3, 17)
    assert cb.message_file_path(key, 2) == "messages/-86400000-u3-b00017-g00002.avro"
    assert cb.crowd_table_path(key) == "crowds/-86400000-u3-b00017.avro"
    assert cb.parse_release_path(cb.message_file_path(key, 2)) == ("messages", key, 2)
    assert cb.parse_release_path(cb.crowd_table_path(key)) == ("crowds", key, None)


@pytest.mark.parametrize(
    "path",
    [
        "crowds/5-u1-b00003-g00001.avro",
        "messages/5-u1-b00003.avro",
        "messages/5-u1-b3-g00001.avro",
        "messages/x-u1-b00003-g00001.avro",
        "other/5-u1-b00003.avro",
        "crowds/5-u1-b00003.avro.tmp",
    ],
)
def test_other_paths_are_not_release_files(path: str) -> None:
    assert cb.parse_release_path(path) is None


def test_buckets_of_many_crowds_are_each_crowds_bucket() -> None:
    """``crowd_buckets_of`` hashes plain crowds in one loop and the others (JSON escapes,
    non-ASCII, non-string values) one by one: the same buckets as ``crowd_bucket`` either way."""
    plain = [("ch", "r@1", f"c{i}") for i in range(300)] + [("ch", "r@1", None), ("a", "b", "")]
    odd = [('q"', "r", "x"), ("a", "b\\", None), ("a", "b", "\n"), ("é", "€", "ü"), ("a", "b", 7)]
    for crowds in (plain, plain + odd, odd, []):
        for buckets in (1, 16, 1000):
            expected = [cb.crowd_bucket(*crowd, buckets) for crowd in crowds]
            assert cb.crowd_buckets_of(crowds, buckets) == expected


@pytest.mark.parametrize("buckets", [0, cb.MAX_CROWD_BUCKETS + 1, True])
def test_bad_bucket_counts_are_refused_for_many_crowds(buckets) -> None:
    with pytest.raises(ValueError, match="crowd buckets"):
        cb.crowd_buckets_of([("a", "r", "c")], buckets)

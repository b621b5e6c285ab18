"""Crowd buckets: how a shuffler release packs many crowds into few files (``esa-release/2``).

A release of many small crowds must not cost one file, one commit entry or one pipeline element
per crowd (issue: no whole-dataset gathers; memory flat in the number of crowds). A crowd is
placed in one of ``buckets`` buckets by a digest of its key (channel, recipe, crowd ID), the same
in every window, instance and run; the unit of the shuffler's work and of the release layout is
the bucket of a window and an instance, named by its *stem*:

* ``messages/<stem>-g<group>.avro``: ShuffledMessage files of the bucket's released crowds, rows
  grouped by crowd in :func:`crowd_order`, each crowd's rows in uniformly random order;
* ``crowds/<stem>.avro``: one ReleasedCrowd record (``released_crowd.avsc``) per crowd of the
  bucket, released or withheld, in :func:`crowd_order`.

Pure: the standard library only.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

__all__ = [
    "DEFAULT_CROWD_BUCKETS",
    "MAX_CROWD_BUCKETS",
    "BucketKey",
    "crowd_bucket",
    "crowd_buckets_of",
    "key_json_buckets",
    "crowd_order",
    "bucket_stem",
    "message_file_path",
    "crowd_table_path",
    "parse_release_path",
]

DEFAULT_CROWD_BUCKETS = 16
MAX_CROWD_BUCKETS = 1 << 16
MESSAGES_DIR = "messages"
CROWDS_DIR = "crowds"
_PATH = re.compile(
    r"^(?P<dir>messages|crowds)/(?P<window>-?[0-9]{1,19})-u(?P<instance>[0-9]{1,10})"
    r"-b(?P<bucket>[0-9]{5})(?:-g(?P<group>[0-9]{5}))?\.avro$"
)


class BucketKey(NamedTuple):
    """The unit of a release: a bucket of crowds in one window of one instance."""

    window_start: int
    instance: int
    bucket: int


def crowd_bucket(channel: str, recipe_id: str, crowd_id: str | None, buckets: int) -> int:
    """The bucket in ``[0, buckets)`` of a crowd: the first 8 bytes of SHA-256 over the JSON of
    ``[channel, recipe_id, crowd_id]``, big-endian, modulo ``buckets`` (window and instance are
    not hashed: they are parts of the stem)."""
    _check_buckets(buckets)
    return key_json_buckets([_key_json(channel, recipe_id, crowd_id)], buckets)[0]


def crowd_buckets_of(crowds: Sequence[tuple[str, str, str | None]], buckets: int) -> list[int]:
    """:func:`crowd_bucket` of each ``(channel, recipe_id, crowd_id)`` of ``crowds``, the same
    values, with ``buckets`` checked once and the crowds of plain strings (no character JSON
    escapes, found by one search over all of them) hashed in one tight loop."""
    _check_buckets(buckets)
    channels, recipe_ids, crowd_ids = zip(*crowds, strict=True) if crowds else ((), (), ())
    plain = (
        set(map(type, channels)) <= {str}
        and set(map(type, recipe_ids)) <= {str}
        and set(map(type, crowd_ids)) <= {str, type(None)}
        and _ESCAPED.search("".join([*channels, *recipe_ids, *filter(None, crowd_ids)])) is None
    )
    if not plain:
        return [crowd_bucket(*crowd, buckets) for crowd in crowds]
    return key_json_buckets(
        [
            (f'["{c}","{r}","{i}"]' if i is not None else f'["{c}","{r}",null]').encode()
            for c, r, i in crowds
        ],
        buckets,
    )


def key_json_buckets(keys: Iterable[bytes], buckets: int) -> list[int]:
    """The bucket of each crowd key given as the UTF-8 JSON :func:`crowd_bucket` hashes
    (``["<channel>","<recipe_id>",<crowd_id or null>]``, no spaces): the first 8 bytes of its
    SHA-256, big-endian, modulo ``buckets`` (checked by the caller), in one tight loop."""
    sha256, from_bytes = _sha256, int.from_bytes
    return [from_bytes(sha256(key).digest()[:8], "big") % buckets for key in keys]


def _check_buckets(buckets: int) -> None:
    is_int = type(buckets) is int or (isinstance(buckets, int) and not isinstance(buckets, bool))
    if not is_int or not 1 <= buckets <= MAX_CROWD_BUCKETS:
        raise ValueError(
            f"crowd buckets must be an int in [1, {MAX_CROWD_BUCKETS}], got {buckets!r}"
        )


# json.dumps(key, separators=(",", ":"), ensure_ascii=False), without making an encoder per call
# (it is called once per crowd by shufflers and the analyzer).
_KEY_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# What json.dumps escapes with ensure_ascii=False (json.encoder.ESCAPE): strings without any of
# these are written as they are, between quotes.
_ESCAPED = re.compile(r'[\x00-\x1f\\"]')
# CPython's own SHA-256 (the same digests): about half the cost of OpenSSL's for a crowd key's
# few dozen bytes, where setting up OpenSSL's context is most of the work.
try:
    from _sha256 import sha256 as _sha256  # CPython 3.11
except ImportError:  # pragma: no cover - other versions or builds
    try:
        from _sha2 import sha256 as _sha256  # CPython 3.12 on
    except ImportError:
        _sha256 = hashlib.sha256


def _key_json(channel: str, recipe_id: str, crowd_id: str | None) -> bytes:
    """UTF-8 of ``json.dumps([channel, recipe_id, crowd_id], separators=(",", ":"),
    ensure_ascii=False)``: joined directly for plain strings, else by the encoder."""
    if (
        type(channel) is str
        and type(recipe_id) is str
        and (crowd_id is None or type(crowd_id) is str)
        and _ESCAPED.search(f"{channel}{recipe_id}{crowd_id or ''}") is None
    ):
        last = "null" if crowd_id is None else f'"{crowd_id}"'
        return f'["{channel}","{recipe_id}",{last}]'.encode()
    return _KEY_JSON.encode([channel, recipe_id, crowd_id]).encode()


def crowd_order(channel: str, recipe_id: str, crowd_id: str | None) -> tuple[str, str, int, str]:
    """Sort key of crowds inside a bucket's files (a null crowd ID before every string)."""
    return (channel, recipe_id, 0 if crowd_id is None else 1, crowd_id or "")


def bucket_stem(key: BucketKey | tuple[int, int, int]) -> str:
    """``<window_start ms>-u<instance>-b<bucket, 5 digits>``."""
    window_start, instance, bucket = (int(part) for part in key)
    return f"{window_start}-u{instance}-b{bucket:05d}"


def message_file_path(key: BucketKey | tuple[int, int, int], group: int) -> str:
    """``messages/<stem>-g<group, 5 digits>.avro``: the same in every attempt of a run."""
    return f"{MESSAGES_DIR}/{bucket_stem(key)}-g{int(group):05d}.avro"


def crowd_table_path(key: BucketKey | tuple[int, int, int]) -> str:
    """``crowds/<stem>.avro``."""
    return f"{CROWDS_DIR}/{bucket_stem(key)}.avro"


def parse_release_path(relative: str) -> tuple[str, BucketKey, int | None] | None:
    """``(directory, bucket key, group)`` of a release file's relative path (group None for a
    crowd table), or None when the path is not one of the two layouts."""
    match = _PATH.match(relative)
    if match is None:
        return None
    group = match["group"]
    if (match["dir"] == CROWDS_DIR) != (group is None):
        return None
    key = BucketKey(int(match["window"]), int(match["instance"]), int(match["bucket"]))
    return match["dir"], key, None if group is None else int(group)

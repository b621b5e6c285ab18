"""Crowd tables of esa-release/2 (schemas/release/crowd_tables.py through schemas/release/commit.py): the
reader API, and every way a table can lie while its SHA-256 matches the commit record (each
hostile table below is re-committed, so what refuses it is the content check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.release import commit as rel
from schemas.release import crowd_tables as rc
from schemas.release.crowd_buckets import (
    BucketKey,
    crowd_bucket,
    crowd_table_path,
    message_file_path,
)
from tests import release_fixtures as fx

BUCKETS = 4
T1 = fx.T0 + fx.DAY_MS
# Crowds of two windows and three buckets (of 4): released, withheld, a null crowd ID.
CROWDS = [
    fx.crowd("a", 5),
    fx.crowd("b", 7),
    fx.crowd("c", None),
    fx.crowd(None, 3),
    fx.crowd("a", 4, start=T1),
    fx.crowd("zz", None, start=T1),
]
MESSAGES = [[b"a%d" % i for i in range(n)] for n in (6, 9, 0, 3, 4, 0)]


def _key(crowd: dict) -> BucketKey:
    bucket = crowd_bucket(crowd["channel"], crowd["recipe_id"], crowd["crowd_id"], BUCKETS)
    return BucketKey(crowd["window_start_ms"], 0, bucket)


@pytest.fixture
def made(tmp_path: Path) -> Path:
    fx.write_release(tmp_path, CROWDS, MESSAGES, buckets=BUCKETS, groups=2)
    return tmp_path


def test_the_reader_api_gives_every_crowd_once_with_the_commit_crowd_keys(made: Path) -> None:
    verified = rel.verify_release(str(made))
    paths = rc.crowd_table_paths(verified)
    assert paths == rel.crowd_table_paths(verified) and len(paths) == len({*map(_key, CROWDS)})
    assert all(Path(p).parent == made / "crowds" for p in paths)
    crowds = list(rel.iter_crowds(verified))
    assert all(tuple(c) == rc.CROWD_FIELDS for c in crowds)
    expected = [
        {"instance": 0, "messages_released": len(m) if c["status"] == "released" else 0, **c}
        for c, m in zip(CROWDS, MESSAGES, strict=True)
    ]
    by_id = lambda c: (c["window_start_ms"], c["crowd_id"] or "")  # noqa: E731
    assert sorted(crowds, key=by_id) == sorted(expected, key=by_id)
    assert rc.read_crowd_table(paths[0]) == crowds[: len(rc.read_crowd_table(paths[0]))]
    assert verified.records == sum(map(len, MESSAGES)) == verified.commit["records_released"]
    commit = verified.commit
    assert (commit["crowds_released"], commit["crowds_withheld"]) == (4, 2)
    assert commit["respondents_released"] == 5 + 7 + 3 + 4


def test_a_table_with_only_withheld_crowds_has_no_message_files(made: Path) -> None:
    table = made / crowd_table_path(_key(CROWDS[5]))
    assert [c["status"] for c in rc.read_crowd_table(str(table))] == ["withheld"]
    stem = table.name.removesuffix(".avro")
    assert not list((made / "messages").glob(f"{stem}-g*.avro"))


def _table_of(made: Path, index: int) -> Path:
    return made / crowd_table_path(_key(CROWDS[index]))


def _rewrite(table: Path, change) -> None:
    rows = rc.read_crowd_table(str(table))
    rows = change(rows)
    fx.write_avro(table, "released_crowd", fx.table_rows(rows))


def _set(index_in_table: int, **values):
    def change(rows: list[dict]) -> list[dict]:
        rows[index_in_table].update(values)
        return rows

    return change


def _balance(record: dict) -> None:
    """Make crowds_withheld agree with the tables' record count (so the rows are what's checked)."""
    tables = sum(f["records"] for f in record["files"] if f["path"].startswith("crowds/"))
    record["crowds_withheld"] = tables - record["crowds_released"]


def _refused(made: Path, *words: str, recommit: bool = True, change=None) -> str:
    if recommit:
        fx.recommit(made, lambda record: (change and change(record), _balance(record)))
    with pytest.raises(rel.ReleaseError) as raised:
        rel.verify_release(str(made))
    message = str(raised.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def _one_table_of_two(made: Path) -> Path:
    """The table holding two crowds of the first window (with 4 buckets, some table does)."""
    for path in sorted((made / "crowds").iterdir()):
        if len(rc.read_crowd_table(str(path))) >= 2:
            return path
    raise AssertionError("no table of two crowds; choose other crowd IDs")


def test_a_crowd_in_the_wrong_buckets_table(tmp_path: Path) -> None:
    fx.write_release(tmp_path, CROWDS[:1], MESSAGES[:1], buckets=BUCKETS, groups=2)
    key = _key(CROWDS[0])  # crowd "a" with its messages, moved to the next bucket's stem
    stem, wrong = (
        path.split("/")[1][:-5]
        for path in map(crowd_table_path, (key, key._replace(bucket=(key.bucket + 1) % BUCKETS)))
    )
    for path in [*(tmp_path / "messages").iterdir(), *(tmp_path / "crowds").iterdir()]:
        path.rename(path.with_name(path.name.replace(stem, wrong)))
    _refused(tmp_path, wrong, '"crowd_id": "a"', f"belongs in bucket {key.bucket}")


def test_a_crowd_twice_in_one_table(made: Path) -> None:
    table = _table_of(made, 0)
    _rewrite(table, lambda rows: rows + rows[-1:])
    _refused(made, table.name, "out of crowd order (or listed twice)")


def test_rows_out_of_order(made: Path) -> None:
    table = _one_table_of_two(made)
    _rewrite(table, lambda rows: rows[::-1])
    _refused(made, table.name, "out of crowd order")


def test_a_table_of_another_window(made: Path) -> None:
    table = _table_of(made, 4)  # the second window's crowd "a", stated in the first window
    _rewrite(table, _set(0, window_start_ms=fx.T0, window_end_ms=fx.T0 + fx.DAY_MS))
    _refused(made, table.name, f"has window_start {fx.T0}", f"starts at {T1}")


def test_a_table_of_another_instance(made: Path) -> None:
    table = _table_of(made, 0)
    _rewrite(table, lambda rows: [{**row, "instance": 1} for row in rows])
    _refused(made, table.name, "has instance 1", "instance 0's")
    # the whole table moved to instance 1's stem: its path is not a bucket of instance 0
    table.rename(made / "crowds" / table.name.replace("-u0-", "-u1-"))
    _refused(made, "-u1-", "not a bucket of instance 0")


def test_rows_of_another_instance_when_one_run_served_every_instance(tmp_path: Path) -> None:
    crowds = [{**crowd, "instance": 2} for crowd in CROWDS[:2]]
    fx.write_release(tmp_path, crowds, MESSAGES[:2], instance=None, buckets=BUCKETS)
    assert rel.verify_release(str(tmp_path)).commit["instance"] is None
    table = sorted((tmp_path / "crowds").iterdir())[0]
    _rewrite(table, lambda rows: [{**row, "instance": 3} for row in rows])
    _refused(tmp_path, table.name, "has instance 3")


def test_a_withheld_crowd_with_counts(made: Path) -> None:
    table = _table_of(made, 2)
    index = [r["crowd_id"] for r in rc.read_crowd_table(str(table))].index("c")
    _rewrite(table, _set(index, respondents_released=9))
    _refused(made, table.name, '"crowd_id": "c"', "withheld but states counts")
    _rewrite(table, _set(index, respondents_released=None, messages_released=1))
    _refused(made, table.name, "withheld but states counts")


@pytest.mark.parametrize(
    ("respondents", "words"),
    [(1, "below the crowd_threshold 2"), (10**11, "respondents_released"), (None, "not an int")],
)
def test_released_respondents_below_threshold_or_absurd(
    made: Path, respondents: int | None, words: str
) -> None:
    table = _table_of(made, 1)
    index = [r["crowd_id"] for r in rc.read_crowd_table(str(table))].index("b")
    _rewrite(table, _set(index, respondents_released=respondents))
    _refused(made, table.name, '"crowd_id": "b"', words)


def test_a_window_that_ends_before_it_starts(made: Path) -> None:
    table = _table_of(made, 0)
    _rewrite(table, lambda rows: [{**row, "window_end_ms": fx.T0} for row in rows])
    _refused(made, table.name, "window_end")


def test_totals_that_disagree_with_the_tables(made: Path) -> None:
    def shift(record: dict) -> None:
        record["crowds_released"] += 1
        record["crowds_withheld"] -= 1  # the tables' record count still adds up

    _refused(made, rel.COMMIT_FILE, "crowds_released 5", "sum to 4", change=shift)
    restate = dict(crowds_released=4, respondents_released=20)  # n of one crowd inflated
    _refused(made, "respondents_released 20", "sum to 19", change=lambda r: r.update(restate))


def test_messages_released_that_disagree_with_the_bucket_files(made: Path) -> None:
    table = _table_of(made, 1)
    index = [r["crowd_id"] for r in rc.read_crowd_table(str(table))].index("b")
    _rewrite(table, _set(index, messages_released=8))
    _refused(made, table.name, "the message files of its bucket hold")


def test_a_message_file_whose_stem_has_no_table(made: Path) -> None:
    table = _table_of(made, 1)
    withheld = sum(r["status"] == "withheld" for r in rc.read_crowd_table(str(table)))
    released = len(rc.read_crowd_table(str(table))) - withheld
    table.unlink()

    def drop(record: dict) -> None:
        record["crowds_released"] -= released
        record["crowds_withheld"] -= withheld

    stem = table.name.removesuffix(".avro")
    _refused(made, stem, "has no crowd table of its bucket", change=drop)


def test_an_edited_table_fails_its_sha256(made: Path) -> None:
    table = _table_of(made, 1)
    index = [r["crowd_id"] for r in rc.read_crowd_table(str(table))].index("b")
    _rewrite(table, _set(index, respondents_released=60))  # n 8.6 times, not re-committed
    _refused(made, table.name, "SHA-256", recommit=False)


def test_a_message_file_in_place_of_a_table(made: Path) -> None:
    table = _table_of(made, 0)
    message = made / message_file_path(_key(CROWDS[0]), 0)
    table.write_bytes(message.read_bytes())
    _refused(made, table.name, "not a crowd table")
    table.write_bytes(b"\x00" * 40)
    _refused(made, table.name, "not a crowd table")


def test_bounded_reading_never_lists_every_crowd(made: Path) -> None:
    """iter_crowds is lazy: the first crowd comes before the second table is opened."""
    verified = rel.verify_release(str(made))
    crowds = rel.iter_crowds(verified)
    first = next(crowds)
    for path in rc.crowd_table_paths(verified)[1:]:
        Path(path).unlink()
    assert first["status"] in ("released", "withheld")
    with pytest.raises(rc.ReleaseError, match="unreadable crowd table"):
        list(crowds)


def test_crowd_dicts_are_json_like_the_commit_crowds_were(made: Path) -> None:
    crowd = next(rel.iter_crowds(rel.verify_release(str(made))))
    assert json.loads(json.dumps(crowd)) == crowd


def test_a_table_of_another_writer_schema_is_resolved_to_released_crowd(made: Path) -> None:
    """The shuffler's own schema is read as written; a table written with another schema that
    resolves (fields reordered, an extra field, a field left to its default) reads as the
    crowds ReleasedCrowd gives; one that does not resolve is not a crowd table."""
    import fastavro

    from schemas import schema_json

    table = _table_of(made, 0)
    expected = rc.read_crowd_table(str(table))
    rows = fx.table_rows(expected)
    schema = json.loads(json.dumps(schema_json("released_crowd")))
    schema["fields"] = [*reversed(schema["fields"]), {"name": "extra", "type": "int"}]
    with table.open("wb") as sink:
        fastavro.writer(sink, fastavro.parse_schema(schema), [{**r, "extra": 1} for r in rows])
    assert rc.read_crowd_table(str(table)) == expected
    without_id = {**schema, "fields": [f for f in schema["fields"] if f["name"] != "crowd_id"]}
    with table.open("wb") as sink:  # the reader's default fills the field
        fastavro.writer(sink, fastavro.parse_schema(without_id), [{**r, "extra": 1} for r in rows])
    assert rc.read_crowd_table(str(table)) == [{**r, "crowd_id": None} for r in expected]
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "messages_released"]
    with table.open("wb") as sink:
        fastavro.writer(sink, fastavro.parse_schema(schema), [{**r, "extra": 1} for r in rows])
    with pytest.raises(rc.ReleaseError, match="not a crowd table"):
        rc.read_crowd_table(str(table))


def test_crowd_bucket_is_the_digest_of_the_json_key_whatever_its_strings_hold() -> None:
    """crowd_bucket joins plain keys without the JSON encoder: the same bucket as the documented
    SHA-256 of ``json.dumps([channel, recipe_id, crowd_id], separators=(",", ":"),
    ensure_ascii=False)`` for strings with quotes, backslashes, control and non-ASCII
    characters, and a null crowd ID."""
    import hashlib
    import random

    def documented(channel, recipe_id, crowd_id, buckets):
        text = json.dumps([channel, recipe_id, crowd_id], separators=(",", ":"), ensure_ascii=False)
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % buckets

    rng = random.Random(5)
    alphabet = 'ab"\\\n\t\x00\x1f\x7fä€😀\u2028/ '
    for _ in range(5_000):
        key = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(3)]
        key[2] = None if rng.random() < 0.2 else key[2]
        buckets = rng.randint(1, 1 << 16)
        assert crowd_bucket(*key, buckets) == documented(*key, buckets)


def _many_rows(count: int, seed: int) -> list[dict]:
    """Crowd dicts of every kind of value: released and withheld, null and odd crowd IDs."""
    import random

    rng = random.Random(seed)
    rows = []
    for index in range(count):
        released = rng.random() < 0.7
        rows.append(
            {
                "window_start_ms": fx.T0 + rng.randrange(3) * fx.DAY_MS,
                "window_end_ms": fx.T0 + 5 * fx.DAY_MS,
                "instance": rng.randrange(3),
                "channel": rng.choice(["ch", "ç\u00e9", ""]),
                "recipe_id": rng.choice(["r@1", "r@2"]),
                "crowd_id": None if rng.random() < 0.1 else f"c{index}\u2603" * rng.randrange(3),
                "status": "released" if released else "withheld",
                "respondents_released": rng.randrange(10**10) if released else None,
                "messages_released": rng.randrange(2**40) if released else 0,
            }
        )
    return rows


def test_tables_decoded_together_are_the_rows_read_one_by_one(tmp_path: Path) -> None:
    """parse_crowd_tables (the verifying pass's numpy decoder over many tables) gives exactly
    parse_crowd_table's rows, values and types, for tables of one and of many blocks, deflate
    or not, and an empty table among them."""
    import fastavro

    from schemas import parsed_schema

    sources = []
    for index, (count, codec, interval) in enumerate(
        [(1, "null", 16000), (300, "deflate", 512), (0, "deflate", 16000), (57, "null", 100)]
    ):
        path = tmp_path / f"t{index}.avro"
        with path.open("wb") as sink:
            rows = fx.table_rows(_many_rows(count, index))
            fastavro.writer(
                sink, parsed_schema("released_crowd"), rows, codec=codec, sync_interval=interval
            )
        sources.append((path.read_bytes(), str(path)))
    together = rc.parse_crowd_tables(sources)
    one_by_one = [rc.parse_crowd_table(data, name) for data, name in sources]
    assert together is not None and [len(t) for t in together] == [1, 300, 0, 57]
    assert together == one_by_one
    types = lambda tables: [type(v) for t in tables for r in t for v in r.values()]  # noqa: E731
    assert types(together) == types(one_by_one)


def test_tables_that_do_not_decode_together_are_left_to_the_one_table_reader(
    made: Path,
) -> None:
    """Any table the numpy decoder cannot vouch for (another writer schema, no Avro, cut short,
    a block's count that lies) makes parse_crowd_tables give None, never other rows."""
    import fastavro

    from schemas import schema_json

    good = [(p.read_bytes(), str(p)) for p in sorted((made / "crowds").iterdir())]
    assert rc.parse_crowd_tables(good) is not None
    rows = fx.table_rows(rc.parse_crowd_table(*good[0]))
    schema = json.loads(json.dumps(schema_json("released_crowd")))
    schema["fields"] = [*reversed(schema["fields"])]
    other = tmp = made / "other.avro"
    with tmp.open("wb") as sink:
        fastavro.writer(sink, fastavro.parse_schema(schema), rows)
    data = good[0][0]
    header_end = data.index(data[-16:]) + 16  # the sync marker closes the header
    count_lies = bytearray(data)
    count_lies[header_end] += 2  # the first block's count (a zigzag varint) one higher
    for bad in (other.read_bytes(), b"\x00" * 40, data[:-3], bytes(count_lies)):
        assert rc.parse_crowd_tables([*good, (bad, "bad")]) is None


@pytest.mark.parametrize("per_read", [1, 2, 32])
def test_tables_read_in_groups_are_refused_for_the_first_problem_in_order(
    made: Path, monkeypatch: pytest.MonkeyPatch, per_read: int
) -> None:
    """The verifying pass reads tables a few at a time; what it refuses and the line it says
    are those of the first table in order that is wrong, whatever the group size."""
    monkeypatch.setattr(rel, "TABLES_PER_READ", per_read)
    tables = sorted((made / "crowds").iterdir())
    assert len(tables) >= 3
    _rewrite(tables[1], lambda rows: [{**row, "instance": 1} for row in rows])
    tables[2].write_bytes(b"\x00" * 40)
    _refused(made, tables[1].name, "has instance 1")
    data = tables[1].read_bytes()
    tables[1].write_bytes(b"\x00" * 40)
    tables[2].write_bytes(data)  # the second wrong table stated first: it is named
    _refused(made, tables[1].name, "truncated or grown", recommit=False)
    tables[1].unlink()
    _refused(made, tables[1].name, "missing", recommit=False)


# Crowd keys with what JSON escapes, non-ASCII, empty strings and null crowd IDs.
_ODD = ["a", "", 'q"uote', "back\\slash", "line\nfeed", "\x00", "ç\u00e9", "\u2603", "z"]


def test_a_table_s_buckets_are_crowd_bucket_of_every_crowd() -> None:
    """crowd_table_buckets (Arrow-joined keys, each distinct key hashed once) gives exactly
    crowd_bucket per crowd: plain keys, keys JSON escapes, null crowd IDs, repeated keys."""
    import random

    import pyarrow as pa

    rng = random.Random(7)
    for trial in range(40):
        plain = trial % 2 == 0  # half the tables without a character JSON escapes
        words = [w for w in _ODD if not plain or w.isprintable() and '"' not in w and "\\" not in w]
        keys = [
            (
                rng.choice(words),
                rng.choice(words),
                None if rng.random() < 0.2 else rng.choice(words),
            )
            for _ in range(rng.randrange(0, 60))
        ]
        keys += keys[: rng.randrange(len(keys) + 1)]  # repeated keys
        table = pa.table({name: pa.array([k[i] for k in keys], pa.string())
                          for i, name in enumerate(rc.CROWD_KEY_FIELDS)})  # fmt: skip
        buckets = rng.choice([1, 3, 16, 1 << 16])
        got = rc.crowd_table_buckets(rc.CrowdColumns(table), buckets).tolist()
        assert got == [crowd_bucket(*key, buckets) for key in keys]


def _stem_table(rng, key: BucketKey, buckets: int, threshold: int, count: int) -> list[dict]:
    """A valid crowd table of stem ``key``: crowds that hash to its bucket, in crowd order."""
    from schemas.release.crowd_buckets import crowd_order

    crowds: dict[tuple, dict] = {}
    while len(crowds) < count:
        channel, recipe_id = rng.choice(_ODD), rng.choice(_ODD)
        crowd_id = None if rng.random() < 0.1 else rng.choice(_ODD) + str(rng.randrange(50))
        if crowd_bucket(channel, recipe_id, crowd_id, buckets) != key.bucket:
            continue
        released = rng.random() < 0.8
        crowds[crowd_order(channel, recipe_id, crowd_id)] = {
            "window_start_ms": key.window_start,
            "window_end_ms": key.window_start + rng.choice([1, fx.DAY_MS]),
            "instance": key.instance,
            "channel": channel,
            "recipe_id": recipe_id,
            "crowd_id": crowd_id,
            "status": "released" if released else "withheld",
            "respondents_released": rng.randrange(threshold, 10**10 + 1) if released else None,
            "messages_released": rng.randrange(2**40) if released else 0,
        }
    return [crowds[order] for order in sorted(crowds)]


def _spoil(
    rng, rows: list[dict], key: BucketKey, buckets: int, threshold: int, kind: int
) -> list[dict]:
    """One row (or the order) of a valid table made wrong in way ``kind`` (of 11) of those a
    check refuses."""
    index = rng.randrange(len(rows))
    row = rows[index] = dict(rows[index])
    released = row["status"] == "released"
    if kind == 0:
        row["window_start_ms"] += rng.choice([-1, 1])
    elif kind == 1:
        row["window_end_ms"] = row["window_start_ms"] - rng.randrange(2)
    elif kind == 2:
        row["instance"] += 1
    elif kind == 3 and buckets > 1:  # moved in from another bucket
        while (
            crowd_bucket(row["channel"], row["recipe_id"], row["crowd_id"], buckets) == key.bucket
        ):
            row["crowd_id"] = (row["crowd_id"] or "") + "x"
    elif kind == 4 and released:
        row["respondents_released"] = rng.choice([None, -1, 10**10 + 1, threshold - 1])
    elif kind == 5:
        row["messages_released"] = -1 if released else 1
    elif kind == 6 and not released:
        row["respondents_released"] = 0
    elif kind == 7 and len(rows) > 1:
        other = rng.randrange(len(rows))
        if other != index:
            rows[index], rows[other] = rows[other], rows[index]
    elif kind == 8:
        rows.insert(index, dict(row))  # listed twice
    elif kind == 9:
        row["status"] = "withheld" if released else "released"
    else:
        row["crowd_id"] = None if row["crowd_id"] else ""
    return rows


def test_tables_checked_by_columns_are_refused_and_summed_as_row_by_row() -> None:
    """crowd_table_totals (the verifying pass's check, column by column over many tables)
    accepts every valid table with the totals the row-by-row check gives, and accepts no table
    the row-by-row check refuses (each of those is then checked row by row, which says why):
    random valid tables and tables spoiled in each way a check refuses, in groups."""
    import io
    import random

    import fastavro

    from schemas import parsed_schema

    rng = random.Random(11)
    refused = accepted = spoiled_tables = 0
    for _ in range(150):
        buckets, threshold = rng.choice([1, 2, 4]), rng.choice([0, 2, 5])
        instance = rng.choice([0, 3])
        parameters = {"crowd_buckets": buckets, "crowd_threshold": threshold}
        keys, tables, valid = [], [], []
        for table in range(rng.randrange(2, 6)):
            key = BucketKey(fx.T0 + table * fx.DAY_MS, instance, rng.randrange(buckets))
            rows = _stem_table(rng, key, buckets, threshold, rng.randrange(0, 12))
            spoiled = rows and rng.random() < 0.5
            if spoiled:
                rows = _spoil(rng, rows, key, buckets, threshold, spoiled_tables % 11)
                spoiled_tables += 1
            keys.append(key)
            tables.append(rows)
            valid.append(not spoiled)
        sources = []
        for index, rows in enumerate(tables):
            sink = io.BytesIO()
            fastavro.writer(sink, parsed_schema("released_crowd"), fx.table_rows(rows))
            sources.append((sink.getvalue(), f"t{index}"))
        columns = rc.parse_crowd_table_columns(sources)
        assert columns is not None and columns == tables
        stated = rng.choice([None, instance])  # the commit's instance, when it states one
        checked = rc.crowd_table_totals(columns, keys, parameters, stated)
        for key, rows, is_valid, totals in zip(keys, tables, valid, checked, strict=True):
            try:
                expected = rc._row_totals("t", key, rows, buckets, threshold, stated)
            except rel.ReleaseError:
                assert totals is None
                refused += 1
                continue
            assert totals == expected and (totals is not None or not is_valid)
            accepted += 1
    assert refused > 100 and accepted > 300


def test_a_table_s_columns_count_rows_as_its_crowd_dicts_do() -> None:
    """CrowdColumns.count_by: rows per distinct values, nulls included, as a Counter of the rows."""
    import random
    from collections import Counter

    import pyarrow as pa

    rng = random.Random(3)
    rows = _stem_table(rng, BucketKey(fx.T0, 0, 0), 1, 0, 40)
    names = ("recipe_id", "window_start_ms", "window_end_ms", "status", "crowd_id")
    table = pa.table({name: [row[name] for row in rows] for name in rc.CROWD_FIELDS})
    crowds = rc.CrowdColumns(table)
    for width in range(1, len(names) + 1):
        expected = Counter(tuple(row[name] for name in names[:width]) for row in rows)
        assert crowds.count_by(names[:width]) == dict(expected)
    assert crowds.rows() == rows and crowds == rows and list(crowds) == rows

"""What crosses the shuffler's groupings holds its crowds packed (shuffle_spill.pack_texts,
shuffle_steps.draft_row): a bucket's element has as many Python objects with 2,000 crowds as
with 2, so a runner that keeps grouped values decoded (FnApiRunner) holds memory that does not
grow with the number of crowds."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from privacy.noise import seeded_random_source
from tests.transforms import report_factory as rf
from transforms.shuffler import decide, report_rows, spill, steps
from transforms.shuffler import shuffle as sh

TEXTS = [
    spill.crowd_text("ch", "r@1", None),
    spill.crowd_text("ch", "r@1", 'ü "quoted" \\ x'),
    spill.crowd_text("ch,2", "r@2", "\u0000 nul and \n newline"),
]


@pytest.mark.parametrize("texts", [[], TEXTS[:1], TEXTS, TEXTS * 1000])
def test_packed_texts_come_back_in_order(texts: list[str]) -> None:
    packed = spill.pack_texts(texts)
    assert isinstance(packed, bytes)
    assert spill.unpack_texts(packed) == texts
    assert [spill.crowd_of_text(text) for text in spill.unpack_texts(packed)] == [
        spill.crowd_of_text(text) for text in texts
    ]


def test_a_draft_row_gives_back_every_kind_of_decision_and_its_manifest() -> None:
    deletion = report_rows.DeletionParameters(1.0, 1e-3)
    source = seeded_random_source(5)
    decisions = [decide.decide_crowd(n, 3, deletion, source) for n in range(0, 60)]
    decisions += [
        decide.CrowdDecision(40, 3, status, reason, 38 if reason is None else 0)
        for status, reason in steps.OUTCOMES
    ]
    key = (1_704_067_200_000, 0, "ch", "r@1", None)
    for messages_in, decision in enumerate(decisions):
        row = np.asarray([steps.draft_row(decision, messages_in)], dtype=np.int64)
        back, messages_back = steps.draft_decision(row.tolist()[0])
        assert (back, messages_back) == (decision, messages_in)
        assert steps.manifest_record(key, 9, back, messages_back, 1, 2) == steps.manifest_record(
            key, 9, decision, messages_in, 1, 2
        )


@pytest.mark.parametrize(
    "values", [np.zeros(0, np.int64), np.arange(5) - 2, np.arange(12).reshape(4, 3) * 10**12]
)
def test_packed_ints_come_back_with_their_shape(values: np.ndarray) -> None:
    back = spill.unpack_ints(spill.pack_ints(values))
    assert back.dtype == np.int64 and back.shape == values.shape
    assert np.array_equal(back, values)


def _objects(value: Any) -> int:
    """Python objects reachable from ``value`` (a numpy array or a bytes blob counts once)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, type):
            continue
        seen.add(id(item))
        if not isinstance(item, np.ndarray):
            stack.extend(gc.get_referents(item))
    return len(seen)


def _decide(crowds: int) -> list[Any]:
    texts = sorted(
        spill.crowd_text(rf.CHANNEL, rf.RECIPE, f"c{index:05d}") for index in range(crowds)
    )
    task = spill.ShardTask(0, 1, spill.Piece("list.arrow", 0, 1, 1, "", 0))
    counts = [
        spill.ShardCount(
            task._replace(shard=shard),
            spill.pack_texts(texts),
            spill.pack_ints(np.full(crowds, 3 + shard)),
            spill.pack_ints(np.full(crowds, 4)),
            spill.pack_ints(np.zeros(crowds, dtype=np.int64)),
        )
        for shard in range(2)
    ]
    step = sh.Decide(sh.ShuffleConfig(rules=rf.rules(), crowd_threshold=4))
    step.setup()
    return list(step.process(((1_704_067_200_000, 0, 3), counts)))


def test_decide_emits_as_many_objects_for_2000_crowds_as_for_2() -> None:
    few, many = _decide(2), _decide(2000)
    assert _objects(few) == _objects(many)
    (draft,) = [output.value[1] for output in many if getattr(output, "tag", None) == "draft"]
    assert spill.unpack_ints(draft.decisions).shape == (2000, len(steps.DRAFT_COLUMNS))
    tasks = [output[1] for output in many if isinstance(output, tuple)]
    texts = [spill.crowd_text(rf.CHANNEL, rf.RECIPE, f"c{index:05d}") for index in range(2000)]
    # Every crowd has 3 + 4 respondents over the two shards: released, and both shards hold it.
    assert [task.task.shard for task in tasks] == [0, 1]
    assert all(spill.unpack_texts(task.crowds) == texts for task in tasks)

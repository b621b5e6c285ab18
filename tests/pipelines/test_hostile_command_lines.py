"""Hostile command lines found by trying the ``esa`` CLI as a hostile user would (issue #11):
each is refused before any work with exit status 2 and exactly one ``esa <command>: error:``
line. Same placeholders and checks as tests/pipelines/test_bad_command_lines.py."""

from __future__ import annotations

import pytest

from tests.pipelines.test_bad_command_lines import (
    ANALYZE,
    SHUFFLE,
    SIMULATE,
    places,  # noqa: F401 - the fixture
)
from tests.pipelines.test_bad_command_lines import (
    test_bad_command_line_is_one_line_and_exit_2 as _check,
)

DELETION = ["--deletion-epsilon", "1"]
CASES = [
    # A one-value flag given twice is refused, not last-one-wins.
    (SHUFFLE + ["--crowd-threshold", "5", "--crowd-threshold=100000"], "more than once"),
    (SIMULATE + ["--respondents", "7"], "more than once"),
    (ANALYZE + ["--output", "{out}2"], "more than once"),
    # Beam's runner flags with values its runner would crash on.
    (SHUFFLE + ["--direct_num_workers=-1"], "--direct_num_workers"),
    # Randomized deletion whose offset (2/eps) log(2/delta) no float holds.
    (SHUFFLE + DELETION + ["--deletion-delta=1e-320"], "beyond floating point"),
    (SHUFFLE + ["--deletion-epsilon=5e-324", "--deletion-delta", "1e-6"], "beyond floating"),
    (ANALYZE + DELETION + ["--deletion-delta", "1e-320"], "beyond floating point"),
    # Outputs that cannot be created although os.access says yes (root), or that sit inside or
    # around an input.
    (["shuffle", "--input", "{input}", "--output", "/proc/esa-release"], "cannot be created"),
    (SHUFFLE + ["--private-output", "/proc/esa-private"], "cannot be created"),
    (["shuffle", "--input", "{input}", "--output", "{input}/../out"], "must not be inside"),
    (["analyze", "--input", "{dir}", "--output", "{dir}/analysis"], "must not be inside"),
    (SHUFFLE + ["--private-output", "{out}/private"], "must not be inside"),
    (
        ["shuffle", "--input", "{input}", "--output", "{dir}/r", "--private-output", "{dir}"],
        "inside",
    ),
    # The last window of a simulation starting on 9999-12-31 would end in year 10000.
    (SIMULATE + ["--start", "9999-12-31"], "year 9999"),
]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=[" ".join(c[0][5:]) for c in CASES])
def test_hostile_command_line_is_one_line_and_exit_2(argv, words, places, tmp_path, capsys):  # noqa: F811
    _check(argv, words, places, tmp_path, capsys)

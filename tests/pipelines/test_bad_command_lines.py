"""Bad command lines: each is refused before any work with exit status 2 and exactly one line on
stderr, ``esa <command>: error: ...`` (issue #11: unknown flags are errors; edges that cannot be
represented are refused; one line, never a traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.commandline.main import COMMANDS, main

TOO_BIG = str(2**63)

# (command line, words the error line must hold). {input}: a glob matching one file; {file}: an
# existing file; {out}: a fresh output directory; {missing}: a path that does not exist.
SHUFFLE = ["shuffle", "--input", "{input}", "--output", "{out}"]
SIMULATE = ["simulate", "--output", "{out}", "--respondents", "100"]
ANALYZE = ["analyze", "--input", "{dir}", "--output", "{out}"]
RUN = ["run", "--output", "{out}"]
CASES = [
    # Unknown flags, misspellings, abbreviations and leftovers.
    (SHUFFLE + ["--crowd-treshold", "100000"], "unrecognized arguments: --crowd-treshold"),
    (SHUFFLE + ["--crowd", "5"], "unrecognized arguments: --crowd"),
    (SHUFFLE + ["--analyze_input", "x"], "unrecognized arguments: --analyze_input"),
    (SHUFFLE + ["stray"], "unrecognized arguments: stray"),
    (SHUFFLE + ["--runner=FnApiRunner", "--no-such-beam-flag"], "--no-such-beam-flag"),
    (RUN + ["--direct_running_mode=everywhere"], "invalid choice"),
    (RUN + ["--direct_num_workers", "two"], "invalid int value"),
    (SIMULATE + ["--respondent", "5"], "unrecognized arguments"),
    (ANALYZE + ["--deletion-eps", "1"], "unrecognized arguments"),
    (RUN + ["--recipes", "x"], "unrecognized arguments: --recipes"),
    (["experiment", "all", "--output", "{out}", "--fast"], "unrecognized arguments: --fast"),
    (["recipes", "list", "--all"], "unrecognized arguments: --all"),
    # Thresholds and counts.
    (SHUFFLE + ["--crowd-threshold", TOO_BIG], "--crowd-threshold"),
    (SHUFFLE + ["--crowd-threshold", "0"], "--crowd-threshold"),
    (SHUFFLE + ["--crowd-threshold", "-3"], "--crowd-threshold"),
    (SHUFFLE + ["--crowd-threshold", "1e300"], "invalid int value"),
    (SHUFFLE + ["--crowd-threshold", "lots"], "invalid int value"),
    (SHUFFLE + ["--instance", "-1"], "--instance"),
    (SHUFFLE + ["--messages-per-file", "0"], "--messages-per-file"),
    (SHUFFLE + ["--batch-records", TOO_BIG], "--batch-records"),
    (SHUFFLE + ["--watch-interval", "0"], "--watch-interval"),
    (RUN + ["--crowd-threshold", TOO_BIG], "--crowd-threshold"),
    (RUN + ["--respondents", "0"], "--respondents"),
    (RUN + ["--respondents", str(2**32)], "--respondents"),
    (RUN + ["--instances", "0"], "--instances"),
    (RUN + ["--parallel-shuffles", "0"], "--parallel-shuffles"),
    (SIMULATE[:3] + ["--respondents", TOO_BIG], "--respondents"),
    (SIMULATE + ["--seed", "-1"], "--seed"),
    (SIMULATE + ["--rounds", "0"], "--rounds"),
    (SIMULATE + ["--codec", "lzo"], "invalid choice"),
    (SIMULATE + ["--compression-level", "10"], "--compression-level"),
    (["experiment", "all", "--output", "{out}", "--workers", "0"], "--workers"),
    # Randomized deletion.
    (SHUFFLE + ["--deletion-epsilon", "1"], "go together"),
    (SHUFFLE + ["--deletion-epsilon", "nan", "--deletion-delta", "1e-6"], "--deletion-epsilon"),
    (SHUFFLE + ["--deletion-epsilon", "1", "--deletion-delta", "1.5"], "--deletion-delta"),
    (RUN + ["--deletion-delta", "1e-6"], "go together"),
    (ANALYZE + ["--deletion-epsilon", "inf", "--deletion-delta", "1e-6"], "--deletion-epsilon"),
    (ANALYZE + ["--failure-probability", "1"], "--failure-probability"),
    (ANALYZE + ["--postprocessing", "round"], "invalid choice"),
    # Windows and event times Avro timestamps cannot hold.
    (SHUFFLE + ["--window", "99999999999d"], "--window"),
    (SHUFFLE + ["--window", "3000000d"], "year 9999"),
    (SHUFFLE + ["--window", "1 week"], "duration"),
    (SHUFFLE + ["--window", "0s"], "positive"),
    (SIMULATE + ["--start", "9999-12-31T12:00:00"], "year 9999"),
    (SIMULATE + ["--start", "2024-01-01", "--rounds", "2000000000"], "year 9999"),
    (SIMULATE + ["--start", "1969-12-31"], "1970"),
    (SIMULATE + ["--start", "yesterday"], "ISO 8601"),
    # Paths.
    (["shuffle", "--input", "{input}", "--output", "{file}"], "not a directory"),
    (["shuffle", "--input", "{input}", "--output", "{file}/release"], "not a directory"),
    (["shuffle", "--input", "{missing}/*.avro", "--output", "{out}"], "matches no file"),
    (["shuffle", "--input", "{input}"], "--output"),
    (["simulate", "--output", "{file}", "--respondents", "100"], "not a directory"),
    (["analyze", "--output", "{out}"], "--input is required"),
    (["analyze", "--input", "{missing}", "--output", "{out}"], "no such file"),
    (ANALYZE + ["--truth", "{missing}"], "no such file"),
    (["analyze", "--input", "{dir}", "--output", "{file}"], "not a directory"),
    (["run", "--output", "{file}"], "not a directory"),
    (["run", "--output", "{file}/sub/dir"], "not a directory"),
    # Recipes, experiments and commands that do not exist.
    (SIMULATE + ["--recipe", "no_such_recipe"], "no shipped recipe"),
    (RUN + ["--recipe", "no_such_recipe"], "no shipped recipe"),
    (["experiment", "tables", "--output", "{out}"], "invalid choice"),
    (["experiment", "all"], "--output"),
    (["recipes"], "required"),
    (["privacy"], "required"),
    (["no-such-command"], "invalid choice"),
    ([], "required"),
]


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "r.avro").write_bytes(b"")
    (tmp_path / "plain.txt").write_text("a file\n")
    (tmp_path / "release").mkdir()
    return {
        "input": str(tmp_path / "reports" / "*.avro"),
        "file": str(tmp_path / "plain.txt"),
        "out": str(tmp_path / "out"),
        "dir": str(tmp_path / "release"),
        "missing": str(tmp_path / "missing"),
    }


def _prefix(argv: list[str]) -> str:
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    return f"esa {command}: error: " if command in COMMANDS else "esa: error: "


@pytest.mark.parametrize(
    ("argv", "words"), CASES, ids=[" ".join(c[0][:1] + c[0][5:]) for c in CASES]
)
def test_bad_command_line_is_one_line_and_exit_2(argv, words, places, tmp_path, capsys):
    argv = [arg.format(**places) for arg in argv]
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, captured
    assert len(lines) == 1, lines
    assert lines[0].startswith(_prefix(argv)), lines
    assert words in lines[0]
    assert "Traceback" not in captured.err
    # Refused before any work: nothing was written.
    assert not (tmp_path / "out").exists()


def test_the_installed_command_refuses_a_misspelled_flag_quietly(places):
    # A real process: what a user sees, including what Beam logs while it is imported.
    argv = ["shuffle", "--input", places["input"], "--output", places["out"]]
    completed = subprocess.run(
        [sys.executable, "-m", "pipelines.commandline.main", *argv, "--crowd-treshold", "100000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        "esa shuffle: error: unrecognized arguments: --crowd-treshold 100000"
    ]
    assert completed.stdout == ""

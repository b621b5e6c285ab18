"""``esa --help`` and every ``esa COMMAND --help`` start in well under 1.5 s: their texts come from
help_texts.py, without importing the command (Beam alone takes seconds); the texts are the live
parsers' (regenerate with ``python -m pipelines.commandline.write_help_texts``)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from pipelines.commandline.help_texts import HELP
from pipelines.commandline.main import COMMANDS, render_help

STARTUP_CPU_SECONDS = 1.5


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_cached_help_is_the_live_help(command):
    assert HELP["" if command is None else command] == render_help(command), (
        "help_texts.py is stale: python -m pipelines.commandline.write_help_texts"
    )


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_starts_fast_and_imports_no_beam(command):
    argv = ["--help"] if command is None else [command, "--help"]
    code = (
        "import sys; from pipelines.commandline.main import main; "
        f"assert main({argv!r}) == 0; "
        "assert 'apache_beam' not in sys.modules, 'Beam imported for --help'; "
        "assert 'numpy' not in sys.modules, 'numpy imported for --help'"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: esa")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # CPU time, not wall time: the machine may be busy with other work.
    assert cpu < STARTUP_CPU_SECONDS

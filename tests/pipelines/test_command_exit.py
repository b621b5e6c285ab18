"""pipelines/commandline/main.py: ``entry``, the ``esa`` process, ends without the interpreter's
teardown, yet with what exit does: its status, every line written (to a pipe, block-buffered),
the threads that are not daemons finished (an executor never shut down told to stop, as at exit)
and the ``atexit`` functions run."""

from __future__ import annotations

import subprocess
import sys

_COMMAND = r"""
import atexit, sys, threading, time
from pipelines.commandline import main
atexit.register(lambda: print("atexit ran"))
returned = threading.Event()  # main has returned: the thread still runs
command = main.main
def main_then_signal(*args):
    try:
        return command(*args)
    finally:
        returned.set()
main.main = main_then_signal
def late():
    returned.wait()
    time.sleep(0.2)
    print("thread finished")
threading.Thread(target=late).start()
import concurrent.futures
idle = concurrent.futures.ThreadPoolExecutor(1)  # never shut down: its worker waits for work
idle.submit(int).result()
sys.argv = ["esa", *sys.argv[1:]]
main.entry()
print("never printed")
"""


def _esa(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _COMMAND, *argv], capture_output=True, text=True, timeout=60
    )


def test_a_command_ends_with_its_status_its_output_its_threads_and_atexit():
    done = _esa("recipes", "list", "--names")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "image_grid_onehot" in lines  # the command's own output, flushed
    assert lines[-2:] == ["thread finished", "atexit ran"]  # the thread, then atexit
    assert "never printed" not in done.stdout


def test_a_refused_command_keeps_its_one_line_and_status_2():
    done = _esa("recipes", "check", "no_such_recipe", "--respondents", "10")
    assert done.returncode == 2
    assert len([line for line in done.stderr.splitlines() if "error" in line]) == 1
    assert done.stdout.splitlines()[-2:] == ["thread finished", "atexit ran"]


def test_argparse_exits_the_ordinary_way():
    done = _esa("recipes", "--no-such-flag")
    assert done.returncode == 2 and "never printed" not in done.stdout
    assert done.stdout.splitlines()[-2:] == ["thread finished", "atexit ran"]

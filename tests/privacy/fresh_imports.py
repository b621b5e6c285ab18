"""Whether code run in a fresh interpreter imports a module: the accounting's promise that a
crowd's privacy report does not load scipy's heavy parts."""

from __future__ import annotations

import subprocess
import sys


def imports_module(code: str, module: str) -> bool:
    """Run ``code`` in a fresh interpreter (it must succeed); whether ``module`` was imported."""
    probe = f"{code}\nimport sys\nprint({module!r} in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    answer = result.stdout.strip()  # the probe's line and nothing else
    assert answer in ("True", "False"), result.stdout
    return answer == "True"

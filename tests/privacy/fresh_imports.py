"""Whether code run in a fresh interpreter imports a module: the accounting's promise that a
crowd's privacy report does not load scipy's heavy parts."""

from __future__ import annotations

import subprocess
import sys

# The analyzer's privacy report of a crowd: the variation-ratio and FMT bounds of the shipped
# one-hot and binary randomized-response recipes.
ACCOUNTING_A_CROWD = (
    "from privacy.accounting import randomizer_central, fmt_numerical_epsilon\n"
    "from schemas.recipes import load_recipe\n"
    "for name in ('image_grid_onehot', 'small_asymmetric_one_hot', 'small_binary_rr'):\n"
    "    randomizer_central(load_recipe(name).build_randomizer(), 123_457, 5e-8)\n"
    "fmt_numerical_epsilon(2.0, 1000, 1e-6)\n"
)


def imports_module(code: str, module: str) -> bool:
    """Run ``code`` in a fresh interpreter (it must succeed); whether ``module`` was imported."""
    probe = f"{code}\nimport sys\nprint({module!r} in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    answer = result.stdout.strip()  # the probe's line and nothing else
    assert answer in ("True", "False"), result.stdout
    return answer == "True"

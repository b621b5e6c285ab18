"""privacy.accounting.binomial returns scipy.stats.binom's floats bit for bit (the bounds that
used scipy.stats.binom must not move), on a grid with every edge rv_discrete treats apart."""

import numpy as np
import pytest
from scipy import stats

from privacy.accounting import binomial
from tests.privacy.fresh_imports import ACCOUNTING_A_CROWD, imports_module

N = np.array([0, 1, 2, 3, 7, 40, 999, 10**6, 10**9 + 7, 2.5, -1, np.nan])
P = np.array([0.0, 1e-300, 1e-9, 0.1, 0.5, 0.73, 1.0 - 1e-12, 1.0, -0.1, 1.5, np.nan])
K = np.array(
    [-np.inf, -3, -1, -0.5, 0, 0.5, 1, 2, 3, 6.9, 7, 39, 40, 41, 500, 999, 4e5, 5e8, 1e9 + 7,
     2e9, np.inf, np.nan]
)  # fmt: skip
Q = np.array([0.0, 1e-300, 1e-17, 1e-9, 0.025, 0.5, 0.975, 1 - 1e-12, 1.0, -0.1, 1.1, np.nan])


def _grid(x):
    return np.meshgrid(x, N, P, indexing="ij")


def _same(ours, theirs):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    # bit for bit, nan included (and -0.0 told from 0.0)
    assert np.array_equal(ours.view(np.int64), theirs.view(np.int64))


@pytest.mark.parametrize("name", ["pmf", "cdf", "sf"])
def test_point_functions_match_scipy_bit_for_bit(name):
    k, n, p = _grid(K)
    with np.errstate(all="ignore"):
        _same(getattr(binomial, name)(k, n, p), getattr(stats.binom, name)(k, n, p))
        # scalars, and integer arguments as the callers pass them
        for k1, n1, p1 in [(3, 7, 0.5), (0, 0, 0.3), (-1, 5, 0.2), (5, 5, 1.0), (2.0, 9, 0.0)]:
            ours, theirs = (
                getattr(binomial, name)(k1, n1, p1),
                getattr(stats.binom, name)(k1, n1, p1),
            )
            assert type(ours) is type(theirs)
            _same(ours, theirs)
        ints = np.arange(-2, 12)
        _same(getattr(binomial, name)(ints, 10, 0.3), getattr(stats.binom, name)(ints, 10, 0.3))


@pytest.mark.parametrize("name", ["ppf", "isf"])
def test_quantiles_match_scipy_bit_for_bit(name):
    q, n, p = _grid(Q)
    with np.errstate(all="ignore"):
        _same(getattr(binomial, name)(q, n, p), getattr(stats.binom, name)(q, n, p))
        frozen, ours = stats.binom(41, 0.3), binomial.Binomial(41, 0.3)
        for value in (0.0, 1e-12, 0.4, 1.0):
            _same(getattr(ours, name)(value), getattr(frozen, name)(value))


def test_around_gives_the_four_calls_floats_bit_for_bit():
    """binomial.around: pmf at k-1, k, k+1 and sf at k, the same floats as the calls themselves,
    on the integer points of valid laws (its own pass) and on the whole grid (invalid laws,
    fractions, infinities and NaN: the calls' own path)."""

    def calls(k, n, p):
        with np.errstate(all="ignore"):
            masses = [binomial.pmf(k + shift, n, p) for shift in (-1.0, 0.0, 1.0)]
            return np.stack(np.broadcast_arrays(*masses)), np.asarray(binomial.sf(k, n, p))

    k, n, p = _grid(K)
    valid = (
        (n >= 0) & (n == np.round(n)) & (p >= 0) & (p <= 1) & np.isfinite(k) & (k == np.floor(k))
    )
    for arguments in ((k, n, p), (k[valid], n[valid], p[valid])):
        with np.errstate(all="ignore"):
            masses, tails = binomial.around(*arguments)
        expected_masses, expected_tails = calls(*arguments)
        _same(masses, expected_masses)
        _same(tails, expected_tails)
    # as the variation-ratio reduction calls it: one probability for every law
    clones = np.arange(-1.0, 60.0)
    first = np.clip(np.floor((clones + 1.0) * 0.37), 0.0, clones + 1.0) - 1.0
    masses, tails = binomial.around(first, np.maximum(clones, 0.0), 0.42)
    expected_masses, expected_tails = calls(first, np.maximum(clones, 0.0), 0.42)
    _same(masses, expected_masses)
    _same(tails, expected_tails)


def test_frozen_law_matches_scipy():
    ours, theirs = binomial.Binomial(999, 0.02), stats.binom(999, 0.02)
    x = np.arange(-3, 60, dtype=np.float64)
    for name in ("pmf", "cdf", "sf"):
        _same(getattr(ours, name)(x), getattr(theirs, name)(x))


def test_accounting_a_crowd_imports_no_scipy_stats():
    """The point of the module: the shuffle bounds run without importing scipy.stats."""
    code = (
        "from privacy.accounting.variation_ratio import ReducedPair, variation_ratio_parameters\n"
        "from privacy.accounting.shuffle import fmt_numerical_delta\n"
        "pair = ReducedPair(variation_ratio_parameters('generic', 2.0), 1000, 1e-12)\n"
        "pair.delta(1.0)\n"
        "fmt_numerical_delta(2.0, 1000, 1.0)\n"
    )
    assert not imports_module(code, "scipy.stats")


def test_accounting_a_crowd_and_solving_a_recipe_import_only_scipy_special_ufuncs():
    """The analyzer's privacy report of a crowd (the variation-ratio and FMT bounds, binary
    randomized response) and a recipe whose epsilon_local is solved load scipy.special's ufuncs
    without running scipy.special's package __init__ (privacy.accounting.special_functions)."""
    code = ACCOUNTING_A_CROWD + (
        "load_recipe('image_grid_sealed')\n"
        "assert 'scipy.special._ufuncs' in __import__('sys').modules\n"
    )
    assert not imports_module(code, "scipy.special")
    # nor any other scipy package's __init__ an extension of scipy.special imports from
    assert not imports_module(code, "scipy.linalg")
    assert not imports_module(code, "scipy._lib._array_api")


def test_scipy_special_imported_after_the_ufuncs_alone_is_whole_and_shares_them():
    """After the ufuncs were loaded alone, ``import scipy.special`` runs its package __init__
    as usual: its ufuncs are the objects already loaded (the same floats), and the rest of it
    is there (logsumexp, which lives outside the extension)."""
    import subprocess
    import sys

    code = (
        "from privacy.accounting.special_functions import ufuncs\n"
        "alone = ufuncs()\n"
        "import scipy.special\n"
        "assert scipy.special._ufuncs is alone and scipy.special.expit is alone.expit\n"
        "assert scipy.special.logsumexp([0.0, 0.0]) > 0.69\n"
        "assert ufuncs() is alone\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_import_without_package_inits_skips_every_package_init_on_the_way(tmp_path, monkeypatch):
    """A module whose import reaches into another package of the same root (as scipy 1.18's
    ``special._ufuncs`` reaches ``linalg``) is imported with neither package's ``__init__``
    run; the stand-ins are gone afterwards, the modules stay, and importing a package later
    runs its ``__init__``, which finds them."""
    import sys

    from privacy.accounting.special_functions import import_without_package_inits

    root = tmp_path / "esa_fake_root"
    files = {
        "__init__.py": "inits = []\n",
        "special/__init__.py": "import esa_fake_root\nesa_fake_root.inits.append('special')\n",
        "special/_ufuncs.py": "from esa_fake_root.linalg import cython_lapack\n"
        "VALUE = cython_lapack.VALUE + 1\n",
        "linalg/__init__.py": "import esa_fake_root\nesa_fake_root.inits.append('linalg')\n"
        "from esa_fake_root.linalg import cython_lapack\n",
        "linalg/cython_lapack.py": "VALUE = 41\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = import_without_package_inits("esa_fake_root.special._ufuncs")
        package = sys.modules["esa_fake_root"]
        assert module.VALUE == 42 and package.inits == []
        assert "esa_fake_root.special" not in sys.modules
        assert "esa_fake_root.linalg" not in sys.modules
        assert "linalg" not in vars(package) and "special" not in vars(package)
        lapack = sys.modules["esa_fake_root.linalg.cython_lapack"]
        import esa_fake_root.linalg  # noqa: F401 - now for real

        assert package.inits == ["linalg"] and package.linalg.cython_lapack is lapack
    finally:
        for name in [name for name in sys.modules if name.startswith("esa_fake_root")]:
            del sys.modules[name]

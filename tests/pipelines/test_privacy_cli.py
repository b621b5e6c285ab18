"""Tests of ``esa privacy`` through pipelines.commandline.main.main and the installed script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.commandline import main as cli
from privacy import accounting as acc


def run_json(capsys, *argv: str) -> dict:
    assert cli.main(["privacy", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


def test_solve_defaults_to_the_tight_bound(capsys):
    payload = run_json(
        capsys, "solve", "--epsilon-central", "1.0", "--respondents", "1914589", "--delta", "5e-8"
    )
    assert payload["bound"] == acc.VARIATION_RATIO
    assert 10.4 < payload["epsilon_local"] < 10.5  # Horse row: 9.76 with the FMT numerical bound
    assert payload["epsilon_central"] <= 1.0


def test_solve_reproduces_the_horse_table(capsys):
    payload = run_json(
        capsys, "solve", "--epsilon-central", "1.0", "--respondents", "1914589", "--delta", "5e-8",
        "--bound", "paper",
    )  # fmt: skip
    assert round(payload["epsilon_local"], 2) == 8.55
    assert payload["bound"] == acc.THEOREM_III1_EXACT
    assert payload["epsilon_central"] <= 1.0
    assert payload["target_epsilon_central"] == 1.0


def test_amplify_includes_the_numerical_bound(capsys):
    payload = run_json(
        capsys, "amplify", "--epsilon-local", "4", "--respondents", "100000", "--delta", "1e-6"
    )
    assert payload["fmt_numerical"] == pytest.approx(0.17, abs=0.003)
    assert payload["epsilon_central"] == payload["tight"]["upper"] < payload["fmt_numerical"]
    assert payload["tight"]["lower"] <= payload["tight"]["upper"]
    assert payload["bound"] == acc.VARIATION_RATIO
    assert payload["epsilon_local"] == 4.0
    assert payload["candidates"][acc.FMT_CLOSED_FORM] > payload["fmt_numerical"]


def test_amplify_one_hot_rappor_lists_every_candidate(capsys):
    payload = run_json(
        capsys,
        "amplify",
        "--epsilon-local", "8.55",
        "--respondents", "1914589",
        "--delta", "5e-8",
        "--mechanism", "one_hot_rappor",
    )  # fmt: skip
    expected = acc.amplify(8.55, 1914589, 5e-8, acc.ONE_HOT_RAPPOR)
    assert payload["epsilon_central"] == expected.epsilon
    assert set(payload["candidates"]) == set(expected.details["candidates"])


def test_solve_with_another_bound_and_mechanism(capsys):
    payload = run_json(
        capsys,
        "solve",
        "--epsilon-central", "0.5",
        "--respondents", "1000000",
        "--delta", "1e-8",
        "--mechanism", "generic",
        "--bound", "fmt_numerical",
    )  # fmt: skip
    assert payload["bound"] == acc.FMT_NUMERICAL
    assert acc.fmt_numerical_epsilon(payload["epsilon_local"], 1_000_000, 1e-8) <= 0.5 * (1 + 1e-7)


def test_tight_bounds_for_other_randomizers_and_composition(capsys):
    payload = run_json(
        capsys, "tight", "--randomizer", "k_rr", "--categories", "4", "--epsilon-local", "2",
        "--respondents", "100000", "--delta", "1e-8",
    )  # fmt: skip
    assert payload["bound"] == acc.VARIATION_RATIO
    assert payload["lower"] <= payload["upper"] <= payload["lower"] * 1.005
    payload = run_json(
        capsys, "tight", "--randomizer", "ldp_sgd", "--epsilon-local", "1",
        "--respondents", "1e6", "--delta", "1e-8", "--releases", "20",
    )  # fmt: skip
    composed = payload["composed"]
    assert composed["method"] == acc.PLD_COMPOSITION
    assert payload["upper"] < composed["epsilon"] < 20 * payload["upper"]


def test_crowd(capsys):
    payload = run_json(
        capsys, "crowd", "--epsilon-central", "1", "--epsilon-local", "4", "--delta", "1e-6"
    )
    expected = acc.min_respondents(1.0, 4.0, 1e-6, bound=acc.VARIATION_RATIO)
    assert payload["respondents"] == expected.respondents
    assert payload["epsilon_central"] <= 1.0


def test_fragments(capsys):
    payload = run_json(
        capsys,
        "fragments",
        "--epsilon-backstop", "8.55",
        "--epsilon-fragment", "7.0",
        "--fragments", "4",
        "--seen", "2",
    )  # fmt: skip
    assert payload["epsilon_local"] == acc.report_fragment_epsilon(8.55, 7.0, 2)
    assert payload["epsilon_local_one"] == acc.report_fragment_epsilon(8.55, 7.0, 1)
    assert payload["epsilon_local_all"] == acc.report_fragment_epsilon(8.55, 7.0, 4)
    assert payload["bound"] == "theorem_iv1"
    assert "epsilon_central" not in payload


def test_fragments_equal_variance_rule_and_central(capsys):
    payload = run_json(
        capsys,
        "fragments",
        "--epsilon-backstop", "8.5469",
        "--fragments", "4",
        "--respondents", "1914589",
        "--delta", "5e-8",
    )  # fmt: skip
    assert payload["epsilon_local_one"] == pytest.approx(6.94, abs=0.01)  # Table IV
    assert payload["epsilon_central"] < 1.0


def test_deletion(capsys):
    payload = run_json(
        capsys, "deletion", "--epsilon-deletion", "1", "--delta-deletion", "1e-6", "--crowds", "100"
    )
    bounds = acc.deletion_bounds(1.0, 1e-6, 100)
    assert payload["laplace_scale"] == 2.0
    assert payload["offset_records"] == acc.deletion_noise(1.0, 1e-6).offset_records
    assert payload["expected_deletions"] == bounds.expected
    assert payload["high_probability_deletions"] == bounds.high_probability


def test_gaussian(capsys):
    payload = run_json(capsys, "gaussian", "--epsilon-central", "1", "--delta", "5e-10")
    assert payload["sigma_paper"] == pytest.approx(4.66, abs=0.005)
    assert payload["sigma_exact"] == acc.gaussian_sigma_exact(1.0, 5e-10)
    assert payload["paper_sigma_is_private"] is False


def test_text_output(capsys):
    argv = ["privacy", "amplify", "--epsilon-local", "4", "--respondents", "100000"]
    assert cli.main([*argv, "--delta", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "epsilon_central = 0.118" in out and "fmt_numerical" in out
    assert "upper = 0.118" in out and "lower = " in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["amplify", "--epsilon-local", "4", "--respondents", "100000", "--delta", "1.5"], "delta"),
        (["amplify", "--epsilon-local", "x", "--respondents", "10", "--delta", "0.1"], "number"),
        (["amplify", "--epsilon-local", "4", "--respondents", "1e3.5", "--delta", "0.1"], "number"),
        (["amplify", "--epsilon-local", "4", "--respondents", "10.5", "--delta", "0.1"], "whole"),
        (["amplify", "--epsilon-local", "1", "--respondents", "1e300", "--delta", "1e-8"], "1e+10"),
        (
            ["amplify", "--epsilon-local", "1", "--respondents", str(2**63), "--delta", "1e-8"],
            "--respondents",
        ),
        (
            [
                "solve",
                "--epsilon-central",
                "1",
                "--respondents",
                "1000",
                "--delta",
                "5e-8",
                "--bound",
                "theorem_iii1_simplified",
            ],
            "more respondents",
        ),  # fmt: skip
        (
            [
                "solve",
                "--epsilon-central",
                "1",
                "--respondents",
                "1000",
                "--delta",
                "5e-8",
                "--mechanism",
                "generic",
                "--bound",
                "lemma_ii6",
            ],
            "does not apply",
        ),  # fmt: skip
        (["fragments", "--epsilon-backstop", "2", "--fragments", "4", "--seen", "5"], "--seen"),
        (
            ["fragments", "--epsilon-backstop", "2", "--fragments", "4", "--delta", "0.1"],
            "together",
        ),
        (["deletion", "--epsilon-deletion", "0", "--delta-deletion", "1e-6"], "epsilon_deletion"),
        (["gaussian", "--epsilon-central", "1", "--delta", "0.7"], "delta"),
    ],
)
def test_invalid_parameters_give_one_line_and_exit_2(capsys, argv, message):
    assert cli.main(["privacy", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("esa privacy: error:") and message in lines[0]


def test_installed_esa_script():
    # One run only: the script imports every subcommand module (Beam among them), seconds each.
    script = Path(sys.executable).with_name("esa")
    if not script.exists():
        pytest.skip(f"the esa console script is not installed next to {sys.executable}")
    argv = ["privacy", "solve", "--epsilon-central", "1.0", "--respondents", "1914589"]
    done = subprocess.run(
        [str(script), *argv, "--delta", "5e-8", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert round(json.loads(done.stdout)["epsilon_local"], 2) == 10.45

"""The result table cannot be misread: n (what ε_c is for) beside n_eff (what estimates use),
ε_c from shuffling beside ε_c with deletion, the one-message comparison named and explained,
standard errors and error bounds in their own columns (issue 27)."""

from __future__ import annotations

from pipelines.analyze import TABLE_LEGEND, summary_table


def _report(**privacy):
    return {
        "kind": "histogram", "channel": "grid", "crowd_id": None, "window_start": 0,
        "privacy": {"respondents": 1200, "respondents_effective": 1234.5, "epsilon_local_all": 3.0,
                    "epsilon_local_one": 3.0, "epsilon_central": 0.5, "bound": "variation_ratio",
                    **privacy},
        "accuracy": {"rmse": 10.0, "stderr_rms": 9.5},
    }  # fmt: skip


def test_columns_say_what_they_hold():
    deleted = _report(epsilon_central_total=1.5, deletion={"0": {"epsilon": 1.0}})
    longitudinal = {
        "kind": "longitudinal", "channel": "daily", "crowd_id": None, "round_start": 0,
        "error_bound": 733.2, "privacy": {"respondents": 5000, "epsilon_central": 0.2},
        "accuracy": {"rmse": 400.0, "stderr_rms": 170.0},
    }  # fmt: skip
    reports = {"histograms": [_report(), deleted], "longitudinal": [longitudinal], "withheld": []}
    text = summary_table({"metrics": {}}, reports)
    header, plain, with_deletion, tracked, *rest = text.splitlines()
    columns = header.split()
    for name in ("n", "n_eff", "eps_c", "eps_c+del", "1-msg", "s.e.", "bound"):
        assert name in columns
    assert "1,200" in plain and "1,234" in plain  # n and n_eff side by side, never confused
    assert plain.split()[7] == "-"  # no deletion: no composed epsilon
    assert with_deletion.split()[6:8] == ["0.5", "1.5"]
    assert tracked.split()[-1] == "733" and "bound 733" not in tracked
    assert TABLE_LEGEND.splitlines()[0] in rest
    assert "eps_c w/o frag" not in text

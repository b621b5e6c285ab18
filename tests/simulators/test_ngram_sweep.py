"""Exact-aggregate n-gram discovery (simulators/ngram_sweep.py)."""

from __future__ import annotations

import numpy as np
import pytest

from privacy.ngrams import END, NgramEncoding
from simulators import ngram_sweep as sweep


def test_local_for_cohort_inverts_the_cohort_bound():
    for target in (0.5, 1.0, 2.0):
        local = sweep.local_for_cohort(target, 10_000, 1e-6)
        assert sweep.cohort_epsilon(local, 10_000, 1e-6) <= target
        assert sweep.cohort_epsilon(local + 1e-3, 10_000, 1e-6) > target


def test_device_answers_follow_the_rule():
    known = ("a", "b")
    encoding = NgramEncoding(known, sweep.first_tree(known))
    ngrams = [[("a", "b")], [("z", "a")], []]
    answers = sweep.device_answers(ngrams, encoding, np.random.default_rng(0))
    assert encoding.ngram(int(answers[0])) == ("a", "b")
    assert 0 <= answers[1] < encoding.domain_size and 0 <= answers[2] < encoding.domain_size


def test_estimate_exact_is_unbiased_within_its_standard_error():
    values = np.repeat(np.arange(4), [5000, 3000, 1500, 500])
    estimate = sweep.estimate_exact(values, 4, 2.0, np.random.default_rng(11))
    # Theorem A.2: Var = n 4 e^eps / (e^eps - 1)^2 (+ the respondent's own bit); 5 sigma
    # (false-failure rate < 1e-6 per bucket under a fresh seed).
    sigma = np.sqrt(values.size * 4 * np.e**2 / (np.e**2 - 1) ** 2 + values.size)
    assert np.all(np.abs(estimate - [5000, 3000, 1500, 500]) < 5 * sigma)


def test_rounds_build_on_each_other_and_find_the_planted_top_ngram():
    # 2,000 devices type "x y z", 500 "x y", 1,000 "z x": the top 2-gram (x y) holds ~917 of the
    # devices' reports against <= 667 for any other (sampling sd ~ 30); epsilon 10 per round.
    typed = [["x y z"]] * 2000 + [["x y"]] * 500 + [["z x"]] * 1000
    known = ("x", "y", "z")
    rng = np.random.default_rng(5)
    points = sweep.interactive_exact(typed, known, [10.0, 10.0], [2, 0], 1, rng, 3500, 1e-6)
    assert [p.n for p in points] == [2, 3]
    assert points[0].precision == 1.0
    assert points[0].epsilon_total == pytest.approx(2 * sweep.cohort_epsilon(10.0, 3500, 1e-6))
    assert sweep.true_top(sweep.device_ngrams(typed, 2), known, 1) == [("x", "y")]
    baseline = sweep.baseline_exact(typed, known, 3, 10.0, 3, rng)
    assert baseline.n == 3 and 0 <= baseline.precision <= 1
    assert sweep.true_top(sweep.device_ngrams(typed, 3), known, 2)[0][2] in ("z", END)

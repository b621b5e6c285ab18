"""The ``values:PATH`` population: answers devices computed themselves, in respondent order."""

from __future__ import annotations

import numpy as np
import pytest

from simulators.populations import PopulationContext, build_population


def test_values_population_hands_out_the_file_in_order(tmp_path):
    path = tmp_path / "answers.npy"
    np.save(path, np.array([3, 0, 2, 2], dtype=np.int64))
    population = build_population(f"values:{path}", PopulationContext(domain_size=4), None, 0)
    assert population.size == 4
    assert population.values(1, 4).tolist() == [0, 2, 2]
    assert population.exact_counts().tolist() == [1, 0, 2, 1]
    with pytest.raises(ValueError, match="not 5"):
        build_population(f"values:{path}", PopulationContext(domain_size=4), 5, 0)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        build_population(f"values:{path}", PopulationContext(domain_size=3), None, 0)


def test_values_population_needs_a_readable_file(tmp_path):
    with pytest.raises(ValueError, match="needs a file"):
        build_population("values", PopulationContext(domain_size=4), None, 0)
    with pytest.raises(ValueError, match="cannot read"):
        build_population(f"values:{tmp_path / 'no.npy'}", PopulationContext(domain_size=4), None, 0)

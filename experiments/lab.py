"""Outcomes of scenarios and the lab that computes them with the exact aggregate simulators."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from experiments.budgets import ScenarioPrivacy, one_hot_randomizer, scenario_privacy
from experiments.scenarios import GAUSSIAN, SKETCH, ExperimentConfig, Scenario, scenario_generator
from experiments.sketch import pool_context, simulate_sketch, sketch_channel, sketch_variance
from privacy.estimators import (
    HistogramEstimate,
    count_mean_sketch_estimate,
    norm_sub,
)
from privacy.randomizers import SketchHashes
from simulators import exact
from simulators.exact import Dataset, dataset_counts

# --------------------------------------------------------------------------------------------
# Outcomes and the lab that computes them
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Outcome:
    """What one scenario gave.

    rmse: root mean square error of the unbiased estimate over all d values (the paper's RMSE);
    rmse_theory: the same from the estimator's variance formula (sqrt of the mean variance);
    rmse_projected: RMSE after the consistency projection (``norm_sub``: non-negative, summing to
    n); top_recovered: how many of the true top-K values are among the estimated top K;
    messages_per_respondent: expected messages (set bits) a respondent sends; estimate: the
    unbiased estimate (float32), kept for pictures.
    """

    scenario: Scenario
    privacy: ScenarioPrivacy
    respondents: int
    domain_size: int
    messages_per_respondent: float | None = None
    rmse: float = math.nan
    rmse_theory: float = math.nan
    rmse_projected: float = math.nan
    top_recovered: int | None = None
    seconds: float = 0.0
    estimate: np.ndarray | None = field(default=None, repr=False)

    @property
    def rmse_ratio(self) -> float:
        """RMSE over its theoretical value."""
        return self.rmse / self.rmse_theory if self.rmse_theory > 0 else math.nan


def root_mean_square(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(errors, dtype=np.float64))))


def top_values(truth: np.ndarray, top: int) -> np.ndarray:
    """Boolean mask of the ``top`` most frequent values (ties broken by value index)."""
    top = min(top, truth.size)
    mask = np.zeros(truth.size, dtype=bool)
    mask[np.lexsort((np.arange(truth.size), -truth))[:top]] = True
    return mask


def top_recovered(
    truth: np.ndarray, estimate: np.ndarray, top: int, true_top: np.ndarray | None = None
) -> int:
    """|true top-K ∩ estimated top-K|; ``true_top`` is :func:`top_values` when already known."""
    top = min(top, truth.size)
    marked = top_values(truth, top) if true_top is None else true_top
    estimated = np.argpartition(-estimate, top - 1)[:top]
    return int(np.count_nonzero(marked[estimated]))


class ExperimentLab:
    """Computes scenario outcomes with the exact aggregate simulator and caches them.

    Sketch scenarios of one dataset and split count are simulated in one pass over the sketch
    rows (the true cells are shared, as a deployment shares its hash functions). The hash
    functions are CountMeanSketch's with the experiment seed as ``hash_seed``, the seed the
    message-level check's recipes use. ``counts`` replaces a dataset's true counts (e.g. with
    those of a message-level run).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        datasets: dict[str, Dataset] | None = None,
        counts: dict[str, np.ndarray] | None = None,
    ):
        self.config = config
        self.datasets = datasets if datasets is not None else config.datasets()
        self._counts: dict[str, np.ndarray] = {}
        for key, values in (counts or {}).items():
            values = np.asarray(values)
            dataset = self.dataset(key)
            if values.shape != (dataset.domain_size,) or int(values.sum()) != dataset.respondents:
                raise ValueError(
                    f"counts of {key!r} must be {dataset.domain_size} values summing "
                    f"to {dataset.respondents}"
                )
            self._counts[key] = values.astype(np.int64)
        self._true_top: dict[str, np.ndarray] = {}
        self._privacy: dict[Scenario, ScenarioPrivacy] = {}
        self._outcomes: dict[Scenario, Outcome] = {}

    def dataset(self, key: str) -> Dataset:
        if key not in self.datasets:
            raise ValueError(f"unknown dataset {key!r}; known: {', '.join(self.datasets)}")
        return self.datasets[key]

    def counts(self, key: str) -> np.ndarray:
        if key not in self._counts:
            self._counts[key] = dataset_counts(self.dataset(key), self.config.seed)
        return self._counts[key]

    def _top(self, key: str) -> np.ndarray:
        if key not in self._true_top:
            self._true_top[key] = top_values(self.counts(key), self.config.top_items)
        return self._true_top[key]

    def privacy(self, scenario: Scenario) -> ScenarioPrivacy:
        if scenario not in self._privacy:
            self._privacy[scenario] = scenario_privacy(scenario, self.dataset(scenario.dataset))
        return self._privacy[scenario]

    def outcome(self, scenario: Scenario) -> Outcome:
        return self.run([scenario])[scenario]

    def run(self, scenarios: Iterable[Scenario]) -> dict[Scenario, Outcome]:
        """Outcomes of ``scenarios``, computing the missing ones."""
        wanted = list(dict.fromkeys(scenarios))
        sketch_groups: dict[tuple[str, int], list[Scenario]] = {}
        histograms: list[Scenario] = []
        for scenario in wanted:
            if scenario in self._outcomes:
                continue
            if not self.privacy(scenario).applicable:
                self._outcomes[scenario] = self._not_applicable(scenario)
            elif scenario.is_sketch:
                sketch_groups.setdefault((scenario.dataset, scenario.splits), []).append(scenario)
            else:
                histograms.append(scenario)
        self._outcomes.update(self._simulate_histograms(histograms))
        for (key, splits), group in sketch_groups.items():
            self._outcomes.update(self._simulate_sketches(key, splits, group))
        return {scenario: self._outcomes[scenario] for scenario in wanted}

    def _simulate_histograms(self, scenarios: list[Scenario]) -> dict[Scenario, Outcome]:
        """Non-sketch scenarios, spread over ``workers`` processes when there are several (each
        scenario has its own generator, so the split does not change any number)."""
        jobs = [
            HistogramJob(
                scenario,
                self.privacy(scenario),
                self.counts(scenario.dataset),
                self._top(scenario.dataset),
                self.config.seed,
                self.config.top_items,
            )
            for scenario in scenarios
        ]
        workers = min(self.config.workers, len(jobs))
        if workers <= 1:
            outcomes = [simulate_histogram(job) for job in jobs]
        else:
            with ProcessPoolExecutor(max_workers=workers, mp_context=pool_context()) as pool:
                outcomes = list(pool.map(simulate_histogram, jobs))
        return dict(zip(scenarios, outcomes, strict=True))

    def _not_applicable(self, scenario: Scenario) -> Outcome:
        dataset = self.dataset(scenario.dataset)
        return Outcome(scenario, self.privacy(scenario), dataset.respondents, dataset.domain_size)

    def _simulate_sketches(
        self, key: str, splits: int, scenarios: list[Scenario]
    ) -> dict[Scenario, Outcome]:
        started = time.perf_counter()
        config = self.config
        truth = self.counts(key)
        n = int(truth.sum())
        k, m = config.sketch_hashes, config.sketch_width
        hashes = SketchHashes(k, m, hash_seed=config.seed)
        rows_rng = scenario_generator(config.seed, f"{key}/sketch-rows/splits={splits}")
        channels = [sketch_channel(s, self.privacy(s), m) for s in scenarios]
        seeds = [int(scenario_generator(config.seed, s.name).integers(0, 2**63)) for s in scenarios]
        hashed = simulate_sketch(truth, hashes, channels, seeds, splits, rows_rng, config.workers)
        seconds = (time.perf_counter() - started) / len(scenarios)
        outcomes = {}
        for scenario, channel, sums in zip(scenarios, channels, hashed, strict=True):
            fragment_mean = sums / channel.fragments
            raw = count_mean_sketch_estimate(
                fragment_mean, n * splits, k, m, channel.p_one, channel.p_zero, 0.0
            )
            variance = sketch_variance(truth, k, m, channel, splits)
            estimate = HistogramEstimate(raw.estimate / splits, np.sqrt(variance), n)
            messages = None
            if scenario.mechanism == SKETCH:
                per_report = one_hot_randomizer(self.privacy(scenario), scenario.fragments, m)
                messages = splits * per_report.expected_messages_per_respondent()
            outcomes[scenario] = finish_outcome(
                HistogramJob(
                    scenario,
                    self.privacy(scenario),
                    truth,
                    self._top(key),
                    config.seed,
                    config.top_items,
                ),
                estimate,
                float(np.mean(variance)),
                messages,
                seconds,
            )
        return outcomes


@dataclass(frozen=True, eq=False)
class HistogramJob:
    """Everything one scenario's simulation needs, passed explicitly (to a worker process too):
    the scenario and its privacy parameters, the dataset's true counts and top-K mask, the
    experiment seed and K."""

    scenario: Scenario
    privacy: ScenarioPrivacy
    truth: np.ndarray
    true_top: np.ndarray
    seed: int
    top_items: int


def finish_outcome(
    job: HistogramJob,
    estimate: HistogramEstimate,
    variance: float,
    messages: float | None,
    seconds: float,
) -> Outcome:
    """The outcome of a scenario from its unbiased estimate and mean variance."""
    truth = job.truth
    projected = norm_sub(estimate).estimate
    return Outcome(
        scenario=job.scenario,
        privacy=job.privacy,
        respondents=int(truth.sum()),
        domain_size=int(truth.size),
        messages_per_respondent=messages,
        rmse=root_mean_square(estimate.estimate - truth),
        rmse_theory=math.sqrt(variance),
        rmse_projected=root_mean_square(projected - truth),
        top_recovered=top_recovered(truth, estimate.estimate, job.top_items, job.true_top),
        seconds=seconds,
        estimate=estimate.estimate.astype(np.float32),
    )


def simulate_histogram(job: HistogramJob) -> Outcome:
    """A Gaussian or one-hot scenario with the exact aggregate simulator (``simulators.exact``):
    released bucket sums drawn from their exact distribution."""
    started = time.perf_counter()
    scenario, privacy, truth = job.scenario, job.privacy, job.truth
    n = int(truth.sum())
    rng = scenario_generator(job.seed, scenario.name)
    if scenario.mechanism == GAUSSIAN:
        sigma = privacy.sigma_exact
        noisy = truth + rng.normal(0.0, sigma, size=truth.size)
        estimate = HistogramEstimate(noisy, np.full(truth.size, sigma), n)
        return finish_outcome(job, estimate, sigma**2, None, time.perf_counter() - started)
    randomizer = one_hot_randomizer(privacy, scenario.fragments, truth.size)
    # Independent runs of one respondent add up like respondents: splits x counts reports.
    splits = scenario.splits
    sums = exact.exact_bucket_sums(randomizer, truth * splits, rng)
    raw = randomizer.estimate(sums, n * splits)
    estimate = HistogramEstimate(raw.estimate / splits, raw.stderr / splits, n)
    messages = splits * randomizer.expected_messages_per_respondent()
    variance = float(np.mean(np.square(estimate.stderr)))
    return finish_outcome(job, estimate, variance, messages, time.perf_counter() - started)

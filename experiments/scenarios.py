"""The evaluation of Section VII (esa-privacy-revisited) as a grid of named scenarios: the
datasets of Table II (full and ``--quick`` sizes), the configuration, one :class:`Scenario` per cell,
the scenario lists of each table and the generator each scenario draws from."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import numpy as np

from experiments.paper import TABLE_III_LOCAL_EPSILON
from privacy.accounting import VARIATION_RATIO
from simulators.exact import PAPER_DATASETS, Dataset

# --------------------------------------------------------------------------------------------
# Datasets (Table II)
# --------------------------------------------------------------------------------------------


IMAGE_DATASETS = ("map", "horse", "child")
# The table of each image dataset (Tables IV, VIII, IX).
IMAGE_TABLE_KEYS = {"horse": "IV", "map": "VIII", "child": "IX"}


def quick_datasets() -> dict[str, Dataset]:
    """Small versions of the four populations for smoke runs (``--quick``): same shapes and
    deltas, about 0.1 to 0.4 % of the pixels and a few hundred thousand respondents."""
    return {
        "map": replace(
            PAPER_DATASETS["map"], respondents=600_000, domain_size=48 * 72, grid=(48, 72)
        ),
        "horse": replace(
            PAPER_DATASETS["horse"], respondents=300_000, domain_size=48 * 56, grid=(48, 56)
        ),
        "child": replace(
            PAPER_DATASETS["child"], respondents=400_000, domain_size=50 * 36, grid=(50, 36)
        ),
        "heavy-hitters": replace(
            PAPER_DATASETS["heavy-hitters"], respondents=500_000, domain_size=5_000
        ),
    }


# --------------------------------------------------------------------------------------------
# Configuration and the scenario grid
# --------------------------------------------------------------------------------------------

GAUSSIAN = "gaussian"
ONE_HOT = "one-hot"
SKETCH = "sketch"
SKETCH_EXACT = "sketch-exact"
SCENARIO_MECHANISMS = (GAUSSIAN, ONE_HOT, SKETCH, SKETCH_EXACT)


@dataclass(frozen=True)
class ExperimentConfig:
    """What ``esa experiment`` runs: the paper's grid by default, a shrunken one with ``quick``.

    central_epsilons: eps_c of the image tables (Tables III-IX); heavy_hitter_central_epsilons:
    those of Table I; fragment_counts: tau of the report-fragment columns; sketch_hashes x
    sketch_width: the count sketch (Apple's deployment: 1,024 x 65,536); top_items: K of "top K
    recovered"; budget_splits: runs or hash functions of Tables VI and VII; table_iii_local_epsilon:
    the eps_l of Table III's first row; workers: processes of the sketch simulator.
    """

    seed: int = 20_200_101
    quick: bool = False
    central_epsilons: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 1.0)
    heavy_hitter_central_epsilons: tuple[float, ...] = (0.0025, 0.01, 0.05, 0.25, 1.0)
    fragment_counts: tuple[int, ...] = (4, 16, 256)
    sketch_hashes: int = 1024
    sketch_width: int = 65_536
    top_items: int = 10_000
    budget_splits: tuple[int, ...] = (1, 2, 5)
    table_iii_local_epsilon: float = TABLE_III_LOCAL_EPSILON
    workers: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2^63), got {self.seed}")
        for name in ("central_epsilons", "heavy_hitter_central_epsilons"):
            values = getattr(self, name)
            if not values or any(not (0 < v < math.inf) for v in values):
                raise ValueError(f"{name} must be non-empty positive finite numbers, got {values}")
        if 1.0 not in self.central_epsilons:
            raise ValueError("central_epsilons must contain 1.0 (Table III's last rows)")
        if not self.fragment_counts or any(t < 2 for t in self.fragment_counts):
            raise ValueError(f"fragment_counts must be integers >= 2, got {self.fragment_counts}")
        if self.sketch_hashes < 1:
            raise ValueError(f"sketch_hashes must be >= 1, got {self.sketch_hashes}")
        if self.sketch_width < 2 or self.sketch_width & (self.sketch_width - 1):
            raise ValueError(f"sketch_width must be a power of two >= 2, got {self.sketch_width}")
        if self.top_items < 1:
            raise ValueError(f"top_items must be >= 1, got {self.top_items}")
        if not self.budget_splits or self.budget_splits[0] != 1:
            raise ValueError(f"budget_splits must start with 1, got {self.budget_splits}")
        if not self.table_iii_local_epsilon > 0:
            raise ValueError(
                f"table_iii_local_epsilon must be > 0, got {self.table_iii_local_epsilon}"
            )
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")

    @classmethod
    def quick_config(cls, seed: int = 20_200_101, workers: int = 2) -> ExperimentConfig:
        """A configuration that runs everything in seconds (smoke tests, ``--quick``)."""
        return cls(
            seed=seed,
            quick=True,
            central_epsilons=(0.5, 1.0),
            heavy_hitter_central_epsilons=(0.25, 1.0),
            fragment_counts=(4, 16),
            sketch_hashes=32,
            sketch_width=1024,
            top_items=100,
            workers=workers,
        )

    def datasets(self) -> dict[str, Dataset]:
        return quick_datasets() if self.quick else dict(PAPER_DATASETS)


@dataclass(frozen=True)
class Scenario:
    """One cell of the evaluation: a dataset, a mechanism and its privacy target.

    mechanism: ``gaussian`` (no LDP, central noise), ``one-hot`` (att-frag k-RAPPOR, Algorithm 1;
    with ``fragments`` > 1 the report-fragmented r-frag of Algorithm 2), ``sketch`` (count-mean
    sketch, one hash row per report, same fragment options), ``sketch-exact`` (the sketch without
    privacy: its hash-collision error alone). The budget is either a target ``central_epsilon``
    (eps_l then solved with Theorem III.1) or a fixed ``local_epsilon``; ``splits`` > 1 spends it
    in that many independent runs (one-hot) or hash functions (sketch), eps/splits each.
    """

    dataset: str
    mechanism: str
    central_epsilon: float | None = None
    local_epsilon: float | None = None
    fragments: int = 1
    splits: int = 1
    bound: str | None = None  # the bound eps_l is solved with (None: Theorem III.1, the paper's)

    def __post_init__(self) -> None:
        if self.mechanism not in SCENARIO_MECHANISMS:
            raise ValueError(
                f"mechanism must be one of {', '.join(SCENARIO_MECHANISMS)}, got {self.mechanism!r}"
            )
        budgets = (self.central_epsilon is not None) + (self.local_epsilon is not None)
        if self.mechanism == SKETCH_EXACT:
            if budgets:
                raise ValueError("sketch-exact has no privacy budget")
        elif budgets != 1:
            raise ValueError("give exactly one of central_epsilon and local_epsilon")
        if self.mechanism == GAUSSIAN and self.central_epsilon is None:
            raise ValueError("the Gaussian mechanism needs central_epsilon")
        for name in ("central_epsilon", "local_epsilon"):
            value = getattr(self, name)
            if value is not None and not (0 < value < math.inf):
                raise ValueError(f"{name} must be positive and finite, got {value}")
        if self.fragments < 1 or self.splits < 1:
            raise ValueError("fragments and splits must be >= 1")
        if self.mechanism in (GAUSSIAN, SKETCH_EXACT) and (self.fragments > 1 or self.splits > 1):
            raise ValueError(f"{self.mechanism} takes neither fragments nor splits")
        if self.fragments > 1 and self.splits > 1:
            raise ValueError("fragments and splits cannot be combined")
        if self.bound is not None and (self.mechanism != ONE_HOT or self.central_epsilon is None):
            raise ValueError("a solving bound needs a one-hot scenario with central_epsilon")

    @property
    def name(self) -> str:
        parts = [self.mechanism]
        if self.fragments > 1:
            parts.append(f"tau={self.fragments}")
        if self.splits > 1:
            parts.append(f"{'runs' if self.mechanism == ONE_HOT else 'hashes'}={self.splits}")
        if self.central_epsilon is not None:
            budget = f"eps_c={self.central_epsilon:g}"
        elif self.local_epsilon is not None:
            budget = f"eps_l={self.local_epsilon:g}"
        else:
            budget = "eps_c=inf"
        solved = "" if self.bound is None else f"/bound={self.bound}"
        return f"{self.dataset}/{','.join(parts)}/{budget}{solved}"

    @property
    def is_sketch(self) -> bool:
        return self.mechanism in (SKETCH, SKETCH_EXACT)


# The tight bound the "tight" columns solve eps_l with (variation-ratio reduction, issue 13).
TIGHT_BOUND = VARIATION_RATIO


def image_table_scenarios(config: ExperimentConfig, dataset: str) -> list[Scenario]:
    """Tables IV, VIII, IX (+ a sketch column): Gaussian, attribute-fragmented one-hot (with
    eps_l solved by Theorem III.1 and by the tight bound), attribute + report fragmented for each
    tau, and the count sketch, for each eps_c."""
    grid = []
    for eps in config.central_epsilons:
        grid.append(Scenario(dataset, GAUSSIAN, central_epsilon=eps))
        grid.append(Scenario(dataset, ONE_HOT, central_epsilon=eps))
        grid.append(Scenario(dataset, ONE_HOT, central_epsilon=eps, bound=TIGHT_BOUND))
        grid += [
            Scenario(dataset, ONE_HOT, central_epsilon=eps, fragments=tau)
            for tau in config.fragment_counts
        ]
        grid.append(Scenario(dataset, SKETCH, central_epsilon=eps))
    return grid


def heavy_hitter_scenarios(config: ExperimentConfig) -> list[Scenario]:
    """Table I: the image-table mechanisms on the heavy-hitter population."""
    return image_table_scenarios(
        replace(config, central_epsilons=config.heavy_hitter_central_epsilons), "heavy-hitters"
    )


def sketch_table_scenarios(config: ExperimentConfig) -> list[Scenario]:
    """Table V: count sketch with attribute (and report) fragments on Horse, plus no privacy."""
    grid = [
        Scenario("horse", SKETCH, central_epsilon=eps, fragments=tau)
        for eps in config.central_epsilons
        for tau in (1, *config.fragment_counts)
    ]
    return [*grid, Scenario("horse", SKETCH_EXACT)]


def table_iii_scenarios(config: ExperimentConfig) -> list[Scenario]:
    """Table III: eps_l = 2 reports, eps_c = 0.05 and 1 (one-hot), eps_c = 1 (sketch), all datasets."""
    low = min(config.central_epsilons)
    grid = []
    for key in ("map", "horse", "child", "heavy-hitters"):
        grid += [
            Scenario(key, ONE_HOT, local_epsilon=config.table_iii_local_epsilon),
            Scenario(key, ONE_HOT, central_epsilon=low),
            Scenario(key, ONE_HOT, central_epsilon=1.0),
            Scenario(key, SKETCH, central_epsilon=1.0),
        ]
    return grid


def budget_split_scenarios(config: ExperimentConfig, mechanism: str) -> list[Scenario]:
    """Tables VI (one-hot runs) and VII (sketch hash functions) on Horse: the total budget of each
    eps_c row spent in one, two or five parts."""
    return [
        Scenario("horse", mechanism, central_epsilon=eps, splits=splits)
        for eps in config.central_epsilons
        for splits in config.budget_splits
    ]


def scenario_grid(config: ExperimentConfig) -> dict[str, Scenario]:
    """Every scenario of Section VII by name (the union over all tables)."""
    grid: dict[str, Scenario] = {}
    for scenarios in (
        heavy_hitter_scenarios(config),
        *(image_table_scenarios(config, key) for key in IMAGE_DATASETS),
        sketch_table_scenarios(config),
        table_iii_scenarios(config),
        budget_split_scenarios(config, ONE_HOT),
        budget_split_scenarios(config, SKETCH),
    ):
        grid.update((scenario.name, scenario) for scenario in scenarios)
    return grid


def scenario_generator(seed: int, scenario_name: str) -> np.random.Generator:
    """The generator of one scenario: a child of the experiment seed keyed by the name."""
    key = zlib.crc32(scenario_name.encode())
    return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(seed, spawn_key=(key,))))

"""Exact aggregate simulator of the count-mean sketch (Section II-B, esa-privacy-revisited): the
released cell sums drawn from their exact distribution instead of one message per set bit."""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy import stats

from experiments.budgets import ScenarioPrivacy, one_hot_randomizer
from experiments.scenarios import SKETCH_EXACT, Scenario
from pipelines.engines.forked_workers import fork_is_safe
from privacy.randomizers import ReportFragmented, SketchHashes

# --------------------------------------------------------------------------------------------
# Exact aggregate simulator of the count sketch
# --------------------------------------------------------------------------------------------

# Values with at least this many reports get their row counts from one multinomial draw; the
# others are assigned report by report (cheaper than k cells for a value that has few reports).
_MULTINOMIAL_FROM = 1024
_REPORT_CHUNK = 1 << 24
_ROW_BLOCK = 16
# Cells with identical parameters are drawn as a histogram (multinomial over the binomial pmf)
# when there are at least this many; the pmf is kept to +-40 standard deviations (the mass beyond
# is below the smallest double).
_IID_GROUP_MIN = 256
_PMF_SIGMAS = 40.0
# Private sketch cells (read by one value only) are summed per value when at least this share of
# a row's values is expected to have one.
_PRIVATE_CELLS_WORTH = 0.05


@dataclass(frozen=True)
class SketchChannel:
    """How every bit of a respondent's sketch row is randomized before it is summed.

    backstop_keep: randomized response keeps a bit with this probability (1 = no privacy);
    fragment_keep and fragments: with report fragments (Algorithm 2), each of ``fragments``
    fragments re-randomizes the backstop bit, keeping it with ``fragment_keep``, and the cell sum
    adds all fragments.
    """

    backstop_keep: float
    fragment_keep: float | None = None
    fragments: int = 1

    def __post_init__(self) -> None:
        if not 0.5 < self.backstop_keep <= 1:
            raise ValueError(f"backstop_keep must be in (0.5, 1], got {self.backstop_keep}")
        if (self.fragment_keep is None) != (self.fragments == 1):
            raise ValueError("fragment_keep is needed exactly when fragments > 1")
        if self.fragment_keep is not None and not 0.5 < self.fragment_keep <= 1:
            raise ValueError(f"fragment_keep must be in (0.5, 1], got {self.fragment_keep}")

    @property
    def p_one(self) -> float:
        """Expected fragment-averaged report of a set bit."""
        a = self.backstop_keep
        if self.fragment_keep is None:
            return a
        r = self.fragment_keep
        return a * r + (1 - a) * (1 - r)

    @property
    def p_zero(self) -> float:
        """Expected fragment-averaged report of an unset bit."""
        a = self.backstop_keep
        if self.fragment_keep is None:
            return 1 - a
        r = self.fragment_keep
        return (1 - a) * r + a * (1 - r)

    @property
    def unit_variance(self) -> float:
        """Variance of one respondent's fragment-averaged bit, the same for set and unset bits:
        a(1-a) for randomized response, [tau r(1-r) + tau^2 (2r-1)^2 a(1-a)] / tau^2 with
        fragments (as in ``privacy.estimators.debias_report_fragments``)."""
        a = self.backstop_keep
        if self.fragment_keep is None:
            return a * (1 - a)
        r, tau = self.fragment_keep, self.fragments
        return (tau * r * (1 - r) + tau**2 * (2 * r - 1) ** 2 * a * (1 - a)) / tau**2


def sketch_truth(
    counts: np.ndarray,
    hashes: SketchHashes,
    reports_per_respondent: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """True sketch cells T[j, c] = #reports that chose row j and whose value hashes to c there.

    Each respondent sends ``reports_per_respondent`` reports, each to an independent uniformly
    chosen row (one hash function per report, Section VII-A), so a value's reports split over the
    k rows as Multinomial(f_v, 1/k). Values with many reports take that multinomial in one draw;
    the others are assigned report by report, in chunks.
    """
    k, m = hashes.num_hashes, hashes.width
    reports = np.asarray(counts, dtype=np.int64) * reports_per_respondent
    cells = np.zeros(k * m, dtype=np.int64)
    heavy = np.flatnonzero(reports >= _MULTINOMIAL_FROM)
    if heavy.size:
        per_row = rng.multinomial(reports[heavy], np.full(k, 1.0 / k))
        rows = np.broadcast_to(np.arange(k), per_row.shape).ravel()
        values = np.broadcast_to(heavy[:, None], per_row.shape).ravel()
        index = rows * m + hashes.columns(values, rows)
        cells += np.bincount(index, weights=per_row.ravel(), minlength=k * m).astype(np.int64)
    light = np.flatnonzero((reports > 0) & (reports < _MULTINOMIAL_FROM))
    if light.size:
        cumulative = np.cumsum(reports[light])
        edges = np.searchsorted(cumulative, np.arange(0, cumulative[-1], _REPORT_CHUNK), "right")
        bounds = [*np.unique(edges).tolist(), light.size]
        for low, high in zip(bounds[:-1], bounds[1:], strict=True):
            chunk = light[low:high]
            values = np.repeat(chunk, reports[chunk])
            rows = rng.integers(0, k, size=values.size)
            cells += np.bincount(rows * m + hashes.columns(values, rows), minlength=k * m)
    return cells.reshape(k, m)


def iid_binomial(trials: int, p: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` independent Binomial(trials, p) draws.

    Large groups are drawn as a histogram: the number of draws equal to each value is
    Multinomial(size, pmf), then the draws are shuffled into place; a few times faster than
    numpy's per-element sampler and exact to double precision.
    """
    if size == 0 or trials == 0 or p == 0.0:
        return np.zeros(size, dtype=np.int64)
    if p == 1.0:
        return np.full(size, trials, dtype=np.int64)
    if size < _IID_GROUP_MIN:
        return rng.binomial(trials, p, size=size)
    mean = trials * p
    spread = _PMF_SIGMAS * math.sqrt(trials * p * (1 - p))
    support = np.arange(max(0, int(mean - spread) - 2), min(trials, int(mean + spread) + 2) + 1)
    pmf = stats.binom.pmf(support, trials, p)
    pmf /= pmf.sum()
    values = np.repeat(support, rng.multinomial(size, pmf))
    rng.shuffle(values)
    return values


def randomized_response_sums(
    truth: np.ndarray, total: int, keep: float, rng: np.random.Generator
) -> np.ndarray:
    """Cell sums of ``total`` randomized-response bits of which ``truth`` per cell are set:
    Binomial(T, keep) + Binomial(total - T, 1 - keep), independent across cells. Empty cells
    share one distribution and are drawn together by :func:`iid_binomial`."""
    sums = np.empty(truth.size, dtype=np.int64)
    empty = truth == 0
    sums[empty] = iid_binomial(total, 1.0 - keep, int(np.count_nonzero(empty)), rng)
    occupied = ~empty
    set_bits = truth[occupied]
    sums[occupied] = rng.binomial(set_bits, keep) + rng.binomial(total - set_bits, 1.0 - keep)
    return sums


def channel_row_sums(
    truth_row: np.ndarray, row_total: int, channel: SketchChannel, rng: np.random.Generator
) -> np.ndarray:
    """Released sums of one sketch row from their exact distribution: backstop bits
    B = Bin(T, a) + Bin(n_j - T, 1 - a); with tau fragments, S = Bin(tau B, r) +
    Bin(tau (n_j - B), 1 - r) (each fragment re-randomizes the backstop bit independently)."""
    if channel.backstop_keep == 1.0:
        backstop = truth_row.astype(np.int64)
    else:
        backstop = randomized_response_sums(truth_row, row_total, channel.backstop_keep, rng)
    if channel.fragment_keep is None:
        return backstop
    tau = channel.fragments
    return randomized_response_sums(tau * backstop, tau * row_total, channel.fragment_keep, rng)


def simulate_sketch(
    counts: np.ndarray,
    hashes: SketchHashes,
    channels: Sequence[SketchChannel],
    channel_seeds: Sequence[int],
    reports_per_respondent: int,
    rng: np.random.Generator,
    workers: int = 1,
) -> list[np.ndarray]:
    """Exact aggregate simulation of the count sketch, several privacy channels at once.

    Draws the true cells once (:func:`sketch_truth`, from ``rng``), then the released sums the
    count-mean-sketch estimator reads, G(v) = sum_j S[j, h_j(v)] (Section II-B):

    - a cell that two or more values hash to is drawn on its own, row by row
      (:func:`channel_row_sums`);
    - the cells only one value hashes to (its *private* cells, common when d is not much larger
      than the width) are independent and randomize every trial with the same probabilities, so
      their sum over all rows is again a sum of binomials: it is drawn once per value from the
      summed true counts and row totals (:func:`channel_sums`);
    - cells no value hashes to are never read and not drawn.

    With many more values than cells (few private cells) every cell is drawn row by row instead.

    Each channel draws from generators keyed by its seed and the row block, so results do not
    depend on ``workers`` (processes, each given its own row blocks: numpy's samplers hold the
    GIL, so threads would not help) or on which channels share the pass. Returns G per channel (int64,
    one entry per value).
    """
    if len(channels) != len(channel_seeds):
        raise ValueError("give one seed per channel")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    truth = sketch_truth(counts, hashes, reports_per_respondent, rng)
    totals = truth.sum(axis=1)
    keys = hashes.keys(np.arange(counts.size))
    k = hashes.num_hashes
    shares = []
    for worker in range(min(workers, -(-k // _ROW_BLOCK))):
        starts = tuple(range(worker * _ROW_BLOCK, k, workers * _ROW_BLOCK))
        rows = np.concatenate([np.arange(s, min(s + _ROW_BLOCK, k)) for s in starts])
        shares.append(
            SketchRows(
                starts=starts,
                truth=truth[rows],
                totals=totals[rows],
                reports=int(totals.sum()),
                keys=keys,
                hashes=hashes,
                channels=tuple(channels),
                seeds=tuple(channel_seeds),
            )
        )
    if len(shares) > 1:
        # Each process gets its own rows and nothing else (explicit arguments, no shared state).
        with ProcessPoolExecutor(max_workers=len(shares), mp_context=pool_context()) as pool:
            partials = list(pool.map(sketch_rows, shares))
    else:
        partials = [sketch_rows(share) for share in shares]
    private_truth = sum(part[1] for part in partials)
    private_total = sum(part[2] for part in partials)
    hashed = []
    for index, (channel, seed) in enumerate(zip(channels, channel_seeds, strict=True)):
        # Spawn key (k,) is no row block's (those are multiples of the block size below k).
        private_rng = np.random.Generator(
            np.random.PCG64DXSM(np.random.SeedSequence(seed, spawn_key=(hashes.num_hashes,)))
        )
        private = channel_sums(private_truth, private_total, channel, private_rng)
        hashed.append(sum(part[0][index] for part in partials) + private)
    return hashed


def pool_context() -> multiprocessing.context.BaseContext:
    """The start method of the experiments' worker processes: fork where that is safe
    (``forked_workers.fork_is_safe``: no other thread, no gRPC; workers start at once, and every
    argument is passed explicitly either way), else spawn. A fork copies the calling thread
    only: after a Beam pipeline, with its Python threads and gRPC's core threads still alive, a
    test process that forked its pool died in ``os.fork`` (a segmentation fault)."""
    if "fork" in multiprocessing.get_all_start_methods() and fork_is_safe():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


@dataclass(frozen=True, eq=False)
class SketchRows:
    """One worker's share of a sketch pass: the row blocks starting at ``starts`` (each
    ``_ROW_BLOCK`` rows, the last one shorter), their true cells and row totals in that order, the
    total reports of the pass, the scrambled keys of the values, and the channels with their
    seeds."""

    starts: tuple[int, ...]
    truth: np.ndarray
    totals: np.ndarray
    reports: int
    keys: np.ndarray
    hashes: SketchHashes
    channels: tuple[SketchChannel, ...]
    seeds: tuple[int, ...]


def sketch_rows(share: SketchRows) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The row blocks of ``share``: hashed sums of the shared cells per channel, and per value the
    true count and row total summed over its private cells. Each block draws from generators
    keyed by its channel's seed and its first row, so the split over workers changes nothing."""
    keys, hashes, channels = share.keys, share.hashes, share.channels
    k, m = hashes.num_hashes, hashes.width
    # A hashed sum is at most (reports x fragments): int32 when that fits (faster gathers).
    dtypes = [
        np.int32 if share.reports * channel.fragments < 2**31 else np.int64 for channel in channels
    ]
    hashed = [np.zeros(keys.size, dtype=dtype) for dtype in dtypes]
    private_truth = np.zeros(keys.size, dtype=np.int64)
    private_total = np.zeros(keys.size, dtype=np.int64)
    buffer = np.empty(keys.size, dtype=np.uint64)
    # A value is alone in its cell with probability about e^(-(d-1)/m): with many more values
    # than cells (large domains) nearly no cell is private and the bookkeeping is not worth it.
    track_private = math.exp(-(keys.size - 1) / m) >= _PRIVATE_CELLS_WORTH
    position = 0
    for start in share.starts:
        generators = [
            np.random.Generator(
                np.random.PCG64DXSM(np.random.SeedSequence(seed, spawn_key=(start,)))
            )
            for seed in share.seeds
        ]
        for row in range(start, min(start + _ROW_BLOCK, k)):
            truth_row, total = share.truth[position], int(share.totals[position])
            position += 1
            columns = hashes.row_columns(row, keys, buffer)
            if not track_private:
                for index, channel in enumerate(channels):
                    sums = channel_row_sums(truth_row, total, channel, generators[index])
                    hashed[index] += sums.astype(dtypes[index], copy=False)[columns]
                continue
            readers = np.bincount(columns, minlength=m)
            alone = readers[columns] == 1
            private_truth[alone] += truth_row[columns[alone]]
            private_total[alone] += total
            shared = readers >= 2
            sharing = ~alone
            # Shared cells renumbered in order, and the cell each sharing value reads.
            cells = (np.cumsum(shared) - 1)[columns[sharing]]
            row_truth = truth_row[shared]
            for index, channel in enumerate(channels):
                sums = channel_row_sums(row_truth, total, channel, generators[index])
                hashed[index][sharing] += sums.astype(dtypes[index], copy=False)[cells]
    return [values.astype(np.int64) for values in hashed], private_truth, private_total


def channel_sums(
    truth: np.ndarray, totals: np.ndarray, channel: SketchChannel, rng: np.random.Generator
) -> np.ndarray:
    """Released sums of groups of ``totals`` reports of which ``truth`` hold the bit, per group:
    the backstop Bin(T, a) + Bin(N - T, 1 - a), then with tau fragments Bin(tau B, r) +
    Bin(tau (N - B), 1 - r). A sum of independent cells whose trials share these probabilities
    has exactly this law, whatever the cells."""
    truth = np.asarray(truth, dtype=np.int64)
    totals = np.asarray(totals, dtype=np.int64)
    if channel.backstop_keep == 1.0:
        backstop = truth
    else:
        a = channel.backstop_keep
        backstop = rng.binomial(truth, a) + rng.binomial(totals - truth, 1.0 - a)
    if channel.fragment_keep is None:
        return backstop
    tau, r = channel.fragments, channel.fragment_keep
    return rng.binomial(tau * backstop, r) + rng.binomial(tau * (totals - backstop), 1.0 - r)


def sketch_variance(
    counts: np.ndarray, num_hashes: int, width: int, channel: SketchChannel, reports: int = 1
) -> np.ndarray:
    """Variance of the count-mean-sketch estimate of each value (over privacy noise, row choice
    and a random hash family), for one report per hash function and ``reports`` reports per
    respondent (the estimate divided by ``reports``).

    With f the report counts (``reports`` x counts), N = sum f, u the channel's per-report
    variance and g = p_one - p_zero: Var = (m/(m-1))^2 N u / g^2 + [(N - f_v) +
    sum_{x != v} f_x (f_x - 1) / k] / (m - 1); the second term is the hash collisions: a report of
    another value lands on v's cell with probability 1/m, and two reports of one value share a row
    with probability 1/k (then they collide together).
    """
    f = np.asarray(counts, dtype=np.float64) * reports
    total = f.sum()
    m, k = float(width), float(num_hashes)
    gap = channel.p_one - channel.p_zero
    privacy_part = (m / (m - 1)) ** 2 * total * channel.unit_variance / gap**2
    pairs = f * (f - 1)
    collisions = ((total - f) + (pairs.sum() - pairs) / k) / (m - 1)
    return (privacy_part + collisions) / reports**2


def sketch_channel(scenario: Scenario, privacy: ScenarioPrivacy, width: int) -> SketchChannel:
    """The randomization of a sketch scenario (no privacy for ``sketch-exact``)."""
    if scenario.mechanism == SKETCH_EXACT:
        return SketchChannel(1.0)
    randomizer = one_hot_randomizer(privacy, scenario.fragments, width)
    if isinstance(randomizer, ReportFragmented):
        return SketchChannel(
            randomizer.backstop_keep, randomizer.fragment_keep, randomizer.fragments
        )
    return SketchChannel(randomizer.p_one)

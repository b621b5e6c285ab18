"""Configuration and accounting of one shuffler run (no Beam).

:class:`ShuffleConfig` holds every parameter of a run; the count names and :func:`metrics_summary`
define ``metrics.json``, whose balance check is, in records (DESIGN.md invariant 5):

    read = released + deleted + withheld + dead-lettered + presence

``presence`` counts the one presence message per origin and crowd that the shuffler kept for
counting respondents (never released); extra presence messages are dead-lettered
(``duplicate_presence``). Unreadable bytes whose record count is unknown make the balance fail
(``chunks_of_unknown_records``): nothing is assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.release.crowd_buckets import DEFAULT_CROWD_BUCKETS, MAX_CROWD_BUCKETS
from transforms.common import counters
from transforms.shuffler.params import DeletionParameters, ValidationRules, WindowSpec

METRICS_NAMESPACE = "esa.shuffle"
STAGE_READ = "shuffle.read"
STAGE_VALIDATE = "shuffle.validate"
STAGE_WINDOW = "shuffle.window"
STAGE_SCREEN = "shuffle.screen"

# Count names in the ``counts`` output (and Beam counters of the same names).
READ = "read"
RELEASED = "released"
DELETED = "deleted"
WITHHELD = "withheld"
PRESENCE = "presence"
REJECTED_PREFIX = "rejected:"
CROWDS_RELEASED = "crowds_released"
CROWDS_WITHHELD = "crowds_withheld"
# Unreadable chunks whose record count nobody knows, by reason: the balance cannot be checked.
UNKNOWN_PREFIX = "unknown_records:"
# Beam counter per step that splits a crowd bucket's work (``bundles:CountShard``, ...): the
# bundles that processed at least one element, i.e. how many pieces the runner cut the work in.
BUNDLES_PREFIX = "bundles:"


# Records per column batch the shuffler reads (Avro blocks are never split, so a batch is whole
# blocks of about this many). A batch's decode, validation and spill take ~1 KB per row at their
# peak; smaller batches keep a worker's memory the same whether the input is 33,000 or 330,000
# messages (benchmarks/bench_crowds.py on FnApiRunner: 50,000-row batches peaked +31 MB over
# 16,384-row ones at 100,000 crowds) at no cost in speed.
BATCH_RECORDS = 16_384


# Origin shards and output groups small enough that one big crowd spreads over many workers
# (Beam deals a stage's elements over its workers; ``make run``'s 80,000-message crowd is 8
# shards and 4 groups), large enough that a shard's or group's fixed costs stay small.
MESSAGES_PER_SHARD = 16_384
MESSAGES_PER_FILE = 32_768
# Every shard reads its hash range of each spill piece of its bucket (one or two small reads,
# ~0.1 ms, whatever the rows): a bucket of m messages in p pieces gets at most
# m / (p * SHARD_PIECE_ROWS) shards, so its (shard, piece) reads number at most
# m / SHARD_PIECE_ROWS, linear in the data, where m / messages_per_shard shards would make
# them quadratic (pieces grow with the input too). The price: once p grows with the input, a
# bucket's shard count stops growing and its shards' rows grow instead, and CountShard holds a
# shard's rows (400 to 650 bytes of peak memory each, measured): bench_shuffle's 16 buckets
# are 38 shards both at 2 M messages (40 batches of 50,000) and at 8 M (160 batches), of
# 52,000 and 210,000 rows, and the run's peak RSS, reached in CountShard, grows from about
# 250 to 320-350 MB. Flat memory needs fewer, larger pieces per bucket (pieces merged).
SHARD_PIECE_ROWS = 1024


@dataclass(frozen=True)
class ShuffleConfig:
    """Parameters of one shuffler run (instance ``rules.instance``, or all instances keyed apart).

    ``crowd_threshold``: smallest number of distinct respondents a crowd is released with;
    ``deletion``: (eps_cr, delta_cr) of Algorithm 3, or None for no randomized deletion;
    ``window``: event-time windows; ``streaming``: late panes are expected (watermark);
    ``batch_records``: records per column batch read; ``messages_per_shard``: target size of an
    origin shard; ``messages_per_file``: target number of messages per output file (the number of
    random groups of a crowd bucket is a power of two chosen from its released message count
    only); ``crowd_buckets``: the number B of crowd buckets (``schemas/release/crowd_buckets.py``), the
    unit of work and of the release's files; ``shard_piece_rows``: a bucket gets no more origin
    shards than leave each about this many rows (or ``messages_per_shard``, if fewer) of every
    spill piece (see :data:`SHARD_PIECE_ROWS`); ``workers``: the worker processes the runner
    has: a bucket large enough gets at least as many origin shards
    (``decide.origin_shard_bits``).
    """

    rules: ValidationRules
    crowd_threshold: int = 100
    deletion: DeletionParameters | None = None
    window: WindowSpec = field(default_factory=WindowSpec)
    streaming: bool = False
    batch_records: int = BATCH_RECORDS
    messages_per_shard: int = MESSAGES_PER_SHARD
    messages_per_file: int = MESSAGES_PER_FILE
    crowd_buckets: int = DEFAULT_CROWD_BUCKETS
    shard_piece_rows: int = SHARD_PIECE_ROWS
    workers: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.rules, ValidationRules):
            raise ValueError(f"rules must be ValidationRules, got {type(self.rules).__name__}")
        for name in (
            "crowd_threshold",
            "crowd_buckets",
            "batch_records",
            "messages_per_shard",
            "messages_per_file",
            "shard_piece_rows",
            "workers",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not 1 <= self.crowd_buckets <= MAX_CROWD_BUCKETS or isinstance(self.crowd_buckets, bool):
            raise ValueError(
                f"crowd_buckets must be an int in [1, {MAX_CROWD_BUCKETS}], got "
                f"{self.crowd_buckets!r}"
            )
        if self.crowd_threshold >= 2**63:
            raise ValueError(f"crowd_threshold must be < 2**63, got {self.crowd_threshold}")
        if self.deletion is not None and not isinstance(self.deletion, DeletionParameters):
            raise ValueError("deletion must be DeletionParameters or None")
        if not isinstance(self.window, WindowSpec):
            raise ValueError("window must be a WindowSpec")


def metrics_summary(counts: Mapping[str, int]) -> dict[str, Any]:
    """metrics.json: read, rejected by reason, released, deleted, withheld, presence, and the
    balance check read = released + deleted + withheld + dead-lettered + presence (in records)."""
    rejected = counters.by_suffix(counts, REJECTED_PREFIX)
    read = int(counts.get(READ, 0))
    released = int(counts.get(RELEASED, 0))
    deleted = int(counts.get(DELETED, 0))
    withheld = int(counts.get(WITHHELD, 0))
    presence = int(counts.get(PRESENCE, 0))
    unknown = counters.by_suffix(counts, UNKNOWN_PREFIX)
    dead_lettered = sum(rejected.values())
    accounted = released + deleted + withheld + dead_lettered + presence
    return {
        "read": read,
        "rejected_by_reason": rejected,
        "dead_lettered": dead_lettered,
        "released": released,
        "deleted": deleted,
        "withheld": withheld,
        "presence": presence,
        "crowds_released": int(counts.get(CROWDS_RELEASED, 0)),
        "crowds_withheld": int(counts.get(CROWDS_WITHHELD, 0)),
        "accounted": accounted,
        "chunks_of_unknown_records": unknown,
        "adds_up": read == accounted and not unknown,
    }

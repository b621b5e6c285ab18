"""Prio3 (draft-irtf-cfrg-vdaf-18, §7): additive shares with validity proofs, for two aggregators.

samplable-anonymous-aggregation §3.1.2 and §4.4.1: each device splits its (locally randomized)
report into additive shares, one per non-colluding aggregator; each aggregator sums its shares and
only the sum of the sums is ever seen. Prio3 adds a fully linear proof (draft §7.3) that the shared
vector is a valid report, so a device cannot add an arbitrary amount to any bucket.

Everything cryptographic -- Field128 arithmetic, the FLP, TurboSHAKE128 -- is the Rust crate
``prio`` 0.18.1 (the draft-18 implementation of ISRG's Janus/DAP), compiled into the extension
``esa_prio3`` from ``schemas/prio3``. This module only checks inputs (one ``VdafError``, a
``ValueError``, naming what is wrong), carries bytes and handles the verify key.

The flow of one report (draft §5), every value in the draft's wire encoding:

* device: :meth:`Prio3.shard` -> public share + one input share per aggregator;
* aggregator ``j``: :meth:`Prio3.verify_init` -> its state + its verifier share;
* both: exchange verifier shares, :meth:`Prio3.verify_finish` -> this aggregator's output share
  (``VdafError`` when the proof does not verify: the report is invalid and never counted);
* aggregator ``j``: :meth:`Prio3.aggregate` / :meth:`Prio3.merge` -> its aggregate share;
* collector: :meth:`Prio3.unshard` the aggregate shares -> counts.

The verify key (VERIFY_KEY_SIZE bytes) is shared by the aggregators and secret from devices
(draft §9, "the verification key MUST be kept secret from Clients"); its files are
``schemas.crypto.verify_keys``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "VDAF_DRAFT",
    "VERIFY_KEY_SIZE",
    "NONCE_SIZE",
    "SHARES",
    "KINDS",
    "VdafError",
    "Shards",
    "Prio3",
]

VDAF_DRAFT = 18
VERIFY_KEY_SIZE = 32
NONCE_SIZE = 16
SHARES = 2  # the leader (aggregator 0) and the helper (aggregator 1)
# Our names for the draft's Prio3 types (§7.4): one index; a bit vector of bounded weight; a
# vector of bounded integers.
KINDS = ("histogram", "multihot", "sumvec")
# The application context bound into every XOF call of the draft (its ``ctx``).
DEFAULT_CONTEXT = b"esa-telemetry/prio3"


class VdafError(ValueError):
    """A measurement, share or parameter that Prio3 refuses; the message says which and why."""


def _extension():
    try:
        import esa_prio3
    except ImportError as error:  # pragma: no cover - only without the Makefile's install
        raise VdafError(
            "the Prio3 extension esa_prio3 is not installed (make venv builds it from schemas/prio3)"
        ) from error
    if esa_prio3.VDAF_DRAFT != VDAF_DRAFT:  # pragma: no cover - a stale build
        raise VdafError(f"esa_prio3 implements VDAF draft {esa_prio3.VDAF_DRAFT}, not {VDAF_DRAFT}")
    return esa_prio3


@dataclass(frozen=True)
class Shards:
    """What a device sends for one report: the public share and one input share per aggregator."""

    public_share: bytes
    input_shares: tuple[bytes, ...]


def _bytes(value: object, size: int | None, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise VdafError(f"{what} must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if size is not None and len(value) != size:
        raise VdafError(f"{what} must be {size} bytes, got {len(value)}")
    return value


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise VdafError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


class Prio3:
    """One Prio3 instance: ``kind`` (one of :data:`KINDS`), ``length`` buckets and its bound.

    * ``histogram``: a measurement is one index in ``[0, length)`` (Prio3Histogram, §7.4.4);
    * ``multihot``: ``length`` bits with at most ``max_weight`` set (Prio3MultihotCountVec,
      §7.4.5) -- the 1-bit entries of a multi-bit one-hot report such as k-RAPPOR's;
    * ``sumvec``: ``length`` integers in ``[0, max_measurement]`` (Prio3SumVec, §7.4.3).

    ``chunk_length`` defaults to the crate's ``optimal_chunk_length`` (the draft's §7.4.3 advice).
    """

    def __init__(
        self,
        kind: str,
        length: int,
        *,
        max_weight: int | None = None,
        max_measurement: int | None = None,
        chunk_length: int | None = None,
        num_aggregators: int = SHARES,
        context: bytes = DEFAULT_CONTEXT,
    ) -> None:
        if kind not in KINDS:
            raise VdafError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.length = _positive(length, "length")
        self.num_aggregators = _positive(num_aggregators, "num_aggregators")
        if self.num_aggregators < 2:
            raise VdafError("num_aggregators must be at least 2")
        self.context = _bytes(context, None, "context")
        if chunk_length is not None:
            chunk_length = _positive(chunk_length, "chunk_length")
        self.max_weight = None if max_weight is None else _positive(max_weight, "max_weight")
        self.max_measurement = (
            None if max_measurement is None else _positive(max_measurement, "max_measurement")
        )
        if (kind == "multihot") != (max_weight is not None):
            raise VdafError("max_weight is given for, and only for, kind 'multihot'")
        if (kind == "sumvec") != (max_measurement is not None):
            raise VdafError("max_measurement is given for, and only for, kind 'sumvec'")
        extension = _extension()
        common = {"chunk_length": chunk_length, "num_aggregators": self.num_aggregators}
        try:
            if kind == "histogram":
                self._vdaf = extension.Histogram(self.length, ctx=self.context, **common)
            elif kind == "multihot":
                self._vdaf = extension.MultihotCountVec(
                    self.length, self.max_weight, ctx=self.context, **common
                )
            else:
                self._vdaf = extension.SumVec(
                    self.length, self.max_measurement, ctx=self.context, **common
                )
        except (ValueError, OverflowError) as error:
            raise VdafError(f"Prio3 {kind}: {error}") from error

    def __repr__(self) -> str:
        bound = {"multihot": f", max_weight={self.max_weight}"}.get(self.kind, "")
        if self.kind == "sumvec":
            bound = f", max_measurement={self.max_measurement}"
        return f"Prio3({self.kind!r}, {self.length}{bound})"

    @property
    def rand_size(self) -> int:
        """Bytes of sharding randomness (the draft's RAND_SIZE)."""
        return int(self._vdaf.rand_size)

    # -- device ---------------------------------------------------------------------------

    def measurement(self, value: object) -> int | list[bool] | list[int]:
        """``value`` as the crate's measurement, or VdafError saying why it is not one."""
        if self.kind == "histogram":
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise VdafError(f"a histogram measurement is one index, got {type(value).__name__}")
            if not 0 <= value < self.length:
                raise VdafError(f"index {value} is outside [0, {self.length})")
            return int(value)
        array = np.asarray(value)
        if array.shape != (self.length,) or not (
            np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_
        ):
            raise VdafError(
                f"a {self.kind} measurement is {self.length} integers, got shape {array.shape} "
                f"of {array.dtype}"
            )
        if self.kind == "multihot":
            if ((array != 0) & (array != 1)).any():
                raise VdafError("a multihot measurement holds only 0 and 1")
            if int(array.sum()) > self.max_weight:
                raise VdafError(f"weight {int(array.sum())} exceeds max_weight {self.max_weight}")
            return array.astype(bool).tolist()
        if (array < 0).any() or (array > self.max_measurement).any():
            raise VdafError(f"a sumvec entry is outside [0, {self.max_measurement}]")
        return array.astype(np.uint64).tolist()

    def shard(self, value: object, nonce: bytes, rand: bytes | None = None) -> Shards:
        """Shards one measurement (draft §5.1). ``nonce``: NONCE_SIZE bytes, unique per report;
        ``rand``: RAND_SIZE bytes, or None for the operating system's CSPRNG (the crate's)."""
        measurement = self.measurement(value)
        nonce = _bytes(nonce, NONCE_SIZE, "nonce")
        if rand is not None:
            rand = _bytes(rand, self.rand_size, "rand")
        try:
            public_share, input_shares = self._vdaf.shard(measurement, nonce, rand)
        except ValueError as error:
            raise VdafError(str(error)) from error
        return Shards(public_share, tuple(input_shares))

    # -- aggregators ----------------------------------------------------------------------

    def _agg_id(self, agg_id: int) -> int:
        if isinstance(agg_id, bool) or not isinstance(agg_id, int | np.integer):
            raise VdafError(f"agg_id must be an integer, got {type(agg_id).__name__}")
        if not 0 <= agg_id < self.num_aggregators:
            raise VdafError(f"agg_id must be in [0, {self.num_aggregators}), got {agg_id}")
        return int(agg_id)

    def verify_init(
        self,
        verify_key: bytes,
        agg_id: int,
        nonce: bytes,
        public_share: bytes,
        input_share: bytes,
    ) -> tuple[bytes, bytes]:
        """Aggregator ``agg_id`` opens its input share: (its verification state, its verifier
        share for the others). VdafError on a share that does not decode (wrong length, a field
        element out of range)."""
        try:
            state, verifier_share = self._vdaf.verify_init(
                _bytes(verify_key, VERIFY_KEY_SIZE, "verify_key"),
                self._agg_id(agg_id),
                _bytes(nonce, NONCE_SIZE, "nonce"),
                _bytes(public_share, None, "public_share"),
                _bytes(input_share, None, "input_share"),
            )
        except VdafError:
            raise
        except ValueError as error:
            raise VdafError(str(error)) from error
        return state, verifier_share

    def verify_finish(self, agg_id: int, state: bytes, verifier_shares: Sequence[bytes]) -> bytes:
        """Combines every aggregator's verifier share (in aggregator order), decides the proof and
        returns aggregator ``agg_id``'s output share; VdafError when the report is invalid."""
        return self.verify_next(
            agg_id, state, self.verifier_message(agg_id, state, verifier_shares)
        )

    def verifier_message(
        self, agg_id: int, state: bytes, verifier_shares: Sequence[bytes]
    ) -> bytes:
        """The draft's ``verifier_shares_to_message``: VdafError when the proof does not verify."""
        if len(verifier_shares) != self.num_aggregators:
            raise VdafError(
                f"{self.num_aggregators} verifier shares are needed, got {len(verifier_shares)}"
            )
        shares = [_bytes(share, None, "verifier share") for share in verifier_shares]
        try:
            return self._vdaf.verifier_shares_to_message(
                self._agg_id(agg_id), _bytes(state, None, "state"), shares
            )
        except VdafError:
            raise
        except ValueError as error:
            raise VdafError(str(error)) from error

    def verify_next(self, agg_id: int, state: bytes, message: bytes) -> bytes:
        """The draft's ``verify_next``: the output share, or VdafError (joint randomness
        mismatch: the shares were not made together)."""
        try:
            return self._vdaf.verify_next(
                self._agg_id(agg_id),
                _bytes(state, None, "state"),
                _bytes(message, None, "verifier message"),
            )
        except VdafError:
            raise
        except ValueError as error:
            raise VdafError(str(error)) from error

    def aggregate_init(self) -> bytes:
        """The aggregate share of no reports."""
        return self._vdaf.aggregate_init()

    def aggregate(self, output_shares: Iterable[bytes]) -> bytes:
        """One aggregator's output shares summed into its aggregate share (draft §5.3)."""
        try:
            return self._vdaf.aggregate([bytes(share) for share in output_shares])
        except ValueError as error:
            raise VdafError(str(error)) from error

    def merge(self, aggregate_shares: Iterable[bytes]) -> bytes:
        """Aggregate shares of disjoint sets of reports, summed (a CombineFn's merge)."""
        try:
            return self._vdaf.merge([bytes(share) for share in aggregate_shares])
        except ValueError as error:
            raise VdafError(str(error)) from error

    # -- collector ------------------------------------------------------------------------

    def unshard(self, aggregate_shares: Sequence[bytes], num_measurements: int) -> np.ndarray:
        """Every aggregator's aggregate share -> the counts per bucket (int64; draft §5.4)."""
        if len(aggregate_shares) != self.num_aggregators:
            raise VdafError(
                f"{self.num_aggregators} aggregate shares are needed, got {len(aggregate_shares)}"
            )
        if isinstance(num_measurements, bool) or not isinstance(num_measurements, int | np.integer):
            raise VdafError("num_measurements must be an integer")
        if num_measurements < 0:
            raise VdafError(f"num_measurements must be >= 0, got {num_measurements}")
        try:
            counts = self._vdaf.unshard(
                [bytes(share) for share in aggregate_shares], int(num_measurements)
            )
        except (ValueError, OverflowError) as error:
            raise VdafError(str(error)) from error
        bound = int(num_measurements) * (self.max_measurement or 1)
        if any(count > bound for count in counts):
            # A sum of valid reports never exceeds this; more means shares of different sets.
            raise VdafError("an aggregate exceeds what num_measurements valid reports can sum to")
        return np.asarray(counts, dtype=np.int64)

"""Local randomizers: how a device turns its value into randomized messages.

Each randomizer is a frozen, validated dataclass that states the local ε it meets (removal or
replacement LDP, Definitions II.2 and II.4 of esa-privacy-revisited), randomizes many respondents at
once into a :class:`~privacy.messages.MessageBatch`, and de-biases released bucket sums into a
:class:`~privacy.estimators.HistogramEstimate`.

The package holds one module per family (one_hot, sketch, zero_sum, fragmented, longitudinal)
over shared machinery (base); this module registers them by name.

One-hot randomizers emit only the indices of set bits, and their cost is proportional to the bits
emitted, not to the domain size: per respondent, a Binomial(d - 1, p_zero) number of false set bits
is drawn, then that many distinct uniform indices other than the true one (Section II-B,
esa-privacy-revisited: "only the indices of p(d - 1) + (1 - p) bits need be sent").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from privacy.randomizers.base import (
    _DENSE_CHUNK_CELLS,
    _DENSE_FLIP_PROBABILITY,
    _DENSE_MAX_WIDTH,
    _MESSAGE_COLUMNS,
    LdpKind,
    LocalRandomizer,
    _batch,
    _bit_flip_dense,
    _bit_flip_messages,
    _check_epsilon,
    _check_int,
    _check_true_counts,
    _check_values,
    _EpsilonRandomizedResponse,
    _flip_probability,
    _keep_probability,
    _one_hot_messages,
    _randomized_response_sums,
    _sample_distinct_keys,
    _set,
)
from privacy.randomizers.fragmented import (
    ReportFragmented,
)
from privacy.randomizers.longitudinal import (
    LongitudinalClient,
    LongitudinalState,
)
from privacy.randomizers.one_hot import (
    AsymmetricOneHot,
    BinaryRandomizedResponse,
    OneHotRappor,
    SymmetricOneHot,
    _OneHotBitFlip,
)
from privacy.randomizers.sketch import (
    _MASK32,
    CountMeanSketch,
    SketchHashes,
    _fmix32,
    _splitmix64,
)
from privacy.randomizers.zero_sum import (
    ZeroSumHistogram,
)

RANDOMIZERS: dict[str, type[LocalRandomizer]] = {
    cls.name: cls
    for cls in (
        BinaryRandomizedResponse,
        OneHotRappor,
        AsymmetricOneHot,
        SymmetricOneHot,
        CountMeanSketch,
        ZeroSumHistogram,
        ReportFragmented,
        LongitudinalClient,
    )
}


def build_randomizer(name: str, params: Mapping[str, Any]) -> LocalRandomizer:
    """The randomizer registered as ``name`` built from ``params`` (as ``to_params`` returns)."""
    if name not in RANDOMIZERS:
        raise ValueError(f"unknown randomizer {name!r}; known: {sorted(RANDOMIZERS)}")
    cls = RANDOMIZERS[name]
    expected = {field.name for field in fields(cls)}  # type: ignore[arg-type]
    given = set(params)
    if given != expected:
        missing, unknown = sorted(expected - given), sorted(given - expected)
        raise ValueError(
            f"parameters for {name!r} must be {sorted(expected)}; "
            f"missing {missing}, unknown {unknown}"
        )
    return cls(**params)


__all__ = [
    "AsymmetricOneHot",
    "BinaryRandomizedResponse",
    "CountMeanSketch",
    "LdpKind",
    "LocalRandomizer",
    "LongitudinalClient",
    "LongitudinalState",
    "OneHotRappor",
    "RANDOMIZERS",
    "ReportFragmented",
    "SketchHashes",
    "SymmetricOneHot",
    "ZeroSumHistogram",
    "_DENSE_CHUNK_CELLS",
    "_DENSE_FLIP_PROBABILITY",
    "_DENSE_MAX_WIDTH",
    "_EpsilonRandomizedResponse",
    "_MASK32",
    "_MESSAGE_COLUMNS",
    "_OneHotBitFlip",
    "_batch",
    "_bit_flip_dense",
    "_bit_flip_messages",
    "_check_epsilon",
    "_check_int",
    "_check_true_counts",
    "_check_values",
    "_flip_probability",
    "_fmix32",
    "_keep_probability",
    "_one_hot_messages",
    "_randomized_response_sums",
    "_sample_distinct_keys",
    "_set",
    "_splitmix64",
    "build_randomizer",
]

"""Counters every stage keeps: a dict of named record counts mirrored into Beam counters, and the
``prefix:reason`` families (rejected, unknown records) that its metrics summary adds up
(DESIGN.md invariant 5: counters account for every record read). Pure but for the Beam
counter that :func:`count` mirrors into."""

from __future__ import annotations

from collections.abc import Mapping


def count(counts: dict[str, int], namespace: str, name: str, value: int) -> None:
    """Add ``value`` to ``counts[name]`` and to the Beam counter ``namespace/name``."""
    if value:
        from apache_beam.metrics import Metrics  # Beam only where counting happens in a step

        counts[name] = counts.get(name, 0) + int(value)
        Metrics.counter(namespace, name.replace(":", "_")).inc(int(value))


def by_suffix(counts: Mapping[str, int], prefix: str) -> dict[str, int]:
    """``{reason: value}`` of the counters named ``prefix + reason`` (e.g. ``rejected:``)."""
    return {
        name[len(prefix) :]: int(value)
        for name, value in sorted(counts.items())
        if name.startswith(prefix)
    }

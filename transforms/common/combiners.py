"""Combiners shared by the stages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import apache_beam as beam


class SumCounts(beam.CombineFn):
    """Adds counter dicts (files, read, messages, rejected:<reason>); inputs are never modified."""

    def create_accumulator(self) -> dict[str, int]:
        return {}

    def add_input(self, accumulator: dict[str, int], counts: Mapping[str, int]) -> dict[str, int]:
        for name, value in counts.items():
            accumulator[name] = accumulator.get(name, 0) + int(value)
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[dict[str, int]]) -> dict[str, int]:
        total: dict[str, int] = {}
        for accumulator in accumulators:
            self.add_input(total, accumulator)
        return total

    def extract_output(self, accumulator: dict[str, int]) -> dict[str, int]:
        return dict(sorted(accumulator.items()))

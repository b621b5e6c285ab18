"""Where a benchmarked pipeline's wall time went, stage by stage, as FnApiRunner ran it.

A scaling run that does not speed up says only its total; its stage log says which stage did
not spread (its time barely falls from 1 worker to N), which stages are fixed costs (many small
ones) and how long the run spent outside any stage (the graph, the workers' start and end).
:func:`record_stages` wraps ``FnApiRunner._execute_bundle`` in the benchmark's child process (the
driver: the stages' bundles run on workers, but the driver waits for each stage as a whole);
:func:`stage_summary` then gives the slowest stages by a short name, their seconds and the
seconds outside them, as JSON for the child's result line.

Imported only by benchmark child scripts, after Beam.
"""

from __future__ import annotations

import re
import time
from typing import Any

from pipelines.engines.install_once import install_once

__all__ = ["describe", "record_stages", "short_stage_name", "stage_summary"]

_PLUMBING = re.compile(
    r"Reshuffle|GroupByKey|Impulse|restore_metadata|RandomKeys|reify|Flatten|/Read$|/Write$|"
    r"^ref_PCollection|KeyWithVoid|DoOnce|Precombine|/Merge$|ExtractOutputs|CoGroupByKeyImpl|"
    r"FlatMap-lambda-at-core|Map-decode"
)
_stages: list[tuple[str, float]] = []


def short_stage_name(name: str) -> str:
    """The first step of a fused stage that is not Beam's plumbing (a grouping's read, a
    reshuffle's keys), without Beam's prefixes: ``Shuffle-ReadReportFile`` for the stage that
    reads report files after ``SpreadFiles``; the first step when all are plumbing."""
    steps = [step for step in re.split(r"[()+]+", name) if step]
    ours = [step for step in steps if not _PLUMBING.search(step)] or steps or [name]
    step = ours[0].removeprefix("ref_AppliedPTransform_")
    return re.sub(r"(-ParDo-.*|_\d+)$", "", step)


@install_once
def record_stages() -> bool:
    """Time every stage FnApiRunner runs in this process from now on (once)."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    original = fn_runner.FnApiRunner._execute_bundle

    def timed(self: Any, context: Any, bundle_context: Any, bundle_input: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(self, context, bundle_context, bundle_input)
        finally:
            _stages.append((bundle_context.stage.name, time.perf_counter() - started))

    fn_runner.FnApiRunner._execute_bundle = timed
    return True


def stage_summary(wall_s: float, top: int = 5) -> dict[str, Any]:
    """The ``top`` slowest stages (short name, seconds; a name's stages summed), how many ran,
    and the rest of ``wall_s`` spent outside any stage."""
    seconds: dict[str, float] = {}
    for name, spent in _stages:
        short = short_stage_name(name)
        seconds[short] = seconds.get(short, 0.0) + spent
    slowest = sorted(seconds.items(), key=lambda item: -item[1])[:top]
    return {
        "stages": len(_stages),
        "slowest": [[name, round(spent, 3)] for name, spent in slowest],
        "outside_s": round(wall_s - sum(spent for _, spent in _stages), 3),
    }


def describe(summary: dict[str, Any] | None) -> str:
    """The summary as a note's clause: ``stages: Shuffle-ReadReportFile 5.8 s, ...; 0.9 s
    outside its 15 stages``; empty without one (a run not on FnApiRunner has none)."""
    if not summary or not summary["stages"]:
        return ""
    slowest = ", ".join(f"{name} {spent:.2f} s" for name, spent in summary["slowest"])
    return f"stages: {slowest}; {summary['outside_s']:.2f} s outside its {summary['stages']} stages"

"""FnApiRunner's multi-process stages sent only to the workers that have input for them.

With ``--direct_num_workers=N`` FnApiRunner runs every stage as N bundles, one per worker
(``ParallelBundleManager.process_bundle``): it partitions the stage's input N ways and sends
each part to a worker, empty or not. A stage fed by one element (an impulse, a side input's
singleton, a grouping by crowd bucket of a one-bucket release) was still N round trips through
the driver, and each worker that had never run that stage first fetched and unpickled its
DoFns. The driver, one Python process, handles every bundle, so this grows with N: on 2 cores, a
shuffle of 481,000 sealed messages spent 0.01-0.06 s in each of its dozen small stages with 2
workers and 0.05-0.28 s with 16, and the whole shuffle with 16 workers took 5.5-6.9 s against
3.9-4.9 s with only busy bundles sent (alternating runs; 1.8-2.5 s either way with 2 workers).

:func:`send_only_busy_bundles` replaces ``process_bundle`` with :func:`process_busy_bundles`,
which partitions as Beam does and then runs only the parts that hold input, and part 0 always
(the one Beam gives the stage's fired timers, and a stage with no input at all still runs one
bundle). A part left out held no element: what every element meets, and where the parts that
run are sent, are Beam's. No DoFn of the project emits anything from an empty bundle
(``start_bundle``/``finish_bundle`` only reset or count bundles that did work), and a skipped
bundle's monitoring data would have counted nothing. If the installed Beam's
``ParallelBundleManager`` lacks what this relies on, the original is kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.engines.install_once import install_once

__all__ = ["parts_with_input", "process_busy_bundles", "send_only_busy_bundles"]

_USED = {"_num_workers", "partition", "shared_unbounded_instance", "consolidate"}
beams_process_bundle: list[Any] = []  # Beam's own, once replaced (the tests run it too)


def parts_with_input(parts: Sequence[Mapping[str, Sequence[bytes]]]) -> list[int]:
    """Indices of the partitioned inputs that hold any encoded bytes, with 0 always first."""
    return [0] + [
        index
        for index, part in enumerate(parts)
        if index and any(chunk for chunks in part.values() for chunk in chunks)
    ]


def process_busy_bundles(
    self: Any,
    inputs: Mapping[str, Any],
    expected_outputs: Any,
    fired_timers: Mapping[Any, Any],
    expected_output_timers: Any,
    dry_run: bool = False,
) -> Any:
    """``ParallelBundleManager.process_bundle`` (Beam 2.77) running only
    :func:`parts_with_input`; the bundles and the merging of their results are Beam's."""
    from apache_beam.metrics import monitoring_infos
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner.fn_runner import BundleManager
    from apache_beam.utils import thread_pool_executor

    workers = self._num_workers
    parts: list[dict[str, list[bytes]]] = [{} for _ in range(workers)]
    for name, buffer in inputs.items():
        for index, part in enumerate(buffer.partition(workers)):
            parts[index][name] = part
    timers = [fired_timers if index == 0 else {} for index in range(workers)]
    busy = parts_with_input(parts)

    def execute(index: int) -> Any:
        manager = BundleManager(
            self.bundle_context_manager,
            self._progress_frequency,
            cache_token_generator=self._cache_token_generator,
        )
        return manager.process_bundle(
            parts[index], expected_outputs, timers[index], expected_output_timers, dry_run
        )

    merged = None
    splits: list[Any] = []
    with thread_pool_executor.shared_unbounded_instance() as executor:
        for result, split in executor.map(execute, busy):
            splits += split
            if merged is None:
                merged = result
                continue
            merged = beam_fn_api_pb2.InstructionResponse(
                process_bundle=beam_fn_api_pb2.ProcessBundleResponse(
                    monitoring_infos=monitoring_infos.consolidate(
                        itertools.chain(
                            result.process_bundle.monitoring_infos,
                            merged.process_bundle.monitoring_infos,
                        )
                    )
                ),
                error=result.error or merged.error,
            )
    return merged, splits


@install_once
def send_only_busy_bundles() -> bool:
    """Install :func:`process_busy_bundles` as FnApiRunner's parallel ``process_bundle`` (once;
    idempotent). Returns whether it is installed."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    manager = getattr(fn_runner, "ParallelBundleManager", None)
    used = set(manager.process_bundle.__code__.co_names) if manager is not None else set()
    fits = _USED <= used and hasattr(fn_runner, "BundleManager")
    if fits:
        beams_process_bundle.append(manager.process_bundle)
        manager.process_bundle = process_busy_bundles
    return fits

"""The per-shard device work of a simulation (pure: no Beam, no files).

A worker rebuilds recipe, population and fleet once from a ``simulators.plan.SimulationPlan``
(:class:`ShardContext`), then per shard generates the population slice chunk by chunk, runs the
device fleet (``simulators.fleet``: verify, charge, randomize, fragment, presence, pick instances,
stamp origin and event time), seals the payloads when the plan carries the analyzer's public key
(``simulators.sealing``) and turns each chunk into one ``simulators.reports.ReportBatch`` per
shuffler instance (:func:`simulate_shard`). ``transforms.devices.encode`` runs it in Beam and writes the
files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import numpy as np

from schemas import progress_counts
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import EncodedPayloads, encode_message_batch
from simulators.crowds import CrowdAssignment, crowd_assignment, split_crowd_keys
from simulators.fleet import DeviceFleet, FleetBatch, device_policy_for, format_origins
from simulators.plan import ShardSpec, ShardSummary, SimulationPlan
from simulators.populations import Population, PopulationContext, build_population
from simulators.prio3_devices import prio3_devices_for
from simulators.reports import ReportBatch
from simulators.sealing import sealing_for

__all__ = [
    "ShardContext",
    "presence_payloads",
    "report_batches_for",
    "simulate_shard",
    "split_by_crowd",
    "shard_file_name",
]

_PILOT_RESPONDENTS = 256


class ShardContext:
    """What a worker builds once from a plan: recipe, population and device fleet."""

    def __init__(self, plan: SimulationPlan) -> None:
        self.plan = plan
        self.recipe = plan.recipe()
        self.randomizer = self.recipe.build_randomizer()
        self.fleet = DeviceFleet(
            self.recipe,
            policy=device_policy_for(
                self.recipe,
                budget_epsilon=plan.device_budget,
                runs=plan.rounds,
                query_class_fields=plan.query_class_fields,
            ),
            config=plan.fleet_config(),
        )
        self.sketch_width = getattr(self.randomizer, "width", None)
        # A prio3 report is sealed to the two aggregators instead (simulators/prio3_devices.py).
        self.prio3 = prio3_devices_for(self.recipe, plan.aggregator_keys_json, self.fleet.window_ms)
        self.sealing = (
            None
            if self.prio3 is not None
            else sealing_for(self.recipe, plan.public_key_json, self.fleet.window_ms)
        )

    @property
    def device_budget(self) -> float:
        """The cohort epsilon each device allows (the plan's, or exactly one per round)."""
        if self.plan.device_budget is not None:
            return float(self.plan.device_budget)
        return self.plan.rounds * float(self.recipe.epsilon_central_target)

    @cached_property
    def population(self) -> Population:
        randomizer = self.randomizer
        context = PopulationContext(
            domain_size=int(randomizer.domain_size),
            periods=getattr(randomizer, "periods", None) if self.fleet.longitudinal else None,
            max_changes=getattr(randomizer, "max_changes", None)
            if self.fleet.longitudinal
            else None,
        )
        spec, _ = split_crowd_keys(self.plan.population)  # crowds: simulators/crowds.py
        population = build_population(
            spec, context, self.plan.respondents, self.plan.population_seed
        )
        if population.value_shape != self.fleet.value_shape:
            raise ValueError(
                f"population {self.plan.population!r} gives values of shape "
                f"{population.value_shape or 'scalar'} but recipe {self.recipe.id} needs "
                f"{self.fleet.value_shape or 'one category per respondent'}"
            )
        return population

    @cached_property
    def crowds(self) -> CrowdAssignment | None:
        """Each respondent's natural crowd, when the population spec names crowds."""
        _, keys = split_crowd_keys(self.plan.population)
        if keys and self.prio3 is not None:
            raise ValueError("natural crowds (crowds=C) are not simulated for prio3 recipes")
        return crowd_assignment(keys, self.population.size, self.plan.population_seed)

    def messages_per_respondent(self) -> float:
        """Expected messages per device and round (data + presence), for sizing shards and chunks:
        the randomizer's own expectation, or a pilot run on the first respondents."""
        expected = getattr(self.randomizer, "expected_messages_per_respondent", None)
        data: float | None = None
        if callable(expected):
            try:
                data = float(expected())
            except TypeError:
                data = None
        if data is None:
            pilot = self.population.values(0, min(_PILOT_RESPONDENTS, self.population.size))
            batch = self.randomizer.randomize(pilot, np.random.default_rng(0))
            data = len(batch) / max(len(pilot), 1)
        presence = self.fleet.num_instances * self.fleet.periods_per_round
        return (data + presence) * self.plan.rounds

    def respondents_per_shard(self) -> int:
        return _respondents_for(self.plan.messages_per_shard, self.messages_per_respondent())

    def respondents_per_chunk(self) -> int:
        return _respondents_for(self.plan.messages_per_chunk, self.messages_per_respondent())

    def shards(self) -> list[ShardSpec]:
        return self.plan.shards(self.population.size, self.respondents_per_shard())

    def fleet_batches(self, shard: ShardSpec) -> Iterator[FleetBatch]:
        """The shard's devices, chunk by chunk (bounded memory), all from the shard's generator."""
        rng = shard.generator(0)
        step = self.respondents_per_chunk()
        for first in range(shard.start, shard.stop, step):
            last = min(shard.stop, first + step)
            yield self.fleet.run(self.population.values(first, last), first, rng)

    def report_batches(
        self, batch: FleetBatch, rng: np.random.Generator | None = None
    ) -> list[ReportBatch]:
        """One ReportBatch per shuffler instance: its data messages, then its presence messages.
        ``rng``: the instances and times of prio3 reports (a prio3 recipe needs it)."""
        if self.prio3 is not None:
            if rng is None:
                raise ValueError("prio3 reports need a generator for their instances and times")
            return self.prio3.report_batches(batch, self.fleet, rng)
        batches = report_batches_for(
            batch,
            self.recipe,
            self.randomizer.payload_kind,
            self.fleet.num_instances,
            self.sketch_width,
        )
        if self.crowds is not None:
            batches = split_by_crowd(batches, batch, self.crowds)
        if self.sealing is not None:  # -- sealed payloads and chaff (simulators/sealing.py) --
            batches = [self.sealing.seal_batch(report_batch) for report_batch in batches]
        return batches


def _respondents_for(messages: int, per_respondent: float) -> int:
    return max(1, int(messages // max(per_respondent, 1e-9)))


class _Columns:
    """MessageBatch-like view with reordered columns (payload encoding needs no sort order)."""

    def __init__(self, batch: Any, order: np.ndarray) -> None:
        self.bucket = batch.bucket[order]
        self.sign = batch.sign[order]
        self.fragment = batch.fragment[order]
        self.period = batch.period[order]


def _payload_slice(payloads: EncodedPayloads, first: int, last: int) -> EncodedPayloads:
    offsets = payloads.offsets[first : last + 1]
    return EncodedPayloads(payloads.data[offsets[0] : offsets[-1]], offsets - offsets[0])


def _concat_payloads(first: EncodedPayloads, second: EncodedPayloads) -> EncodedPayloads:
    data = np.concatenate([first.data, second.data])
    offsets = np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]])
    return EncodedPayloads(data, offsets)


def presence_payloads(count: int) -> EncodedPayloads:
    """``count`` presence payloads: zero bytes each (their CRC32C is 0). A presence message is a
    normal Report with an empty payload; the shuffler counts its origin as a respondent of the
    crowd and never releases it."""
    return EncodedPayloads(np.zeros(0, dtype=np.uint8), np.zeros(count + 1, dtype=np.int64))


def report_batches_for(
    batch: FleetBatch,
    recipe: Any,
    payload_kind: str,
    num_instances: int,
    sketch_width: int | None = None,
) -> list[ReportBatch]:
    """Split a fleet batch by shuffler instance and encode its payloads (vectorized)."""
    order = np.argsort(batch.message_instance, kind="stable")
    payloads = encode_message_batch(_Columns(batch.messages, order), payload_kind, sketch_width)
    crcs = crc32c_many(payloads)
    bounds = np.searchsorted(batch.message_instance[order], np.arange(num_instances + 1))
    presence_order = np.argsort(batch.presence_instance, kind="stable")
    presence_bounds = np.searchsorted(
        batch.presence_instance[presence_order], np.arange(num_instances + 1)
    )
    message_origin = batch.message_origin[order]
    message_time = batch.message_event_ms[order]
    presence_origin = batch.presence_origin[presence_order]
    presence_time = batch.presence_event_ms[presence_order]
    out = []
    for instance in range(num_instances):
        lo, hi = int(bounds[instance]), int(bounds[instance + 1])
        plo, phi = int(presence_bounds[instance]), int(presence_bounds[instance + 1])
        presence_count = phi - plo
        out.append(
            ReportBatch(
                shuffler_instance=instance,
                channel=recipe.channel,
                recipe_id=recipe.id,
                min_crowd_size=int(recipe.min_crowd_size),
                origin=format_origins(
                    np.concatenate([message_origin[lo:hi], presence_origin[plo:phi]])
                ),
                event_time_ms=np.concatenate([message_time[lo:hi], presence_time[plo:phi]]),
                payloads=_concat_payloads(
                    _payload_slice(payloads, lo, hi), presence_payloads(presence_count)
                ),
                payload_crc32c=np.concatenate(
                    [crcs[lo:hi], np.zeros(presence_count, dtype=np.uint32)]
                ),
            )
        )
    return out


def _take(report: ReportBatch, rows: np.ndarray, crowd_id: str) -> ReportBatch:
    offsets = report.payloads.offsets
    lengths = offsets[rows + 1] - offsets[rows]
    starts = np.repeat(offsets[rows], lengths)
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(lengths) - lengths, lengths
    )
    payloads = EncodedPayloads(
        report.payloads.data[starts + within],
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
    )
    return dataclasses.replace(
        report,
        origin=report.origin[rows],
        event_time_ms=report.event_time_ms[rows],
        payloads=payloads,
        payload_crc32c=report.payload_crc32c[rows],
        crowd_id=crowd_id,
    )


def split_by_crowd(
    reports: list[ReportBatch], batch: FleetBatch, crowds: CrowdAssignment
) -> list[ReportBatch]:
    """Each instance's ReportBatch cut into one per natural crowd (simulators/crowds.py), rows
    in the order :func:`report_batches_for` laid them out: data messages, then presence."""
    message_crowd = crowds.crowd_of(batch.messages.respondent)
    presence_crowd = crowds.crowd_of(batch.presence_respondent)
    message_order = np.argsort(batch.message_instance, kind="stable")
    presence_order = np.argsort(batch.presence_instance, kind="stable")
    message_crowd, presence_crowd = message_crowd[message_order], presence_crowd[presence_order]
    message_instance = batch.message_instance[message_order]
    presence_instance = batch.presence_instance[presence_order]
    out = []
    for report in reports:
        u = report.shuffler_instance
        record_crowd = np.concatenate(
            [message_crowd[message_instance == u], presence_crowd[presence_instance == u]]
        )
        order = np.argsort(record_crowd, kind="stable")
        bounds = np.searchsorted(record_crowd[order], np.arange(crowds.crowds + 1))
        for index in range(crowds.crowds):
            rows = order[bounds[index] : bounds[index + 1]]
            if rows.size:
                out.append(_take(report, rows, crowds.names[index]))
    return out


def simulate_shard(
    context: ShardContext, shard: ShardSpec
) -> Iterator[tuple[int, list[ReportBatch]] | ShardSummary]:
    """The pure core of a shard: ``(chunk index, report batches)`` per chunk, then its summary."""
    summary = ShardSummary(shards=1, respondents=shard.respondents)
    report_rng = shard.generator(2)
    for chunk, batch in enumerate(context.fleet_batches(shard)):
        reports = context.report_batches(batch, report_rng)
        data = None
        if context.prio3 is not None:  # one report per device and window, not its messages
            data = np.zeros(context.fleet.num_instances, dtype=np.int64)
            presence = np.bincount(batch.presence_instance, minlength=data.size)
            for report in reports:
                data[report.shuffler_instance] += len(report)
            data -= presence[: data.size]
        summary.add_fleet_batch(batch, context.fleet.num_instances, data)
        progress_counts.add(batch.device_rounds)  # the progress line (schemas/progress_counts.py)
        if context.sealing is not None:  # sealed chaff: what each instance got beyond the plan
            summary.add_chaff(reports, batch, context.fleet.num_instances)
        yield chunk, reports
    progress_counts.flush()
    yield summary


def shard_file_name(instance: int, shard: int) -> str:
    """Relative path of a shard's file for one instance: instance=<u>/reports-<shard>.avro."""
    return f"instance={instance}/reports-{shard:05d}.avro"

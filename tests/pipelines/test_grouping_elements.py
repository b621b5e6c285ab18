"""What crosses each grouping does not grow with the crowds (issue: no whole-dataset gathers;
memory flat in the number of crowds): the shuffle and analyze pipelines run on FnApiRunner at
two crowd counts, and Beam's own element counters say how many elements went into every
GroupByKey (CoGroupByKey, Reshuffle and combiners expand to GroupByKeys). With crowd buckets
(schemas/release/crowd_buckets.py) these are per bucket, shard, part or file: the same at 4x the crowds
once every bucket of every window holds crowds. One element per crowd anywhere fails the test, and
so does a transform that gathers a whole PCollection into one element (ToList/ToDict/ToSet)."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.metrics import monitoring_infos
from apache_beam.options.pipeline_options import PipelineOptions

from benchmarks import bench_crowds
from pipelines import analyze as analyze_pipeline
from pipelines import shuffle as shuffle_pipeline

pytestmark = pytest.mark.slow

_GROUP_BY_KEY = "beam:transform:group_by_key:v1"
_GATHERS = (beam.combiners.ToList, beam.combiners.ToDict, beam.combiners.ToSet)
# bench_crowds: 2 channels x 10 windows x crowd IDs; at 800 crowds each window holds 80 crowds
# over 16 buckets (a bucket is empty with probability (15/16)^80 < 0.6 %: the figures are
# deterministic for this data, the check does not depend on luck).
SMALL, LARGE = 800, 3200


class _Gathers(beam.pipeline.PipelineVisitor):
    """The labels of the transforms that gather a whole PCollection into one element."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def enter_composite_transform(self, node) -> None:
        if isinstance(node.transform, _GATHERS):
            self.labels.append(node.full_label)

    def visit_transform(self, node) -> None:
        self.enter_composite_transform(node)


def _grouping_inputs(
    tmp_path: Path, crowds: int, monkeypatch, gathers: list[str] | None = None
) -> dict[str, dict[str, int]]:
    """Elements written into each GroupByKey, per pipeline (``shuffle``, ``analyze``); the labels
    of gathering transforms are added to ``gathers``."""
    counted: dict[str, dict[str, int]] = {}
    original = beam.Pipeline.run

    def run(self, *args, **kwargs):
        visitor = _Gathers()
        self.visit(visitor)
        if gathers is not None:
            gathers.extend(visitor.labels)
        proto = self.to_runner_api()
        inputs = {
            transform.unique_name: next(iter(transform.inputs.values()))
            for transform in proto.components.transforms.values()
            if transform.spec.urn == _GROUP_BY_KEY
        }
        result = original(self, *args, **kwargs)
        result.wait_until_finish()
        elements: dict[str, int] = {}
        for info in result.monitoring_infos():  # FnApiRunner's, per stage
            if info.urn == monitoring_infos.ELEMENT_COUNT_URN:
                pcollection = info.labels["PCOLLECTION"]
                value = monitoring_infos.extract_counter_value(info)
                elements[pcollection] = elements.get(pcollection, 0) + value
        stage = "analyze" if any("Aggregate" in name for name in inputs) else "shuffle"
        counted[stage] = {name: elements.get(pcoll, 0) for name, pcoll in inputs.items()}
        return result

    monkeypatch.setattr(beam.Pipeline, "run", run)
    work = tmp_path / str(crowds)
    recipes = bench_crowds.generate(work / "reports", crowds)
    shuffle_pipeline.run(
        PipelineOptions(
            ["--runner=FnApiRunner"],
            input=str(work / "reports" / "*.avro"),
            output=str(work / "shuffled"),
            instance=0,
            recipe=recipes,
            crowd_threshold=2,
        )
    )
    summary = analyze_pipeline.run(
        PipelineOptions(
            ["--runner=FnApiRunner"],
            analyze_input=[str(work / "shuffled")],
            analyze_output=str(work / "analysis"),
            analyze_recipe=recipes,
            analyze_no_pictures=True,
        )
    )
    assert summary["metrics"]["adds_up"] and summary["reports"]["histograms"] > 0.9 * crowds
    monkeypatch.setattr(beam.Pipeline, "run", original)
    return counted


def test_no_grouping_carries_an_element_per_crowd(
    tmp_path: Path, monkeypatch, record_property
) -> None:
    gathers: list[str] = []
    small = _grouping_inputs(tmp_path, SMALL, monkeypatch, gathers)
    large = _grouping_inputs(tmp_path, LARGE, monkeypatch)
    # No transform of either pipeline, as built, gathers a whole PCollection (side inputs read
    # as lists are allowed only for the parts' file names and totals).
    assert [label for label in gathers if "Analyze" in label or "Write" in label] == []
    record_property(
        "scale",
        f"elements into the groupings at {SMALL:,} -> {LARGE:,} crowds: "
        + ", ".join(
            f"{stage} {len(large[stage])} groupings, {sum(small[stage].values()):,} -> "
            f"{sum(large[stage].values()):,} in all, at most {max(large[stage].values()):,}"
            for stage in ("shuffle", "analyze")
        ),
    )
    assert set(small) == set(large) == {"shuffle", "analyze"}
    added = LARGE - SMALL
    for stage in ("shuffle", "analyze"):
        assert len(large[stage]) >= 5, stage  # the groupings were found and counted
        # Per-crowd elements would add >= 2,400 to a grouping; what may grow is a few parts
        # (one per ~1,000 crowds) and the buckets that hold withheld crowds: under one element
        # per 100 added crowds in every grouping (a grouping new at LARGE counts from 0).
        grown = {
            name: (small[stage].get(name, 0), count)
            for name, count in large[stage].items()
            if count - small[stage].get(name, 0) > added // 100
        }
        assert grown == {}, f"{stage}: groupings whose input grew with 4x the crowds: {grown}"
        assert max(large[stage].values()) < LARGE / 4, (stage, large[stage])

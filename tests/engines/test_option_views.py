"""ViewsOnce: kept views read and write what fresh views would; copies make their own."""

from __future__ import annotations

import copy
import pickle

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)
from apache_beam.testing.util import assert_that, equal_to

from pipelines.engines.new_pipeline import new_pipeline
from pipelines.engines.option_views import ViewsOnce, views_once


def _options() -> PipelineOptions:
    return PipelineOptions(["--runner=FnApiRunner", "--direct_num_workers=3"], job_name="views")


def test_a_view_is_made_once_per_class_and_reads_the_flags():
    options = views_once(_options())
    assert options.view_as(TypeOptions) is options.view_as(TypeOptions)
    assert options.view_as(StandardOptions).runner == "FnApiRunner"
    assert options.view_as(DirectOptions).direct_num_workers == 3
    assert options.view_as(GoogleCloudOptions).job_name == "views"
    assert views_once(options) is options


def test_values_are_shared_with_the_options_it_was_made_from():
    original = _options()
    options = views_once(original)
    options.view_as(StandardOptions).runner = "DirectRunner"
    assert original.view_as(StandardOptions).runner == "DirectRunner"
    original.view_as(DirectOptions).direct_num_workers = 5
    assert options.view_as(DirectOptions).direct_num_workers == 5
    assert original.get_all_options() == options.get_all_options()


def test_a_copy_or_pickle_keeps_no_view_of_the_original():
    options = views_once(_options())
    options.view_as(StandardOptions)
    for other in (copy.deepcopy(options), pickle.loads(pickle.dumps(options))):
        assert isinstance(other, ViewsOnce)
        assert "_views" not in other.__dict__
        other.view_as(StandardOptions).runner = "DirectRunner"
        assert other.view_as(StandardOptions).runner == "DirectRunner"
        assert options.view_as(StandardOptions).runner == "FnApiRunner"


def test_a_pipeline_runs_and_type_checks_with_it():
    with beam.Pipeline(options=views_once(_options())) as pipeline:
        doubled = pipeline | beam.Create([1, 2, 3]) | beam.Map(lambda x: 2 * x)
        assert_that(doubled, equal_to([2, 4, 6]))
    try:  # new_pipeline: Beam's own leaves its temporary directory when building fails
        with new_pipeline(views_once(_options())) as pipeline:
            _ = pipeline | beam.Create([1]) | beam.Map(len).with_input_types(str)
    except beam.typehints.TypeCheckError:
        pass
    else:
        raise AssertionError("a mistyped input passed the pipeline's type check")

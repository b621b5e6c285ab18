"""pipelines/commandline/options.py: one Flag table per stage, defaults from the config dataclasses, Beam's own
flags told apart from everything else, validate() in Beam's convention."""

from __future__ import annotations

import argparse

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from pipelines import analyze as analyze_pipeline
from pipelines import shuffle as shuffle_pipeline
from pipelines.commandline import flags
from pipelines.commandline.analyze_options import AnalyzeOptions
from pipelines.commandline.options import format_duration_ms, unknown_beam_flags
from pipelines.commandline.run_options import RunOptions
from pipelines.commandline.shuffle_options import ShuffleOptions
from pipelines.commandline.simulate_options import SimulateOptions
from pipelines.engines import forked_workers
from simulators.plan import SimulationPlan
from transforms.analyzer.analyze import AnalysisConfig
from transforms.shuffler.report_rows import WindowSpec, parse_duration_ms
from transforms.shuffler.shuffle import ShuffleConfig

STAGES = (ShuffleOptions, SimulateOptions, AnalyzeOptions, RunOptions)


def _parsed(options_class, argv: list[str]) -> PipelineOptions:
    parser = argparse.ArgumentParser()
    options_class.add_cli_arguments(parser)
    return PipelineOptions([], **options_class.cli_values(parser.parse_args(argv)))


def test_defaults_are_the_config_dataclasses_defaults():
    shuffle = _parsed(ShuffleOptions, []).view_as(ShuffleOptions)
    assert shuffle.crowd_threshold == ShuffleConfig.crowd_threshold
    assert shuffle.batch_records == ShuffleConfig.batch_records
    assert shuffle.messages_per_shard == ShuffleConfig.messages_per_shard
    assert shuffle.messages_per_file == ShuffleConfig.messages_per_file
    assert parse_duration_ms(shuffle.window) == WindowSpec.period_ms
    simulate = _parsed(SimulateOptions, []).view_as(SimulateOptions)
    assert simulate.value("codec") == SimulationPlan.codec
    assert simulate.value("messages_per_shard") == SimulationPlan.messages_per_shard
    assert simulate.value("rounds") == SimulationPlan.rounds
    analyze = _parsed(AnalyzeOptions, []).view_as(AnalyzeOptions)
    assert analyze.value("failure_probability") == AnalysisConfig.failure_probability
    assert analyze.value("postprocessing") == AnalysisConfig.postprocessing
    run = _parsed(RunOptions, []).view_as(RunOptions)
    assert run.value("crowd_threshold") == ShuffleConfig.crowd_threshold


@pytest.mark.parametrize("options_class", STAGES)
def test_beam_and_esa_spellings_reach_the_same_option(options_class):
    # The Beam-side spelling (--run_seed, --crowd-threshold) and the esa one (--seed) agree.
    flag = next(f for f in options_class.FLAGS if f.type is int)
    beam = PipelineOptions([options_class.beam_flag(flag), "7"]).view_as(options_class)
    esa = _parsed(options_class, [options_class.cli_flag(flag), "7"]).view_as(options_class)
    assert beam.value(flag.name) == esa.value(flag.name) == 7


@pytest.mark.parametrize("ms", [1, 999, 1000, 90_000, 3_600_000, 86_400_000, 3 * 86_400_000])
def test_durations_print_in_the_one_grammar(ms):
    assert parse_duration_ms(format_duration_ms(ms)) == ms


def test_only_beams_own_flags_are_known():
    known = ["--runner=FnApiRunner", "--streaming", "--direct_num_workers", "2"]
    assert unknown_beam_flags(known + ["--direct_running_mode=multi_processing"]) == []
    assert unknown_beam_flags(["--crowd-treshold", "5"]) == ["--crowd-treshold", "5"]
    # The stages' own Beam-side flags are not Beam's: on an esa command line they are errors.
    assert unknown_beam_flags(["--run_seed=3"]) == ["--run_seed=3"]
    # No abbreviations: --run is not --runner.
    assert unknown_beam_flags(["--run=FnApiRunner"]) == ["--run=FnApiRunner"]


def test_validate_follows_beams_convention():
    options = PipelineOptions(["--crowd-threshold", str(2**63), "--window", "0s"])
    errors = options.view_as(ShuffleOptions).validate()
    assert any(e.startswith("--crowd-threshold") for e in errors)
    assert any(e.startswith("--window") for e in errors)
    assert all("\n" not in error for error in errors)


def test_a_runner_is_chosen_only_by_a_runner_or_direct_runner_flag():
    assert not flags.runner_chosen(PipelineOptions([]))
    assert not flags.runner_chosen(PipelineOptions(["--temp_location=/tmp"]))
    assert flags.runner_chosen(PipelineOptions(["--runner=FnApiRunner"]))
    assert flags.runner_chosen(PipelineOptions(["--direct_num_workers=3"]))
    assert flags.runner_chosen(PipelineOptions(["--direct_running_mode=multi_threading"]))


FORKED = forked_workers.RUNNER


@pytest.mark.parametrize(
    ("given", "processes", "cpus", "expected"),
    [
        ([], 8, 2, (FORKED, "multi_processing", 2)),  # one worker per CPU at most, forked
        ([], 2, 16, (FORKED, "multi_processing", 2)),
        ([], 1, 16, ("FnApiRunner", "in_memory", 1)),  # small work: this process
        ([], 8, 1, ("FnApiRunner", "in_memory", 1)),  # one CPU: this process
        (["--runner=FnApiRunner"], 8, 2, ("FnApiRunner", "in_memory", 1)),  # the user's runner
        (["--direct_num_workers=3"], 8, 2, ("FnApiRunner", "in_memory", 3)),  # and settings
        (["--streaming"], 8, 2, ("DirectRunner", "in_memory", 1)),
        # The user's multi-process FnApiRunner: the same runner, its workers forked.
        (
            [
                "--runner=FnApiRunner",
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=3",
            ],
            1,
            2,
            (FORKED, "multi_processing", 3),
        ),
        # The same without --runner (as esa shuffle --help shows it): forked too.
        (
            ["--direct_running_mode=multi_processing", "--direct_num_workers=3"],
            1,
            2,
            (FORKED, "multi_processing", 3),
        ),
        (
            ["--runner=DirectRunner", "--direct_running_mode=multi_processing"],
            1,
            2,
            ("DirectRunner", "multi_processing", 1),
        ),
    ],
)
def test_large_work_runs_on_a_worker_process_per_cpu_unless_a_runner_was_chosen(
    monkeypatch, given, processes, cpus, expected
):
    monkeypatch.setattr(flags.os, "cpu_count", lambda: cpus)
    options = flags.with_default_runner(PipelineOptions(given), processes)
    direct = options.view_as(DirectOptions)
    runner = options.view_as(StandardOptions).runner
    assert (runner, direct.direct_running_mode, direct.direct_num_workers) == expected


def test_the_analyzer_spreads_sealed_or_large_releases_over_processes(monkeypatch):
    monkeypatch.setattr(analyze_pipeline.os, "cpu_count", lambda: 16)
    sealed, clear = (
        analyze_pipeline.SPREAD_MIN_SEALED_MESSAGES,
        analyze_pipeline.SPREAD_MIN_MESSAGES,
    )
    assert analyze_pipeline.worker_processes(sealed - 1, sealed - 1) == 1
    assert (
        analyze_pipeline.worker_processes(sealed, sealed) == analyze_pipeline.MAX_WORKER_PROCESSES
    )
    assert analyze_pipeline.worker_processes(clear - 1, 0) == 1
    assert analyze_pipeline.worker_processes(clear, 0) == analyze_pipeline.MAX_WORKER_PROCESSES
    monkeypatch.setattr(analyze_pipeline.os, "cpu_count", lambda: 2)
    assert analyze_pipeline.worker_processes(clear, sealed) == 2


def test_the_analyzer_spreads_many_crowds_one_worker_per_share(monkeypatch):
    monkeypatch.setattr(analyze_pipeline.os, "cpu_count", lambda: 16)
    share = analyze_pipeline.CROWDS_PER_WORKER
    assert analyze_pipeline.worker_processes(0, 0, 2 * share - 1) == 1  # one share: no spread
    assert analyze_pipeline.worker_processes(0, 0, 2 * share) == 2
    assert analyze_pipeline.worker_processes(0, 0, 10 * share + share // 2) == 10
    assert analyze_pipeline.worker_processes(0, 0, 100 * share) == 16  # one per CPU at most
    assert analyze_pipeline.worker_processes(0, 0, -share) == 1
    sealed = analyze_pipeline.SPREAD_MIN_SEALED_MESSAGES
    assert analyze_pipeline.worker_processes(sealed, sealed, 2 * share) == 16  # messages first
    monkeypatch.setattr(analyze_pipeline.os, "cpu_count", lambda: 2)
    assert analyze_pipeline.worker_processes(0, 0, 10 * share) == 2
    # spawned workers start slower than a share of crowds is analyzed: crowds alone keep one
    assert analyze_pipeline.worker_processes(0, 0, 10 * share, forked=False) == 1
    assert analyze_pipeline.worker_processes(sealed, sealed, 0, forked=False) == 2


def test_the_shuffler_spreads_large_inputs_over_processes(monkeypatch):
    monkeypatch.setattr(shuffle_pipeline.os, "cpu_count", lambda: 16)
    least = shuffle_pipeline.SPREAD_MIN_INPUT_BYTES
    assert shuffle_pipeline.worker_processes(0) == 1
    assert shuffle_pipeline.worker_processes(least - 1) == 1
    assert shuffle_pipeline.worker_processes(least) == shuffle_pipeline.MAX_WORKER_PROCESSES
    monkeypatch.setattr(shuffle_pipeline.os, "cpu_count", lambda: 2)
    assert shuffle_pipeline.worker_processes(10 * least) == 2
    monkeypatch.setattr(shuffle_pipeline.os, "cpu_count", lambda: None)
    assert shuffle_pipeline.worker_processes(10 * least) == 1
    said = f"from {least >> 20} MiB of report files"  # esa shuffle --help states the figures
    assert said in " ".join(shuffle_pipeline.__doc__.split())
    assert f"(at most {shuffle_pipeline.MAX_WORKER_PROCESSES})" in shuffle_pipeline.__doc__


def test_the_worker_processes_of_options_are_those_beam_starts(monkeypatch):
    """In this process: 1; multi-process: --direct_num_workers, 0 meaning one per CPU (as
    FnApiRunner reads it), unset meaning 1; on a portable runner the most of --parallelism and
    --sdk_worker_parallelism."""
    monkeypatch.setattr(flags.multiprocessing, "cpu_count", lambda: 6)
    multi = ["--direct_running_mode=multi_processing"]
    assert flags.worker_processes_of(PipelineOptions([])) == 1
    assert flags.worker_processes_of(PipelineOptions(["--direct_num_workers=4"])) == 1
    assert flags.worker_processes_of(PipelineOptions(multi)) == 1
    assert flags.worker_processes_of(PipelineOptions([*multi, "--direct_num_workers=4"])) == 4
    assert flags.worker_processes_of(PipelineOptions([*multi, "--direct_num_workers=0"])) == 6
    # a portable runner: Flink's task slots in use, or the SDK worker processes asked for
    flink = ["--runner=FlinkRunner"]
    assert flags.worker_processes_of(PipelineOptions([*flink, "--parallelism=4"])) == 4
    assert flags.worker_processes_of(PipelineOptions([*flink, "--parallelism=-1"])) == 1
    assert flags.worker_processes_of(PipelineOptions(["--sdk_worker_parallelism=3"])) == 3
    both = [*flink, "--parallelism=2", "--sdk_worker_parallelism=8"]
    assert flags.worker_processes_of(PipelineOptions(both)) == 8


@pytest.mark.parametrize(
    ("given", "workers"),
    [
        (["--runner=FlinkRunner", "--parallelism=4", "--environment_type=LOOPBACK"], 4),
        (["--runner=FlinkRunner", "--parallelism=4"], 4),  # Flink's default for a local master
        (["--runner=FlinkRunner", "--flink_master=[local]", "--parallelism=3"], 3),
        (["--runner=FlinkRunner", "--parallelism=4", "--sdk_worker_parallelism=2"], 2),
        (["--runner=FlinkRunner", "--parallelism=4", "--environment_type=DOCKER"], 1),
        (["--runner=FlinkRunner", "--flink_master=host:8081", "--parallelism=4"], 1),
        (["--runner=FlinkRunner", "--parallelism=1"], 1),
        (["--runner=PrismRunner", "--parallelism=4"], 1),
    ],
)
def test_flink_on_this_machine_gets_one_sdk_worker_per_task_slot(given, workers):
    """--parallelism=N on Flink with LOOPBACK workers (given, or Flink's default for a local
    master) asks for N SDK workers unless --sdk_worker_parallelism says otherwise; workers in
    containers or on a remote cluster keep Beam's default."""
    from apache_beam.options.pipeline_options import PortableOptions

    options = flags.with_default_runner(PipelineOptions(given))
    assert int(options.view_as(PortableOptions).sdk_worker_parallelism) == workers

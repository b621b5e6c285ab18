"""End to end: simulated devices -> K shufflers -> analyzer, on three runner modes.

One small world is simulated and shuffled once per module (FnApiRunner): an image population on
a 64 x 64 grid (one-hot k-RAPPOR, attribute-fragmented), a tiny crowd every shuffler withholds,
and a longitudinal boolean over 8 daily periods. The analyzer then runs on the two releases.
"""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path

import avro.datafile
import avro.io
import avro.schema
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import run as run_pipeline
from pipelines import shuffle as shuffle_pipeline
from pipelines import simulate as simulate_pipeline
from pipelines.commandline import main as cli
from pipelines.commandline.main import UsageError
from privacy.rng import seeded_generator
from schemas import SCHEMA_DIR, crc32c, schema_json
from schemas.recipes import load_recipe, recipe_names
from transforms.analyzer.report_files import read_reports

pytestmark = pytest.mark.slow

FNAPI = ["--runner=FnApiRunner"]
MULTI_PROCESS = [
    "--runner=FnApiRunner",
    "--direct_running_mode=multi_processing",
    "--direct_num_workers=2",
]
PORTABLE = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]

IMAGE_RESPONDENTS = 20_000
LONGITUDINAL_RESPONDENTS = 3_000


def _recipe(directory: Path, name: str, randomizer: str, params: dict, **extra) -> str:
    data = {
        "name": name,
        "version": 1,
        "channel": name,
        "randomizer": randomizer,
        "randomizer_params": params,
        "fragmentation": "attribute",
        "epsilon_local": params["epsilon"],
        # The target is the local epsilon, so the devices' Check 3 admits small test crowds.
        "epsilon_central_target": params["epsilon"],
        "delta": 1e-6,
        "min_crowd_size": 1000,
        "query_class": "test",
        "data_fields": ["value"],
        "shuffler_instances": 2,
        "window": "1d",
    }
    data.update(extra)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data))
    load_recipe(str(path))  # valid
    return str(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    recipes = {
        "image": _recipe(root, "grid", "one_hot_rappor", {"domain_size": 4096, "epsilon": 6.0}),
        "withheld": _recipe(root, "tiny", "one_hot_rappor", {"domain_size": 4, "epsilon": 2.0}),
        "longitudinal": _recipe(
            root, "daily", "longitudinal", {"periods": 8, "max_changes": 2, "epsilon": 1.0}
        ),
    }
    populations = {
        "image": ("image:disc", IMAGE_RESPONDENTS),
        "withheld": ("uniform", 200),  # below the crowd threshold of 1000 in both instances
        "longitudinal": ("longitudinal", LONGITUDINAL_RESPONDENTS),
    }
    for seed, (name, (population, respondents)) in enumerate(populations.items()):
        simulate_pipeline.run(
            PipelineOptions(
                FNAPI,
                simulate_recipe=recipes[name],
                simulate_population=population,
                simulate_respondents=respondents,
                simulate_output=str(root / "simulations" / name),
                simulate_seed=100 + seed,
            )
        )
    for instance in (0, 1):
        summary = shuffle_pipeline.run(
            PipelineOptions(
                FNAPI,
                input=str(root / "simulations" / "*" / f"instance={instance}" / "*.avro"),
                output=str(root / "shuffled" / f"instance={instance}"),
                instance=instance,
                recipe=list(recipes.values()),
            )
        )
        assert summary["adds_up"] and summary["crowds_withheld"] == 1
    return root, recipes


def _analyze(world, name: str, runner: list[str]) -> tuple[int, str, Path]:
    root, recipes = world
    output = root / f"analysis-{name}"
    argv = ["analyze", "--input", str(root / "shuffled"), "--output", str(output)]
    for path in recipes.values():
        argv += ["--recipe", path]
    argv += ["--truth", str(root / "simulations" / "image")]
    argv += ["--truth", str(root / "simulations" / "longitudinal")]
    argv += ["--failure-probability", "1e-3", "--postprocessing", "norm_sub", *runner]
    printed = io.StringIO()
    with redirect_stdout(printed):
        code = cli.main(argv)
    return code, printed.getvalue(), output


@pytest.fixture(scope="module")
def in_memory(world):
    return _analyze(world, "fnapi", FNAPI)


def test_image_estimates_match_their_standard_error(in_memory):
    code, printed, output = in_memory
    assert code == 0
    summary = _summary(output)
    [crowd] = [c for c in summary["histograms"] if c["channel"] == "grid"]
    assert crowd["respondents_effective"] == IMAGE_RESPONDENTS  # nothing deleted: n_eff = n
    accuracy = crowd["accuracy"]
    # One-hot RR has the same error variance σ² in every bucket (p1(1-p1) = p0(1-p0)), and the
    # reported stderr is σ exactly at n_eff = n. Over D = 4096 independent buckets the RMSE/σ
    # ratio has sd sqrt((2 + κ)/D)/2 ≈ 0.0111 (binomial excess kurtosis κ ≈ 0.02), so the 5%
    # tolerance is 4.5 sd: a false failure about 7e-6 of the time.
    assert accuracy["rmse"] == pytest.approx(accuracy["stderr_rms"], rel=0.05)
    assert crowd["privacy"]["epsilon_local_all"] == 6.0
    assert crowd["privacy"]["epsilon_central"] < 6.0
    assert crowd["privacy"]["epsilon_central_without_attribute_fragmentation"] is not None
    table = pq.read_table(output / "histograms.parquet")
    for column in ("window_start", "channel", "crowd", "bucket", "estimate", "stderr",
                   "raw_count", "n", "estimate_norm_sub", "truth"):  # fmt: skip
        assert column in table.column_names
    grid = table.filter(pc.equal(table["channel"], "grid"))
    assert grid.num_rows == 4096
    assert sum(grid.column("truth").to_pylist()) == IMAGE_RESPONDENTS
    pictures = sorted(p.name for p in (output / "pictures").iterdir())
    assert any(name.startswith("grid") and name.endswith("_image.png") for name in pictures)
    assert any(name.endswith("_longitudinal.png") for name in pictures)
    assert "grid" in printed and "eps_c" in printed


def test_withheld_crowd_has_a_note_and_no_estimate(in_memory):
    _, printed, output = in_memory
    summary = _summary(output)
    assert not [c for c in summary["histograms"] if c["channel"] == "tiny"]
    [note] = [n for n in summary["withheld"] if n["channel"] == "tiny"]
    # The commit records name the withholding instances, never a reason that reveals counts.
    assert not note["estimated"] and note["withheld_by"] == [0, 1]
    table = pq.read_table(output / "histograms.parquet")
    assert "tiny" not in set(table.column("channel").to_pylist())
    assert "no estimate" in printed


def test_longitudinal_marginals_stay_within_theorem_6(in_memory):
    _, _, output = in_memory
    summary = _summary(output)
    [entry] = summary["longitudinal"]
    assert entry["periods"] == 8 and entry["respondents"] == LONGITUDINAL_RESPONDENTS
    # The bound holds with probability >= 1 - 1e-3 (--failure-probability): the false-failure rate.
    assert entry["accuracy"]["within_bound"]
    table = pq.read_table(output / "longitudinal.parquet")
    error = np.abs(table.column("estimate").to_numpy() - table.column("truth").to_numpy())
    assert table.num_rows == 8 and np.all(error <= table.column("error_bound").to_numpy())


def _summary(output: Path) -> dict:
    """summary.json with the per-crowd reports and notes of reports.jsonl/ and withheld.jsonl/."""
    return {**json.loads((output / "summary.json").read_text()), **read_reports(str(output))}


def _results(output: Path):
    table = pq.read_table(output / "histograms.parquet")
    summary = _summary(output)
    for entry in summary["histograms"] + summary["longitudinal"]:
        entry.pop("privacy")  # same inputs give the same numbers; compared below anyway
    return table, summary


@pytest.mark.parametrize("mode", ["multi_process", "portable"])
def test_runner_modes_agree(world, in_memory, mode):
    runner = MULTI_PROCESS if mode == "multi_process" else PORTABLE
    code, _, output = _analyze(world, mode, runner)
    assert code == 0
    expected_table, expected = _results(in_memory[2])
    table, summary = _results(output)
    assert table.equals(expected_table)
    assert summary["histograms"] == expected["histograms"]
    assert summary["longitudinal"] == expected["longitudinal"]
    assert summary["withheld"] == expected["withheld"]
    assert summary["metrics"] == expected["metrics"]
    longitudinal = pq.read_table(output / "longitudinal.parquet")
    assert longitudinal.equals(pq.read_table(in_memory[2] / "longitudinal.parquet"))


def test_reports_from_the_reference_avro_library_are_estimated_without_bias(tmp_path):
    """Reports written with Apache's ``avro`` library (schemas/report.avsc; payloads with
    schemas/payloads.avsc) go through ``esa shuffle`` and ``esa analyze``."""
    recipe_path = _recipe(tmp_path, "ref", "one_hot_rappor", {"domain_size": 8, "epsilon": 2.0})
    recipe = load_recipe(recipe_path)
    randomizer = recipe.build_randomizer()
    rng = seeded_generator(21)
    n = 4000
    values = rng.choice(8, size=n, p=[0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    messages = randomizer.randomize(values, rng)
    instance = rng.integers(0, 2, size=len(messages))
    report_schema = avro.schema.parse((SCHEMA_DIR / "report.avsc").read_text())
    payload_schemas = {
        record["name"]: avro.schema.parse(json.dumps(record)) for record in schema_json("payloads")
    }

    def payload(record_name: str, datum: dict) -> bytes:
        buffer = io.BytesIO()
        avro.io.DatumWriter(payload_schemas[record_name]).write(
            datum, avro.io.BinaryEncoder(buffer)
        )
        return buffer.getvalue()

    census = payload("CensusPayload", {"kind": 0})
    event_time = datetime(2024, 1, 1, 1, tzinfo=UTC)  # the library wants a datetime
    for u in (0, 1):
        directory = tmp_path / "reports" / f"instance={u}"
        directory.mkdir(parents=True)
        with open(directory / "reports.avro", "wb") as handle:
            writer = avro.datafile.DataFileWriter(handle, avro.io.DatumWriter(), report_schema)
            rows = [(f"device-{i:05d}", census) for i in range(n)]
            rows += [
                (f"device-{r:05d}", payload("BucketPayload", {"kind": 1, "bucket": int(b)}))
                for r, b, i in zip(messages.respondent, messages.bucket, instance, strict=True)
                if i == u
            ]
            for origin, body in rows:
                writer.append(
                    {
                        "schema_version": 1,
                        "shuffler_instance": u,
                        "channel": recipe.channel,
                        "recipe_id": recipe.id,
                        "crowd_id": None,
                        "min_crowd_size": 1000,
                        "origin": origin,
                        "event_time": event_time,
                        "payload": body,
                        "payload_crc32c": crc32c(body),
                    }
                )
            writer.close()
        code = cli.main(
            ["shuffle", "--input", str(directory / "*.avro"), "--instance", str(u),
             "--output", str(tmp_path / "shuffled" / f"instance={u}"), "--recipe", recipe_path,
             *FNAPI]
        )  # fmt: skip
        assert code == 0
    output = tmp_path / "analysis"
    with redirect_stdout(io.StringIO()):
        code = cli.main(
            ["analyze", "--input", str(tmp_path / "shuffled"), "--output", str(output),
             "--recipe", recipe_path, "--no-pictures", *FNAPI]
        )  # fmt: skip
    assert code == 0
    table = pq.read_table(output / "histograms.parquet").sort_by("bucket")
    estimate = table.column("estimate").to_numpy()
    stderr = table.column("stderr").to_numpy()
    truth = np.bincount(values, minlength=8)
    assert set(table.column("n").to_pylist()) == {float(n)}
    # Unbiased with the stated error: each of 8 buckets within 4.5 sd (~5e-5 false failures).
    assert np.all(np.abs(estimate - truth) <= 4.5 * stderr)
    # And no bias across buckets: the mean standardized error of 8 buckets is within 4.5/sqrt(8).
    assert abs(np.mean((estimate - truth) / stderr)) <= 4.5 / math.sqrt(8)


def test_esa_run_makes_files_pictures_and_a_table(tmp_path):
    recipe_path = _recipe(
        tmp_path, "small-grid", "one_hot_rappor", {"domain_size": 256, "epsilon": 4.0},
        shuffler_instances=4,
    )  # fmt: skip
    output = tmp_path / "results"
    printed = io.StringIO()
    with redirect_stdout(printed):
        code = cli.main(
            ["run", "--output", str(output), "--recipe", recipe_path, "--population",
             "image:gradient", "--respondents", "3000", "--seed", "5", "--instances", "2",
             *FNAPI]
        )  # fmt: skip
    assert code == 0
    text = printed.getvalue()
    assert "eps_c" in text and "RMSE" in text and str(output / "analysis") in text
    assert "commit records authenticated: Ed25519" in text  # signed by default
    run = json.loads((output / "run.json").read_text())
    assert run["instances"] == 2 and run["recipe"] == "small-grid-k2@1"
    for name in ("histograms", "longitudinal", "summary"):
        assert Path(run["paths"][name]).exists()
    assert any(p.endswith("_image.png") for p in run["paths"]["pictures"])
    # Each shuffler's private outputs sit outside the folder the analyzer is given.
    assert sorted(p.name for p in (output / "releases").iterdir()) == ["instance=0", "instance=1"]
    for u in (0, 1):
        private = output / f"shuffler-{u}" / "private"
        assert (private / "metrics.json").exists() and (private / "manifest").is_dir()
    assert run["paths"]["releases"] == str(output / "releases")
    assert not list((output / "releases").rglob("manifest")) and not list(
        (output / "releases").rglob("dead_letter")
    )


def test_instances_default_to_the_recipe_and_zero_sum_is_never_spread():
    from pipelines.run import recipe_for_instances
    from schemas.recipes import load_recipe

    grid = load_recipe("image_grid_onehot")
    assert recipe_for_instances(grid, None) is grid
    assert recipe_for_instances(grid, 2).shuffler_instances == 2
    zero_sum = load_recipe("zero_sum_histogram")
    assert recipe_for_instances(zero_sum, None) is zero_sum
    with pytest.raises(cli.UsageError, match="only inside one shuffler"):
        recipe_for_instances(zero_sum, 2)


def test_the_default_population_fits_the_recipe():
    from pipelines.run import default_image, default_population

    chosen = {name: default_population(load_recipe(name)) for name in recipe_names()}
    assert chosen == {
        "heavy_hitters_cms": "heavy-hitters",
        "image_grid_onehot": default_image(),
        "image_grid_prio3": default_image(),
        "image_grid_report_fragmented": default_image(),
        "image_grid_sealed": default_image(),
        "longitudinal_boolean": "longitudinal",
        "small_asymmetric_one_hot": "zipf",
        "small_binary_rr": "zipf",
        "small_count_mean_sketch": "heavy-hitters",
        "small_longitudinal": "longitudinal",
        "small_one_hot_rappor": default_image(),
        "small_report_fragmented": default_image(),
        "small_symmetric_one_hot": "zipf",
        "small_zero_sum_histogram": "zipf",
        "zero_sum_histogram": "zipf",
    }


@pytest.mark.parametrize("name", recipe_names())
def test_every_shipped_recipe_runs_with_its_default_population(tmp_path, name):
    # One shuffler instance and 100 respondents keep it small; the recipes' minimum crowds then
    # withhold every crowd, so this checks the run itself: it completes and its counts add up.
    output = tmp_path / "results"
    with redirect_stdout(io.StringIO()):
        code = cli.main(
            ["run", "--recipe", name, "--respondents", "100", "--instances", "1", "--seed", "3",
             "--output", str(output), *FNAPI]
        )  # fmt: skip
    assert code == 0
    run = json.loads((output / "run.json").read_text())
    assert run["adds_up"] and run["respondents"] == 100


@pytest.mark.parametrize("throwaway", [True, False])
def test_a_rerun_replaces_only_its_own_throwaway_keys(tmp_path, throwaway):
    output = tmp_path / "results"
    (output / "keys").mkdir(parents=True)
    (output / "keys" / "0011223344556677.private.json").write_text("{}")
    (output / "run.json").write_text("{}")
    with pytest.raises(UsageError, match="holds an earlier esa run; pass --overwrite"):
        run_pipeline._prepare(output, overwrite=False, throwaway_keys=throwaway)
    assert (output / "run.json").exists()
    run_pipeline._prepare(output, overwrite=True, throwaway_keys=throwaway)
    assert not (output / "run.json").exists()
    assert (output / "keys").exists() is not throwaway  # --keys OUTPUT/keys is never removed


def test_a_rerun_needs_overwrite_and_a_failed_run_leaves_nothing(tmp_path, monkeypatch):
    """esa run follows the stages' rules (issue: hardening round 3, item 11): an earlier run's
    folder is replaced only with --overwrite, and a run that fails part-way removes what it
    wrote, so the next run into the same folder is not refused."""
    output = tmp_path / "results"
    argv = ["run", "--recipe", "image_grid_onehot", "--respondents", "100", "--instances", "1",
            "--seed", "3", "--output", str(output), "--unsealed", *FNAPI]  # fmt: skip

    def failing_shuffle(*args, **kwargs):
        raise RuntimeError("the shuffler's machine went away")

    monkeypatch.setattr(run_pipeline, "_shuffle_instance", failing_shuffle)
    with redirect_stdout(io.StringIO()), pytest.raises(RuntimeError, match="went away"):
        cli.main(argv)
    assert not output.exists()  # made by the failed run, removed with everything in it
    monkeypatch.undo()
    with redirect_stdout(io.StringIO()):
        assert cli.main(argv) == 0
    first = (output / "run.json").read_text()
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        assert cli.main(argv) == 2
    assert "holds an earlier esa run; pass --overwrite" in err.getvalue()
    assert (output / "run.json").read_text() == first
    with redirect_stdout(io.StringIO()):
        assert cli.main([*argv, "--overwrite"]) == 0


def test_shuffles_run_in_this_process_until_an_instance_is_large(monkeypatch):
    """--parallel-shuffles is obeyed; by default small instances (make run's 120,000 messages
    each) are shuffled one after the other in this process, and processes are started only
    when an instance's messages (data, chaff and presence) reach the threshold."""
    monkeypatch.setattr(run_pipeline.os, "cpu_count", lambda: 8)
    limit = run_pipeline.PROCESS_SHUFFLE_MIN_MESSAGES
    small = {"messages_per_instance": [80_000, 80_000], "chaff_per_instance": [10_000, 10_000],
             "presence_per_instance": [40_000, 40_000]}  # fmt: skip
    assert run_pipeline.shuffle_processes(None, small, 2) == 1
    assert run_pipeline.shuffle_processes(2, small, 2) == 2
    assert run_pipeline.shuffle_processes(5, small, 3) == 3
    large = {"messages_per_instance": [limit - 2, 10], "chaff_per_instance": [1, 0],
             "presence_per_instance": [1, 0]}  # fmt: skip
    assert run_pipeline.shuffle_processes(None, large, 2) == 2
    large["presence_per_instance"] = [0, 0]  # one message short of the threshold
    assert run_pipeline.shuffle_processes(None, large, 2) == 1
    unsealed = {"messages_per_instance": [limit] * 3, "presence_per_instance": [0] * 3}
    assert run_pipeline.shuffle_processes(None, unsealed, 3) == 3


def test_a_large_simulation_runs_on_one_worker_process_per_cpu(monkeypatch):
    """With no runner flags, a simulation of >= SIMULATE_PROCESSES_MIN_MESSAGES messages runs on
    the multi-process DirectRunner with one shard per CPU; a small one, or one given a runner,
    keeps the flags it was given."""
    from simulators.shards import ShardContext

    monkeypatch.setattr(run_pipeline.os, "cpu_count", lambda: 2)

    def options(respondents: int, flags: list[str]) -> PipelineOptions:
        values = {"simulate_recipe": "image_grid_sealed", "simulate_population": "image:disc",
                  "simulate_respondents": respondents, "simulate_seed": 1}  # fmt: skip
        return run_pipeline.simulate_options(flags, values)

    large = options(80_000, [])
    beam_flags = large.get_all_options()
    assert beam_flags["direct_running_mode"] == "multi_processing"
    assert beam_flags["direct_num_workers"] == 2
    shards = ShardContext(simulate_pipeline.plan_from_options(large)).shards()
    sizes = [shard.stop - shard.start for shard in shards]
    assert len(sizes) == 2 and sum(sizes) == 80_000 and max(sizes) - min(sizes) <= 1
    default_shard = options(100, []).get_all_options()["simulate_messages_per_shard"]
    for small in (options(100, []), options(80_000, FNAPI)):
        kept = small.get_all_options()
        assert kept["direct_running_mode"] == "in_memory"
        assert kept["simulate_messages_per_shard"] == default_shard

"""``esa analyze`` given no runner flags spreads many crowds over worker processes
(``pipelines/analyze.py: worker_processes``, one per ``CROWDS_PER_WORKER`` crowds from two of
them): the spread analysis writes exactly what one process writes, and does spread."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_crowds
from benchmarks.common import run_child

pytestmark = pytest.mark.slow

CROWDS = 400  # 2 channels x 10 windows x 20 crowd IDs, 3 respondents each
PER_WORKER = 150  # patched: 400 crowds (the most one instance holds) make 2 workers

_ANALYZE = """
import json, sys
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines import analyze
from pipelines.commandline.flags import worker_processes_of
a = json.loads(sys.argv[1])
analyze.CROWDS_PER_WORKER = a["per_worker"]
analyze.os.cpu_count = lambda: 2
options = PipelineOptions(a["flags"], analyze_input=[a["input"]], analyze_output=a["output"],
                          analyze_recipe=a["recipes"], analyze_no_pictures=True)
summary = analyze.run(options)
print(json.dumps({"workers": worker_processes_of(options), "summary": summary["metrics"]}))
"""


def _analyze(release: Path, output: Path, recipes: list[str], flags: list[str]) -> dict:
    """An analysis in a fresh interpreter (where the driver may fork its workers)."""
    argument = {"input": str(release), "output": str(output), "recipes": recipes,
                "flags": flags, "per_worker": PER_WORKER}  # fmt: skip
    return run_child(_ANALYZE, argument)


def _files(directory: Path) -> dict[str, bytes]:
    """Every result file's bytes by its path under ``directory`` (summary.json's paths aside)."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != "summary.json"
    }


def test_many_crowds_spread_over_workers_give_what_one_process_gives(tmp_path: Path) -> None:
    recipes = bench_crowds.generate(tmp_path / "reports", CROWDS)
    release = tmp_path / "shuffled"
    shuffled = bench_crowds._stage(
        {"stage": "shuffle", "input": str(tmp_path / "reports" / "*.avro"),
         "output": str(release), "recipes": recipes},
        "fnapi",
    )  # fmt: skip
    assert shuffled["adds_up"] and shuffled["crowds"] > 0.9 * CROWDS
    one = _analyze(release, tmp_path / "one", recipes, ["--runner=FnApiRunner"])
    spread = _analyze(release, tmp_path / "spread", recipes, [])
    assert (one["workers"], spread["workers"]) == (1, 2)
    assert spread["summary"] == one["summary"] and one["summary"]["adds_up"]
    ones, spreads = _files(tmp_path / "one"), _files(tmp_path / "spread")
    assert any(name.startswith("reports.jsonl/") for name in ones)
    assert spreads == ones

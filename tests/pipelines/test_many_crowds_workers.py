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
if a.get("one_bucket"):  # every crowd of a window in one bucket: estimated by one worker
    from transforms.analyzer.arithmetic import buckets
    buckets.ANALYZER_BUCKETS = 1
if a.get("drawers"):  # each picture's drawing process, noted (forked workers inherit this)
    import os
    from pipelines import pictures
    draw = pictures.DrawPictures.process
    def process(self, element):
        for path in draw(self, element):
            with open(os.path.join(a["drawers"], os.path.basename(path)), "w") as note:
                note.write(str(os.getpid()))
            yield path
    pictures.DrawPictures.process = process
options = PipelineOptions(a["flags"], analyze_input=[a["input"]], analyze_output=a["output"],
                          analyze_recipe=a["recipes"], analyze_no_pictures=not a.get("drawers"))
summary = analyze.run(options)
print(json.dumps({"workers": worker_processes_of(options), "summary": summary["metrics"]}))
"""


def _analyze(
    release: Path, output: Path, recipes: list[str], flags: list[str], drawers: Path | None = None
) -> dict:
    """An analysis in a fresh interpreter (where the driver may fork its workers); with
    ``drawers``, with pictures, each noting there the process that drew it."""
    argument = {"input": str(release), "output": str(output), "recipes": recipes,
                "flags": flags, "per_worker": PER_WORKER,
                "drawers": str(drawers) if drawers else None,
                "one_bucket": drawers is not None}  # fmt: skip
    return run_child(_ANALYZE, argument)


def _release(tmp_path: Path) -> tuple[Path, list[str]]:
    """bench_crowds' CROWDS crowds, shuffled (FnApiRunner)."""
    recipes, shuffled = bench_crowds.shuffled_release(tmp_path, CROWDS)
    assert shuffled["adds_up"] and shuffled["crowds"] > 0.9 * CROWDS
    return tmp_path / "shuffled", recipes


def _files(directory: Path) -> dict[str, bytes]:
    """Every result file's bytes by its path under ``directory`` (summary.json's paths aside)."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != "summary.json"
    }


def test_many_crowds_spread_over_workers_give_what_one_process_gives(tmp_path: Path) -> None:
    release, recipes = _release(tmp_path)
    one = _analyze(release, tmp_path / "one", recipes, ["--runner=FnApiRunner"])
    spread = _analyze(release, tmp_path / "spread", recipes, [])
    assert (one["workers"], spread["workers"]) == (1, 2)
    assert spread["summary"] == one["summary"] and one["summary"]["adds_up"]
    ones, spreads = _files(tmp_path / "one"), _files(tmp_path / "spread")
    assert any(name.startswith("reports.jsonl/") for name in ones)
    assert spreads == ones


def test_the_pictures_are_drawn_by_every_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pictured crowds are the first in the summary's order: a few crowd IDs over their
    windows, held by a few buckets, often one worker's. Each picture costs ~0.1 s, so they are
    spread over the workers before they are drawn: here every crowd is in one window and one
    bucket, estimated by one worker, yet the 24 pictures are drawn by both workers (all by one
    of two: chance 2^-23), and are those the pictures of one process are."""
    monkeypatch.setattr(bench_crowds, "WINDOWS", 1)
    release, recipes = _release(tmp_path)
    drawers = tmp_path / "drawers"
    drawers.mkdir()
    spread = _analyze(release, tmp_path / "spread", recipes, [], drawers)
    (tmp_path / "drawn-by-one").mkdir()
    one_flags = ["--runner=FnApiRunner"]
    one = _analyze(release, tmp_path / "one", recipes, one_flags, tmp_path / "drawn-by-one")
    assert (one["workers"], spread["workers"]) == (1, 2)
    assert spread["summary"] == one["summary"]
    drawn = {path.name: path.read_text() for path in drawers.iterdir()}
    assert len(drawn) == 24 and len(set(drawn.values())) == 2
    pictured = {path.name for path in (tmp_path / "one" / "pictures").iterdir()}
    assert (
        set(drawn)
        == pictured
        == {path.name for path in (tmp_path / "spread" / "pictures").iterdir()}
    )

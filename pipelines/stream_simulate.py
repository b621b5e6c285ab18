"""``esa simulate --stream``: the device fleet's report files appear window after window, in
compressed real time, for streaming shufflers to follow.

    esa simulate --stream --windows N --window-seconds S --recipe R --output DIR [...]

The fleet is simulated first, exactly as ``esa simulate`` does with ``--rounds N`` (same seed,
same reports), into ``DIR/_fleet/``; its truth (``truth.parquet``) and ``simulation.json`` are
copied to DIR at once, so an analyzer can be given ``--truth DIR`` from the start. Then window k's
reports of instance u are written to ``DIR/instance=<u>/reports-w<k>-c<j>.avro`` in
``CHUNKS`` files, in event-time order, chunk j at S·(k + j/CHUNKS) seconds after the replay began:
a day of device time passes in S seconds. Each file is written under a hidden name and renamed
when complete, as a collector commits an upload: a follower never sees half a file.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline.main import UsageError
from pipelines.commandline.simulate_options import SimulateOptions
from schemas import parsed_schema, schema_json
from schemas.avro.container import encode_container
from transforms.common import avro_io

FLEET_DIR = "_fleet"
SUMMARY_FILE = "simulation.json"  # the fleet's, copied beside its truth
CHUNKS = 2


def _instance_folders(fleet: Path) -> list[Path]:
    return sorted(
        (path for path in fleet.iterdir() if path.is_dir() and path.name.startswith("instance=")),
        key=lambda path: int(path.name.split("=", 1)[1]),
    )


def window_rows(folder: Path, start_ms: int, window_ms: int) -> pa.Table | None:
    """The reports of one instance's files whose event time falls in [start, start + window),
    in event-time order (None when there are none)."""
    parts = []
    for path in sorted(folder.glob("*.avro")):
        for item in avro_io.read_avro_batches(str(path), 65_536, schema_json("report")):
            if isinstance(item, avro_io.UnreadableChunk):
                raise OSError(f"{path}: {item.detail}")
            times = item.columns.column("event_time").to_numpy().astype(np.int64)
            inside = (times >= start_ms) & (times < start_ms + window_ms)
            if inside.any():
                parts.append(item.columns.filter(pa.array(inside)))
    if not parts:
        return None
    return pa.Table.from_batches(parts).sort_by("event_time")


def write_atomically(path: Path, rows: pa.Table) -> None:
    batch = rows.combine_chunks().to_batches()[0] if rows.num_rows else None
    if batch is None:
        return
    columns = {name: batch.column(name) for name in batch.schema.names}
    content = encode_container(parsed_schema("report"), columns, batch.num_rows, "deflate")
    path.parent.mkdir(parents=True, exist_ok=True)
    hidden = path.parent / f".{path.name}.partial"
    hidden.write_bytes(content)
    os.replace(hidden, path)


def prepare(
    options: PipelineOptions, simulate: Callable[[PipelineOptions], dict[str, Any]]
) -> dict[str, Any]:
    """Simulate the whole fleet with ``simulate`` (the batch simulation's ``run``, given by
    pipelines/simulate.py) into ``DIR/_fleet`` and put its truth and summary in DIR; returns
    simulation.json's content."""
    values = options.view_as(SimulateOptions)
    output = Path(values.simulate_output)
    if output.exists() and any(output.iterdir()):
        if not values.simulate_overwrite:
            raise UsageError(f"--output {output} is not empty; pass --overwrite to replace it")
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)
    given = options.get_all_options(drop_default=True, retain_unknown_options=True)
    given.update(
        simulate_output=str(output / FLEET_DIR),
        simulate_rounds=values.simulate_windows,
        simulate_stream=False,
        simulate_overwrite=True,
    )
    summary = simulate(PipelineOptions([], **given))
    for name in (summary["truth"], SUMMARY_FILE):
        shutil.copyfile(output / FLEET_DIR / name, output / name)
    return summary


def replay(
    output: Path,
    summary: dict[str, Any],
    window_seconds: float,
    say: Callable[[str], None] = lambda text: None,
) -> list[dict[str, Any]]:
    """Write the fleet's files window after window (see the module docstring); returns one
    entry per file written."""
    fleet = output / FLEET_DIR
    window_ms = int(summary["window_ms"])
    start_ms = int(
        min(
            np.int64(item.columns.column("event_time").to_numpy().min())
            for folder in _instance_folders(fleet)
            for path in folder.glob("*.avro")
            for item in avro_io.read_avro_batches(str(path), 65_536, schema_json("report"))
            if not isinstance(item, avro_io.UnreadableChunk)
        )
    )
    start_ms -= start_ms % window_ms
    windows = int(summary["rounds"])
    began = time.monotonic()
    written = []
    for window in range(windows):
        window_start = start_ms + window * window_ms
        rows = {
            folder.name: window_rows(folder, window_start, window_ms)
            for folder in _instance_folders(fleet)
        }
        for chunk in range(CHUNKS):
            delay = began + window_seconds * (window + chunk / CHUNKS) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for instance, table in rows.items():
                if table is None:
                    continue
                bounds = np.linspace(0, table.num_rows, CHUNKS + 1).astype(int)
                part = table.slice(bounds[chunk], bounds[chunk + 1] - bounds[chunk])
                path = output / instance / f"reports-w{window:05d}-c{chunk}.avro"
                write_atomically(path, part)
                written.append({"path": str(path), "records": part.num_rows, "window": window})
        say(f"devices: window {window} ({window_start} ms) written")
    return written


def run(
    options: PipelineOptions, simulate: Callable[[PipelineOptions], dict[str, Any]]
) -> dict[str, Any]:
    """``esa simulate --stream``: prepare, then replay; returns simulation.json plus the files."""
    values = options.view_as(SimulateOptions)
    summary = prepare(options, simulate)
    files = replay(Path(values.simulate_output), summary, values.simulate_window_seconds)
    return {
        **summary,
        "stream": {"window_seconds": values.simulate_window_seconds, "files": len(files)},
    }

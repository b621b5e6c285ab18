"""``--codec snappy`` is offered, so it is tested: a simulation written with snappy blocks holds
exactly the records of the same simulation written with deflate, read back by fastavro and by the
project's own reader (transforms/avro_io)."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro

from pipelines.commandline.main import main
from transforms.common.avro_io import ColumnBatch, read_avro_batches


def _simulate(tmp_path: Path, codec: str) -> Path:
    output = tmp_path / codec
    argv = ["simulate", "--output", str(output), "--runner=FnApiRunner", "--codec", codec]
    argv += ["--recipe", "heavy_hitters_cms", "--population", "zipf", "--respondents", "300"]
    assert main([*argv, "--seed", "7"]) == 0
    return output


def _records(directory: Path, codec: str) -> list[dict]:
    records = []
    for path in sorted(directory.glob("instance=*/*.avro")):
        with path.open("rb") as handle:
            reader = fastavro.reader(handle)
            assert reader.codec == codec
            records.extend(reader)
    return records


def test_snappy_containers_hold_the_same_records_as_deflate(tmp_path, capsys):
    snappy, deflate = _simulate(tmp_path, "snappy"), _simulate(tmp_path, "deflate")
    capsys.readouterr()
    records = _records(snappy, "snappy")
    assert records and records == _records(deflate, "deflate")
    summary = json.loads((snappy / "simulation.json").read_text())
    assert summary["codec"] == "snappy"
    rows = 0
    for path in sorted(snappy.glob("instance=*/*.avro")):
        for item in read_avro_batches(str(path)):
            assert isinstance(item, ColumnBatch), item
            rows += item.rows
    assert rows == len(records)

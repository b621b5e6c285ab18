"""Dead-letter files (``schemas/dead_letter.avsc``): what a stage rejected, why and from where,
written to the stage's private output (the shuffler's private folder, the analyzer's output)."""

from __future__ import annotations

import hashlib
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from schemas import parsed_schema
from transforms.common import avro_io


def _content_name(letters: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for letter in letters:
        digest.update(f"{letter['stage']}|{letter['reason']}|{letter['source']}\n".encode())
    return f"part-{digest.hexdigest()[:32]}.avro"


class WriteDeadLetters(beam.PTransform):
    """Lists of dead letters -> DIR/dead_letter/part-<digest>.avro files (named by content, so a
    retried bundle overwrites its file)."""

    def __init__(self, output_dir: str) -> None:
        super().__init__()
        self._output_dir = output_dir

    def expand(self, letters: beam.PCollection) -> beam.PCollection:
        output_dir = self._output_dir

        def write(batch: list[dict[str, Any]]) -> str:
            path = FileSystems.join(output_dir, "dead_letter", _content_name(batch))
            avro_io.write_avro(path, parsed_schema("dead_letter"), batch)
            return path

        return letters | "WriteDeadLetterFile" >> beam.Map(write)

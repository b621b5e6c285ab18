"""An upload's body (an Avro container of Report records, ``schemas/uploads.py``) into records.

Uploads are small (a device's few messages), so the per-file work of the bulk reader
(``schemas/avro/reader.py``: schema parsing and resolution, vectorized decoding) would cost more
than the records: here the writer schemas seen are resolved once and cached, each block is
checked (count, size, sync marker) and its records are decoded with fastavro's schemaless
reader against the Report schema. Anything that is not exactly that is :class:`Malformed`.
"""

from __future__ import annotations

import io
import json
import zlib
from typing import Any

import fastavro

from schemas import REPORT, schema_json
from schemas.avro.container import ByteStream, Corrupt, read_header
from schemas.avro.schema import resolution_problem, strip_logical_types

__all__ = ["Malformed", "TooManyRecords", "UploadDecoder"]

_MAX_WRITER_SCHEMAS = 64
_INFLATION = 16  # a deflate block may expand to at most this many times the body limit


class Malformed(ValueError):
    """Not an Avro container of Report records."""


class TooManyRecords(ValueError):
    """More records than one upload may hold."""


class UploadDecoder:
    """Decodes upload bodies for one collector (see the module docstring)."""

    def __init__(self, max_records: int, max_body_bytes: int) -> None:
        self.max_records = max_records
        self.max_inflated = max_body_bytes * _INFLATION
        self.reader = strip_logical_types(schema_json(REPORT))
        self._reader_parsed = fastavro.parse_schema(self.reader)
        self._writers: dict[bytes, Any] = {}

    def _writer(self, text: bytes) -> Any:
        if text in self._writers:
            found = self._writers[text]
        else:
            try:
                writer = strip_logical_types(json.loads(text))
                problem = resolution_problem(writer, self.reader)
                found = None if problem else fastavro.parse_schema(writer)
            except Exception:  # not JSON, not a schema fastavro accepts
                found = None
            if len(self._writers) < _MAX_WRITER_SCHEMAS:
                self._writers[text] = found
        if found is None:
            raise Malformed("the writer schema does not resolve to Report")
        return found

    def _inflate(self, codec: bytes, data: bytes) -> bytes:
        if codec == b"null":
            return data
        if codec == b"deflate":
            inflater = zlib.decompressobj(-15)
            try:
                out = inflater.decompress(data, self.max_inflated)
            except zlib.error as error:
                raise Malformed(f"bad deflate block: {error}") from None
            if inflater.unconsumed_tail or not inflater.eof:
                raise Malformed("deflate block too large or cut")
            return out
        raise Malformed(f"codec {codec[:20]!r} is not null or deflate")

    def decode(self, body: bytes) -> list[dict[str, Any]]:
        """The records of ``body`` (Malformed, TooManyRecords)."""
        stream = ByteStream(io.BytesIO(body))
        try:
            header = read_header(stream)
            writer = self._writer(header.metadata.get("avro.schema", b""))
            codec = header.metadata.get("avro.codec", b"null") or b"null"
            records: list[dict[str, Any]] = []
            while not stream.at_end():
                count, size = stream.read_long(), stream.read_long()
                if count < 1 or size < 0 or size > len(body):
                    raise Malformed("bad block header")
                if len(records) + count > self.max_records:
                    raise TooManyRecords(f"more than {self.max_records} records")
                data = self._inflate(codec, stream.read_exact(size))
                if stream.read_exact(len(header.sync)) != header.sync:
                    raise Malformed("bad sync marker")
                buffer = io.BytesIO(data)
                for _ in range(count):
                    records.append(fastavro.schemaless_reader(buffer, writer, self._reader_parsed))
                if buffer.tell() != len(data):
                    raise Malformed("a block holds more bytes than its records")
        except (Malformed, TooManyRecords):
            raise
        except Corrupt as error:
            raise Malformed(str(error)) from None
        except Exception as error:  # fastavro on bad bytes: EOFError, ValueError, ...
            raise Malformed(f"records do not decode: {type(error).__name__}") from None
        if not records:
            raise Malformed("no record")
        return records

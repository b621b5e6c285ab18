"""The Avro codec (pure: no Beam, no files named by path).

- :mod:`~schemas.avro.varint`: zig-zag varints, one value or whole arrays;
- :mod:`~schemas.avro.container`: container header, block framing, sync markers and resync,
  compression codecs, the one streaming :class:`~schemas.avro.container.ContainerWriter`;
- :mod:`~schemas.avro.encode`: Arrow/numpy columns -> Avro binary records;
- :mod:`~schemas.avro.decode`: Avro binary of flat records -> Arrow columns;
- :mod:`~schemas.avro.columns`: Arrow types and batches of decoded values;
- :mod:`~schemas.avro.schema`: writer schemas: logical types, resolution, projection;
- :mod:`~schemas.avro.reader`: container files -> column batches and unreadable chunks;
- :mod:`~schemas.avro.crc32c`: CRC32C of many byte strings at once.

Files on Beam filesystems: :mod:`transforms.common.avro_io`.
"""

"""The ``esa`` command line and the runnable pipelines (simulate, shuffle, analyze, run).

Importing this package quiets one warning Beam's GCP I/O logs while it is imported when the
optional Google client libraries are absent ("apitools not found"): nothing here uses them, and
every process that runs a stage (worker processes too) imports this package before Beam.
"""

from __future__ import annotations

import logging


class _QuietBeamImport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in str(record.msg)


def quiet_beam_import() -> None:
    """Drop Beam's "apitools not found" warning from the root logger (idempotent)."""
    root = logging.getLogger()
    if not any(isinstance(existing, _QuietBeamImport) for existing in root.filters):
        root.addFilter(_QuietBeamImport())


quiet_beam_import()

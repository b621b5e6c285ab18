"""Bundles that did work, counted: how the tests see one crowd's (or one file's) work spread."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.shuffler.config import BUNDLES_PREFIX, METRICS_NAMESPACE


class CountsBundles(beam.DoFn):
    """A DoFn that counts its bundles that did work in the Beam counter ``bundles:<class name>``
    (``config.BUNDLES_PREFIX``): one crowd's shards or groups spread over workers only if they
    arrive in several bundles. Subclasses call ``self.worked()`` in ``process``."""

    _did_work = False

    def worked(self) -> None:
        self._did_work = True

    def start_bundle(self) -> None:
        self._did_work = False

    def finish_bundle(self) -> None:
        if self._did_work:
            Metrics.counter(METRICS_NAMESPACE, BUNDLES_PREFIX + type(self).__name__).inc()

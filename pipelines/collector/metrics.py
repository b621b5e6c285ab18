"""The collector's counters and their Prometheus text exposition (format 0.0.4)."""

from __future__ import annotations

import bisect
from collections import Counter

__all__ = ["REJECTIONS", "CollectorMetrics"]

# reason -> HTTP status: every refusal the collector gives, each with its own counter.
REJECTIONS = {
    "no_credentials": 401,
    "unknown_device": 401,
    "bad_credentials": 401,
    "clock_skew": 401,
    "bad_signature": 401,
    "replayed_nonce": 409,
    "too_large": 413,
    "slow_client": 408,
    "malformed": 400,
    "wrong_instance": 400,
    "too_many_records": 400,
    "rate_limited": 429,
    "queue_full": 503,
    "shutting_down": 503,
    "store_failed": 503,
    "internal": 500,
}
_FSYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class CollectorMetrics:
    """Counts of everything the collector did; ``text()`` renders them for ``/metrics``."""

    def __init__(self, instance: int) -> None:
        self.instance = instance
        self.uploads_accepted = 0
        self.reports_accepted = 0
        self.uploads_duplicate = 0
        self.bytes_received = 0
        self.files_committed = 0
        self.rejected: Counter[str] = Counter({reason: 0 for reason in REJECTIONS})
        self.fsync_buckets = [0] * (len(_FSYNC_BUCKETS) + 1)
        self.fsync_count = 0
        self.fsync_sum = 0.0
        self.queue_depth = 0
        self.open_connections = 0

    def reject(self, reason: str) -> int:
        self.rejected[reason] += 1
        return REJECTIONS[reason]

    def observe_fsync(self, seconds: float) -> None:
        self.fsync_buckets[bisect.bisect_left(_FSYNC_BUCKETS, seconds)] += 1
        self.fsync_count += 1
        self.fsync_sum += seconds

    def text(self) -> str:
        label = f'instance="{self.instance}"'
        lines = []

        def metric(name: str, kind: str, text: str, value: float, extra: str = "") -> None:
            lines.append(f"# HELP esa_collector_{name} {text}")
            lines.append(f"# TYPE esa_collector_{name} {kind}")
            lines.append(f"esa_collector_{name}{{{label}{extra}}} {value}")

        metric("uploads_accepted_total", "counter", "Uploads stored.", self.uploads_accepted)
        metric("reports_accepted_total", "counter", "Reports stored.", self.reports_accepted)
        metric(
            "uploads_duplicate_total",
            "counter",
            "Retried uploads answered from the dedupe memory, not stored again.",
            self.uploads_duplicate,
        )
        metric("bytes_received_total", "counter", "Request body bytes read.", self.bytes_received)
        metric("files_committed_total", "counter", "Report files committed.", self.files_committed)
        metric("queue_depth", "gauge", "Uploads waiting to be stored.", self.queue_depth)
        lines.append("# HELP esa_collector_rejected_total Requests refused, by reason.")
        lines.append("# TYPE esa_collector_rejected_total counter")
        for reason in sorted(self.rejected):
            lines.append(
                f'esa_collector_rejected_total{{{label},reason="{reason}"}} {self.rejected[reason]}'
            )
        lines.append("# HELP esa_collector_fsync_seconds Time to sync one group of uploads.")
        lines.append("# TYPE esa_collector_fsync_seconds histogram")
        cumulative = 0
        for bound, count in zip(_FSYNC_BUCKETS, self.fsync_buckets, strict=False):
            cumulative += count
            lines.append(f'esa_collector_fsync_seconds_bucket{{{label},le="{bound}"}} {cumulative}')
        lines.append(f'esa_collector_fsync_seconds_bucket{{{label},le="+Inf"}} {self.fsync_count}')
        lines.append(f"esa_collector_fsync_seconds_sum{{{label}}} {self.fsync_sum:.6f}")
        lines.append(f"esa_collector_fsync_seconds_count{{{label}}} {self.fsync_count}")
        return "\n".join(lines) + "\n"

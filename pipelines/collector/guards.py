"""What stands between a hostile client and the collector's files: clock-skew check, nonce
memory and a per-device rate limit (pure: no server, no files).

Nonces are remembered in memory for twice the allowed skew after their timestamp (a request
older than the skew is refused before its nonce is looked at, so older nonces cannot come back).
After a restart the memory is empty; a replayed upload is then still stored at most once,
because its report id is signed and remembered on disk (``store.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["NonceMemory", "RateLimiter", "skewed"]


def skewed(timestamp_ms: int, now_ms: int, max_skew_ms: int) -> bool:
    """Whether a device's timestamp is further than ``max_skew_ms`` from the collector's clock."""
    return abs(now_ms - timestamp_ms) > max_skew_ms


@dataclass
class NonceMemory:
    """(device, nonce) pairs seen within the skew window."""

    max_skew_ms: int
    _seen: dict[tuple[str, str], int] = field(default_factory=dict)
    _next_purge_ms: int = 0

    def first_use(self, device: str, nonce: str, timestamp_ms: int, now_ms: int) -> bool:
        """True the first time a device uses ``nonce``; False for a replay."""
        if now_ms >= self._next_purge_ms:
            cutoff = now_ms - 2 * self.max_skew_ms
            self._seen = {key: ts for key, ts in self._seen.items() if ts >= cutoff}
            self._next_purge_ms = now_ms + max(self.max_skew_ms // 4, 1000)
        key = (device, nonce)
        if key in self._seen:
            return False
        self._seen[key] = timestamp_ms
        return True

    def __len__(self) -> int:
        return len(self._seen)


@dataclass
class RateLimiter:
    """A token bucket per device: ``rate`` uploads per second, bursts of ``burst``."""

    rate: float
    burst: float
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def take(self, device: str, now: float) -> float:
        """0.0 when the device may upload now (a token is taken), else the seconds until it
        may (for ``Retry-After``)."""
        tokens, last = self._buckets.get(device, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._buckets[device] = (tokens - 1.0, now)
            return 0.0
        self._buckets[device] = (tokens, now)
        return (1.0 - tokens) / self.rate

    @staticmethod
    def retry_after(seconds: float) -> str:
        return str(max(1, math.ceil(seconds)))

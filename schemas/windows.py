"""Event-time windows: the window every report is assigned to and every shuffled message carries
(``window_start``, ``window_end``), and the durations flags give them in. Shared by the devices,
the shuffler (which assigns windows) and the analyzer (which reads them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

# Event times a window can be assigned to: 1970-01-01 up to year 9999, in milliseconds.
MIN_EVENT_TIME_MS = 0
MAX_EVENT_TIME_MS = 253_402_300_799_999


_DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


_DURATION_PATTERN = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration_ms(text: str) -> int:
    """``"1d"``, ``"6h"``, ``"30m"``, ``"90s"``, ``"500ms"`` as a positive number of milliseconds."""
    match = _DURATION_PATTERN.match(str(text))
    if not match:
        raise ValueError(f"duration must look like 1d, 6h, 30m, 90s or 500ms, got {text!r}")
    value = int(match.group(1)) * _DURATION_UNITS_MS[match.group(2)]
    if value <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class WindowSpec:
    """Fixed event-time windows: [offset + k * period, offset + (k + 1) * period) in ms."""

    period_ms: int = 86_400_000
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.period_ms, int) or self.period_ms <= 0:
            raise ValueError(f"period_ms must be a positive int, got {self.period_ms!r}")
        if not isinstance(self.offset_ms, int) or not 0 <= self.offset_ms < self.period_ms:
            raise ValueError(f"offset_ms must be an int in [0, period_ms), got {self.offset_ms!r}")


# Per-window release folders (streaming shufflers: OUTPUT/window=<start>/, one esa-release/2
# each) and the streaming analyzer's partitions (histograms.parquet/window=<start>/).
WINDOW_PREFIX = "window="


def window_name(start_ms: int) -> str:
    """``window=20240101T000000Z`` (``.250`` before the Z for a start with milliseconds)."""
    moment = datetime.fromtimestamp(start_ms / 1000, UTC)
    millis = start_ms % 1000
    return f"{WINDOW_PREFIX}{moment:%Y%m%dT%H%M%S}" + (f".{millis:03d}" if millis else "") + "Z"


def parse_window_name(name: str) -> int | None:
    """The window start (ms) a :func:`window_name` names, or None for any other name."""
    if not name.startswith(WINDOW_PREFIX) or not name.endswith("Z"):
        return None
    text = name[len(WINDOW_PREFIX) : -1]
    seconds, _, millis = text.partition(".")
    try:
        moment = datetime.strptime(seconds, "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    if millis and not (len(millis) == 3 and millis.isdigit()):
        return None
    start = int(moment.timestamp()) * 1000 + (int(millis) if millis else 0)
    return start if window_name(start) == name else None

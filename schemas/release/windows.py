"""Names of per-window release folders: ``window=<start>``, as streaming shufflers write them
(``OUTPUT/window=20240101T000000Z/``, one ``esa-release/2`` each) and the streaming analyzer
partitions its results (``histograms.parquet/window=20240101T000000Z/``)."""

from __future__ import annotations

from datetime import UTC, datetime

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

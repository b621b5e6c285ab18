"""Free TCP ports on this machine for the engines' servers (job servers, Flink's JobManager)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this machine now (for a server about to start)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

"""Real collectors for the tests: ``esa collect`` in a subprocess on 127.0.0.1, its enrolment
registry and TLS, signed requests made by hand (everything only to 127.0.0.1)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.crypto.device_keys import enrol_devices, load_credentials
from schemas.crypto.tls_certificates import make_collector_tls
from schemas.uploads import PATH, upload_headers
from simulators.uploads import client_tls_context

ROOT = Path(__file__).resolve().parents[2]
START_S = 60.0


@dataclass
class Keys:
    devices: Path
    tls: Path

    @property
    def ca(self) -> Path:
        return self.tls / "ca.crt"

    def credentials(self) -> list[Any]:
        return load_credentials(self.devices)


def make_keys(root: Path, devices: int) -> Keys:
    enrol_devices(devices, root / "devices")
    make_collector_tls(root / "tls", ["127.0.0.1"])
    return Keys(root / "devices", root / "tls")


class Collector:
    """``esa collect`` as a subprocess; ``port`` once it listens."""

    def __init__(self, keys: Keys, output: Path, instance: int = 0, port: int = 0, *flags: str):
        self.keys, self.output, self.instance = keys, output, instance
        command = [
            sys.executable, "-m", "pipelines.commandline.main", "collect",
            "--instance", str(instance), "--listen", f"127.0.0.1:{port}",
            "--output", str(output), "--registry", str(keys.devices), "--tls", str(keys.tls),
            *flags,
        ]  # fmt: skip
        self.log = output.parent / f"{output.name}-{time.monotonic_ns()}.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True
            )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()))
        reader.start()
        reader.join(START_S)
        if not line or not line[0].strip():
            self.process.kill()
            raise AssertionError(f"collector did not start: {self.log.read_text()[-2000:]}")
        self.port = json.loads(line[0])["port"]
        self.url = f"https://127.0.0.1:{self.port}"

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=client_tls_context(self.keys.ca), timeout=30
        )
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def upload(
        self,
        credential: Any,
        body: bytes,
        report_id: str,
        timestamp_ms: int | None = None,
        instance: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        signed = upload_headers(
            credential,
            self.instance if instance is None else instance,
            report_id,
            body,
            int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
        )
        return self.request("POST", PATH, body, {**signed, **(headers or {})})

    def metrics(self) -> dict[str, float]:
        status, _, text = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def rejected(self, reason: str) -> float:
        return self.metrics()[
            f'esa_collector_rejected_total{{instance="{self.instance}",reason="{reason}"}}'
        ]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(START_S)

    def stderr(self) -> str:
        return self.log.read_text()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def env_ok() -> bool:
    return os.name == "posix"

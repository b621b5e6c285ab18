"""The collector's HTTPS service (aiohttp on asyncio; TLS from the standard library's ``ssl``).

``POST /v1/reports`` (the protocol: ``schemas/uploads.py``) goes through, in order: credentials
present and the device enrolled (401), timestamp within the allowed skew (401), body size
(413, from ``Content-Length`` before reading, else while reading) and read time (408), the
Ed25519 signature over instance, device, timestamp, nonce, report id and body digest (401), the
nonce not seen before (409), the device's rate limit (429 with ``Retry-After``), the report id
not stored before (200, ``duplicate``: stored once), the body an Avro container of Report
records for this instance (400), room in the queue (503 with ``Retry-After``). Then the records
(decoded by ``bodies.py``) get the collector's ``origin`` (``schemas.crypto.device_keys.origin_for`` the signing key id:
whatever origin the device wrote is dropped) and receive time, and wait for the writer: one task
that stores groups of uploads (``store.py``: block, fdatasync, journal, fdatasync) in a
thread and only then answers them 200. Every refusal has a reason and a counter
(``metrics.py``); an unexpected error is a 500 counted as ``internal``, never a crash.

A connection that has not sent a whole request header ``keepalive_s`` after it opened (or after
its last request) is closed by aiohttp, so clients that dribble headers hold their own socket
for that long at most.

``GET /healthz`` answers ``ok``; ``GET /metrics`` the Prometheus text. :meth:`Collector.stop`
(SIGTERM in ``esa collect``) stops accepting connections, lets the requests in flight finish,
drains the queue and commits the open file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from pipelines.collector.bodies import Malformed, TooManyRecords, UploadDecoder
from pipelines.collector.guards import NonceMemory, RateLimiter, skewed
from pipelines.collector.metrics import CollectorMetrics
from pipelines.collector.store import Accepted, ReportStore
from schemas.crypto.device_keys import DeviceRegistry, origin_for
from schemas.uploads import (
    DEVICE,
    NONCE,
    PATH,
    REPORT_ID,
    SIGNATURE,
    TIMESTAMP,
    signed_message,
    valid_nonce,
    valid_report_id,
)

__all__ = ["CollectorConfig", "Collector", "server_tls_context"]

log = logging.getLogger("esa.collect")
_STOP = object()


@dataclass(frozen=True)
class CollectorConfig:
    """What one collector enforces; every limit is a flag of ``esa collect``."""

    instance: int
    output: Path
    max_body_bytes: int = 1 << 20
    max_records: int = 10_000
    max_skew_ms: int = 300_000
    body_timeout_s: float = 10.0
    device_rate: float = 10.0
    device_burst: float = 20.0
    queue_uploads: int = 20_000
    group_uploads: int = 4_096
    rotate_bytes: int = 64 << 20
    rotate_age_s: float = 60.0
    dedupe_window_ms: int = 86_400_000
    codec: str = "deflate"
    keepalive_s: float = 30.0
    shutdown_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        checks = (
            ("instance", self.instance, 0),
            ("max_body_bytes", self.max_body_bytes, 1),
            ("max_records", self.max_records, 1),
            ("max_skew_ms", self.max_skew_ms, 1),
            ("queue_uploads", self.queue_uploads, 1),
            ("group_uploads", self.group_uploads, 1),
            ("rotate_bytes", self.rotate_bytes, 1),
            ("dedupe_window_ms", self.dedupe_window_ms, 0),
        )
        for name, value, low in checks:
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        for name, value in (
            ("body_timeout_s", self.body_timeout_s),
            ("device_rate", self.device_rate),
            ("device_burst", self.device_burst),
            ("rotate_age_s", self.rotate_age_s),
            ("keepalive_s", self.keepalive_s),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")


def server_tls_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """The server side of TLS (1.2 or later, the standard library's defaults)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


class _Refused(Exception):
    def __init__(self, reason: str, retry_after: str | None = None, close: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.close = close


class Collector:
    """One shuffler instance's collector: the aiohttp application, its writer and its store."""

    def __init__(
        self,
        config: CollectorConfig,
        registry: DeviceRegistry,
        clock: Any = time.time,
    ) -> None:
        self.config = config
        self.registry = registry
        self.clock = clock
        self.metrics = CollectorMetrics(config.instance)
        self.nonces = NonceMemory(config.max_skew_ms)
        self.limiter = RateLimiter(config.device_rate, config.device_burst)
        self.store = ReportStore(
            config.output,
            config.instance,
            rotate_bytes=config.rotate_bytes,
            rotate_age_s=config.rotate_age_s,
            dedupe_window_ms=config.dedupe_window_ms,
            codec=config.codec,
            clock=clock,
        )
        self.metrics.files_committed = self.store.committed
        self._decoder = UploadDecoder(config.max_records, config.max_body_bytes)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending: dict[tuple[str, str], asyncio.Future[int]] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "esa-collect-writer")
        self._writer: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self.app = web.Application(middlewares=[self._count_errors])
        self.app.router.add_post(PATH, self._upload)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/metrics", self._metrics)

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        self._writer = asyncio.create_task(self._write_loop())
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=self.config.keepalive_s,
            shutdown_timeout=self.config.shutdown_timeout_s,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=tls, backlog=1024)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Graceful: stop accepting, finish the requests in flight, drain, commit."""
        self._stopping = True
        if self._runner is not None:
            await self._runner.cleanup()  # closes the listener, waits for handlers
        if self._writer is not None:
            await self._queue.put(_STOP)
            await self._writer
        loop = asyncio.get_running_loop()
        committed = await loop.run_in_executor(self._executor, self.store.close)
        if committed is not None:
            self.metrics.files_committed += 1
        self._executor.shutdown()

    # -- the writer ----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        tick = min(1.0, self.config.rotate_age_s / 4)
        stopping = False
        while not stopping:
            group: list[tuple[Accepted, asyncio.Future[int]]] = []
            try:
                item = await asyncio.wait_for(self._queue.get(), timeout=tick)
            except TimeoutError:
                item = None
            while item is not None:
                if item is _STOP:
                    stopping = True
                else:
                    group.append(item)
                if len(group) >= self.config.group_uploads or self._queue.empty():
                    break
                item = self._queue.get_nowait()
            if stopping:  # drain whatever is left
                while not self._queue.empty():
                    rest = self._queue.get_nowait()
                    if rest is not _STOP:
                        group.append(rest)
            if group:
                await self._store_group(loop, group)
            rotated = await loop.run_in_executor(self._executor, self.store.rotate_if_due)
            if rotated is not None:
                self.metrics.files_committed += 1

    async def _store_group(
        self, loop: asyncio.AbstractEventLoop, group: list[tuple[Accepted, asyncio.Future[int]]]
    ) -> None:
        uploads = [upload for upload, _ in group]
        try:
            seconds = await loop.run_in_executor(self._executor, self.store.append, uploads)
        except Exception as error:  # disk full, I/O error: nothing of the group is stored
            if len(group) > 1 and not isinstance(error, OSError):
                # Not the disk: one upload the encoder refuses must not fail the others.
                for item in group:
                    await self._store_group(loop, [item])
                return
            log.error("storing %d uploads failed: %s", len(uploads), error)
            for upload, future in group:
                self._pending.pop((upload.device, upload.report_id), None)
                if not future.done():
                    future.set_exception(_Refused("store_failed", retry_after="5"))
            self.metrics.queue_depth -= len(group)
            return
        self.metrics.observe_fsync(seconds)
        self.metrics.queue_depth -= len(group)
        for upload, future in group:
            self._pending.pop((upload.device, upload.report_id), None)
            self.metrics.uploads_accepted += 1
            self.metrics.reports_accepted += len(upload.records)
            if not future.done():
                future.set_result(len(upload.records))

    # -- handlers ------------------------------------------------------------------------------

    @web.middleware
    async def _count_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception:  # a bug must cost one request, never the service
            log.exception("internal error on %s", request.path)
            return self._refusal(_Refused("internal", close=True))

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.text(), content_type="text/plain")

    def _refusal(self, refused: _Refused) -> web.Response:
        status = self.metrics.reject(refused.reason)
        response = web.json_response({"error": refused.reason}, status=status)
        if refused.retry_after is not None:
            response.headers["Retry-After"] = refused.retry_after
        if refused.close:
            response.force_close()
        return response

    async def _upload(self, request: web.Request) -> web.Response:
        try:
            stored, records = await self._accept(request)
        except _Refused as refused:
            return self._refusal(refused)
        if not stored:
            self.metrics.uploads_duplicate += 1
        body = {"status": "stored" if stored else "duplicate", "records": records}
        return web.json_response(body, status=200)

    async def _accept(self, request: web.Request) -> tuple[bool, int]:
        if self._stopping:
            raise _Refused("shutting_down", retry_after="1", close=True)
        headers = request.headers
        fields = [headers.get(name) for name in (DEVICE, TIMESTAMP, NONCE, REPORT_ID, SIGNATURE)]
        if any(value is None for value in fields):
            raise _Refused("no_credentials")
        device, timestamp_text, nonce, report_id, signature_hex = fields
        assert device is not None and timestamp_text is not None
        assert nonce is not None and report_id is not None and signature_hex is not None
        if device not in self.registry:
            raise _Refused("unknown_device")
        if not (
            timestamp_text.isdigit()
            and len(timestamp_text) <= 15
            and valid_nonce(nonce)
            and valid_report_id(report_id)
        ):
            raise _Refused("bad_credentials")
        timestamp_ms = int(timestamp_text)
        if skewed(timestamp_ms, int(self.clock() * 1000), self.config.max_skew_ms):
            raise _Refused("clock_skew")
        body = await self._read_body(request)
        try:
            signature = bytes.fromhex(signature_hex)
        except ValueError:
            raise _Refused("bad_signature") from None
        message = signed_message(self.config.instance, device, timestamp_ms, nonce, report_id, body)
        if not self.registry.verify(device, signature, message):
            raise _Refused("bad_signature")
        now = self.clock()
        if not self.nonces.first_use(device, nonce, timestamp_ms, int(now * 1000)):
            raise _Refused("replayed_nonce")
        wait = self.limiter.take(device, now)
        if wait > 0:
            raise _Refused("rate_limited", retry_after=RateLimiter.retry_after(wait))
        key = (device, report_id)
        if self.store.seen(device, report_id):
            return False, 0
        if key in self._pending:  # the first attempt is still being stored
            return False, await asyncio.shield(self._pending[key])
        records = self._parse(body)
        if self.metrics.queue_depth >= self.config.queue_uploads:
            raise _Refused("queue_full", retry_after="1")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        self.metrics.queue_depth += 1
        upload = Accepted(device, report_id, int(now * 1000), origin_for(device), records)
        self._queue.put_nowait((upload, future))
        return True, await asyncio.shield(future)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _Refused("too_large", close=True)

        async def read() -> bytes:
            chunks, size = [], 0
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > limit:
                    raise _Refused("too_large", close=True)
                chunks.append(chunk)

        try:
            body = await asyncio.wait_for(read(), timeout=self.config.body_timeout_s)
        except TimeoutError:
            raise _Refused("slow_client", close=True) from None
        self.metrics.bytes_received += len(body)
        return body

    def _parse(self, body: bytes) -> list[dict[str, Any]]:
        """The upload's Report records (400 if not Reports for this instance)."""
        try:
            records = self._decoder.decode(body)
        except TooManyRecords:
            raise _Refused("too_many_records") from None
        except Malformed:
            raise _Refused("malformed") from None
        instance = self.config.instance
        if any(record["shuffler_instance"] != instance for record in records):
            raise _Refused("wrong_instance")
        return records


def describe(config: CollectorConfig, host: str, port: int) -> str:
    """The one line ``esa collect`` prints when it listens (JSON: url, instance, port)."""
    url_host = f"[{host}]" if ":" in host else host
    return json.dumps(
        {"listening": f"https://{url_host}:{port}", "instance": config.instance, "port": port}
    )

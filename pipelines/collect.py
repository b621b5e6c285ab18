"""``esa collect``: the authenticated ingestion service in front of one shuffler instance.

    esa collect --instance U --listen HOST:PORT --output DIR --registry REGISTRY --tls DIR
        [--max-body BYTES] [--max-records N] [--max-skew 5m] [--body-timeout SECONDS]
        [--idle-timeout SECONDS]
        [--device-rate PER_SECOND] [--device-burst N] [--queue N] [--rotate-bytes BYTES]
        [--rotate-age SECONDS] [--dedupe-window 1d] [--codec deflate|null|snappy]

Devices upload their reports for instance U over HTTPS (``POST /v1/reports``, the protocol in
``schemas/uploads.py``), each upload signed with the device's enrolment key (``esa keys enrol``
writes the REGISTRY the collector checks against; ``esa keys tls`` the server certificate,
``--tls DIR`` holding ``collector.crt`` and ``collector.key``). The collector stamps ``origin``
(one per enrolled key: ``device-<key id>``) and the receive time itself and ignores any origin
a device claims, so distinct respondents are distinct authenticated devices.

A 2xx means durable: the report is fsynced in a file the shuffler will read
(``DIR/reports-U-<n>.avro``, committed by ``DIR/reports-U-<n>.avro.commit.json``, appearing by
atomic rename when the open file rotates by size or age: ``pipelines/collector/store.py``).
``esa shuffle --instance U --input 'DIR/*.avro'`` reads them. A retried upload (same device and
``ESA-Report-Id``) is stored once within the dedupe window (default 1d); seen ids are kept on
disk (``DIR/.collector/``) and survive a restart. A restart after a crash commits every
acknowledged report and nothing else.

Hostile clients get a status and a counter, never a crash (``pipelines/collector/service.py``).
``GET /healthz``, ``GET /metrics`` (Prometheus text). Prints one JSON line when listening
(``{"listening": URL, "instance": U, "port": PORT}``; ``--listen 127.0.0.1:0`` picks a free
port), one log line per committed file; SIGTERM or SIGINT stops accepting, drains, commits the
open file and exits 0.

Why aiohttp: a mature asyncio HTTP server and client in one maintained package (one event loop
holds thousands of slow connections without a thread each; the same library is the simulated
fleet's client), with TLS from the standard library's ``ssl``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from pipelines.commandline.main import UsageError

__all__ = ["register", "parse_listen"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "collect",
        help="Authenticated HTTPS ingestion in front of one shuffler instance.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--instance", type=int, required=True, metavar="U")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--output", required=True, metavar="DIR")
    parser.add_argument(
        "--registry", required=True, help="Device registry (esa keys enrol) file or directory."
    )
    parser.add_argument(
        "--tls",
        required=True,
        metavar="DIR",
        help="collector.crt and collector.key (esa keys tls).",
    )
    parser.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES")
    parser.add_argument("--max-records", type=int, default=10_000, metavar="N")
    parser.add_argument("--max-skew", default="5m", help="Allowed device clock skew. Default 5m.")
    parser.add_argument("--body-timeout", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="Close a connection that has not sent a whole request header this long after it "
        "opened or after its last request (slow or idle clients). Default 30.",
    )
    parser.add_argument("--device-rate", type=float, default=10.0, metavar="PER_SECOND")
    parser.add_argument("--device-burst", type=float, default=20.0, metavar="N")
    parser.add_argument("--queue", type=int, default=20_000, metavar="N", help="Uploads queued.")
    parser.add_argument("--rotate-bytes", type=int, default=64 << 20, metavar="BYTES")
    parser.add_argument("--rotate-age", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--dedupe-window", default="1d", help="Default 1d.")
    parser.add_argument("--codec", default="deflate", choices=("deflate", "null", "snappy"))
    parser.set_defaults(handler=_handle)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port); UsageError otherwise."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"--listen must be HOST:PORT with PORT in [0, 65535], got {text!r}")
    return host, int(port_text)


def _config(args: argparse.Namespace) -> Any:
    from pipelines.collector.service import CollectorConfig
    from schemas.windows import parse_duration_ms

    try:
        skew_ms = parse_duration_ms(args.max_skew)
        window_ms = parse_duration_ms(args.dedupe_window)
    except ValueError as error:
        raise UsageError(str(error)) from None
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory")
    try:
        return CollectorConfig(
            instance=args.instance,
            output=output,
            max_body_bytes=args.max_body,
            max_records=args.max_records,
            max_skew_ms=skew_ms,
            body_timeout_s=args.body_timeout,
            keepalive_s=args.idle_timeout,
            device_rate=args.device_rate,
            device_burst=args.device_burst,
            queue_uploads=args.queue,
            rotate_bytes=args.rotate_bytes,
            rotate_age_s=args.rotate_age,
            dedupe_window_ms=window_ms,
            codec=args.codec,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def _handle(args: argparse.Namespace) -> int:
    from pipelines.collector.service import Collector, describe, server_tls_context
    from schemas.crypto.device_keys import load_registry
    from schemas.crypto.key_files import KeyError_
    from schemas.crypto.tls_certificates import SERVER_CERT, SERVER_KEY

    host, port = parse_listen(args.listen)
    config = _config(args)
    try:
        registry = load_registry(args.registry)
    except KeyError_ as error:
        raise UsageError(str(error)) from None
    tls_dir = Path(args.tls)
    try:
        tls = server_tls_context(tls_dir / SERVER_CERT, tls_dir / SERVER_KEY)
    except (OSError, ValueError) as error:
        raise UsageError(f"--tls {tls_dir}: {error}") from None
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        collector = Collector(config, registry)
    except OSError as error:
        raise UsageError(f"--output {config.output}: {error}") from None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            bound = await collector.start(host, port, tls)
        except OSError as error:
            raise UsageError(f"--listen {args.listen}: {error}") from None
        print(describe(config, host, bound), flush=True)
        await stop.wait()
        await collector.stop()
        logging.getLogger("esa.collect").info(
            "stopped: %d uploads stored, %d files committed",
            collector.metrics.uploads_accepted,
            collector.metrics.files_committed,
        )

    asyncio.run(main())
    return 0

"""``esa collect`` end to end on 127.0.0.1: authenticated uploads land in committed files that
``esa shuffle`` reads; every hostile request class gets its status and its counter while the
service keeps serving; a device claiming 1,000 origins is one respondent; a retried upload is
stored once, across a restart too."""

from __future__ import annotations

import io
import json
import os
import socket
import ssl
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from pipelines.collector.store import committed_files
from pipelines.commandline import main as cli
from schemas import REPORT, schema_json
from schemas.avro.container import encode_container
from schemas.crypto.device_keys import origin_for
from schemas.uploads import PATH, upload_headers
from simulators.uploads import client_tls_context, upload_jobs
from tests.pipelines.collectors import Collector, make_keys
from transforms.analyzer.report_files import read_reports

FNAPI = ["--runner=FnApiRunner"]
RESPONDENTS = 40


def _esa(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = cli.main(list(argv))
    return code, out.getvalue()


def _recipe(directory: Path) -> str:
    data = {
        "name": "collected",
        "version": 1,
        "channel": "collected",
        "randomizer": "one_hot_rappor",
        "randomizer_params": {"domain_size": 8, "epsilon": 4.0},
        "fragmentation": "attribute",
        "epsilon_local": 4.0,
        "epsilon_central_target": 4.0,
        "delta": 1e-6,
        "min_crowd_size": 1,
        "query_class": "test",
        "data_fields": ["value"],
        "shuffler_instances": 2,
    }
    path = directory / "collected.json"
    path.write_text(json.dumps(data))
    return str(path)


def _records(paths: list[Path]) -> list[dict]:
    records = []
    for path in paths:
        with open(path, "rb") as handle:
            records += list(fastavro.reader(handle))
    return records


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Devices enrolled, TLS made, a small fleet simulated to files (not yet uploaded)."""
    root = tmp_path_factory.mktemp("collect")
    keys = make_keys(root, RESPONDENTS + 5)
    recipe = _recipe(root)
    code, _ = _esa(
        "simulate", "--recipe", recipe, "--population", "uniform", "--respondents",
        str(RESPONDENTS), "--seed", "5", "--output", str(root / "files"), *FNAPI,
    )  # fmt: skip
    assert code == 0
    return root, keys, recipe


@pytest.fixture
def collector(world, tmp_path):
    root, keys, _ = world
    server = Collector(
        keys, tmp_path / "collected", 0, 0,
        "--max-body", "65536", "--device-rate", "2", "--device-burst", "3",
        "--body-timeout", "1", "--idle-timeout", "2", "--rotate-age", "0.5", "--queue", "64",
    )  # fmt: skip
    yield server
    server.stop()


def _body(instance: int = 0, origins: list[str] | None = None, payload: bytes = b"") -> bytes:
    origins = origins or ["claimed"]
    n = len(origins)
    columns = {
        "schema_version": 1,
        "shuffler_instance": instance,
        "channel": "collected",
        "recipe_id": "collected@1",
        "crowd_id": None,
        "min_crowd_size": 1,
        "origin": pa.array(origins, pa.string()),
        "event_time": np.full(n, 1_704_067_200_000, np.int64),
        "payload": pa.array([payload] * n, pa.binary()),
        "payload_crc32c": np.zeros(n, np.int64),
    }
    return encode_container(schema_json(REPORT), columns, n)


def test_uploads_are_committed_with_authenticated_origins_and_read_by_esa_shuffle(world, tmp_path):
    root, keys, recipe = world
    servers = [Collector(keys, tmp_path / f"collected-{u}", u) for u in range(2)]
    try:
        code, out = _esa(
            "simulate", "--recipe", recipe, "--population", "uniform", "--respondents",
            str(RESPONDENTS), "--seed", "5", "--output", str(tmp_path / "sim"),
            "--collector", ",".join(s.url for s in servers),
            "--device-credentials", str(keys.devices), "--collector-ca", str(keys.ca),
            "--connections", "8", "--json", *FNAPI,
        )  # fmt: skip
        assert code == 0, out
        summary = json.loads(out)
        assert summary["uploads"]["failed"] == 0
        assert summary["uploads"]["stored"] == 2 * RESPONDENTS  # each device, each instance
    finally:
        assert all(server.stop() == 0 for server in servers)
    enrolled = {origin_for(c.key_id) for c in keys.credentials()}
    for u, server in enumerate(servers):
        files = sorted(server.output.glob("*.avro"))
        assert files and files == committed_files(server.output)  # nothing visible uncommitted
        assert not list((server.output / ".collector").glob("*.open"))
        records = _records(files)
        expected = summary["messages_per_instance"][u] + summary["presence_per_instance"][u]
        assert len(records) == expected
        origins = {record["origin"] for record in records}
        assert len(origins) == RESPONDENTS and origins <= enrolled
        assert "Committed" not in server.stderr() and "committed" in server.stderr()
        code, out = _esa(
            "shuffle", "--input", str(server.output / "*.avro"), "--instance", str(u),
            "--output", str(tmp_path / f"shuffled-{u}"), "--recipe", recipe,
            "--crowd-threshold", "1", "--json", *FNAPI,
        )  # fmt: skip
        assert code == 0
        shuffled = json.loads(out)
        assert shuffled["read"] == expected and shuffled["adds_up"]
        assert shuffled["dead_lettered"] == 0


def test_a_device_claiming_1000_origins_is_one_respondent(world, tmp_path):
    root, keys, recipe = world
    credentials = keys.credentials()
    server = Collector(keys, tmp_path / "collected", 0)
    try:
        honest = [
            job for job in upload_jobs(root / "files", 2, credentials[:RESPONDENTS])
            if job.instance == 0
        ][:3]  # fmt: skip
        for job in honest:
            assert server.upload(job.credential, job.body, job.report_id)[0] == 200
        # A fourth device sends 1,000 presence messages, each claiming another origin.
        flood = _body(0, [f"{i:016x}" for i in range(1000)])
        status, _, answer = server.upload(credentials[-1], flood, "flood-000001")
        assert status == 200 and json.loads(answer)["records"] == 1000
    finally:
        assert server.stop() == 0
    records = _records(committed_files(server.output))
    assert len({r["origin"] for r in records}) == 4
    assert {r["origin"] for r in records if r["payload"] == b""} >= {
        origin_for(credentials[-1].key_id)
    }
    code, out = _esa(
        "shuffle", "--input", str(server.output / "*.avro"), "--instance", "0",
        "--output", str(tmp_path / "shuffled"), "--recipe", recipe, "--crowd-threshold", "1",
        *FNAPI,
    )  # fmt: skip
    assert code == 0
    commit = json.loads((tmp_path / "shuffled" / "_COMMIT.json").read_text())
    assert commit["respondents_released"] == 4  # n: the authenticated devices


def test_a_retried_upload_is_stored_once_even_after_a_restart(world, tmp_path):
    _, keys, _ = world
    device = keys.credentials()[0]
    output = tmp_path / "collected"
    server = Collector(keys, output, 0)
    body = _body(0, ["a", "b"])
    try:
        first = server.upload(device, body, "report-000001")
        again = server.upload(device, body, "report-000001")
        assert (first[0], json.loads(first[2])["status"]) == (200, "stored")
        assert (again[0], json.loads(again[2])["status"]) == (200, "duplicate")
    finally:
        assert server.stop() == 0
    server = Collector(keys, output, 0)
    try:
        after = server.upload(device, body, "report-000001")
        assert (after[0], json.loads(after[2])["status"]) == (200, "duplicate")
        other = server.upload(device, body, "report-000002")  # another report id: stored
        assert json.loads(other[2])["status"] == "stored"
    finally:
        assert server.stop() == 0
    assert len(_records(committed_files(output))) == 4


def test_hostile_requests_get_their_status_and_counter_and_the_service_keeps_serving(
    collector, world
):
    _, keys, _ = world
    devices = keys.credentials()
    good = _body()

    def status_of(response):
        return response[0]

    # no credentials at all; an unknown device; malformed credential fields
    assert status_of(collector.request("POST", PATH, good, {})) == 401
    assert collector.rejected("no_credentials") == 1
    stranger = upload_headers(devices[0], 0, "report-x00001", good, int(time.time() * 1000))
    stranger["ESA-Device"] = "00" * 8
    assert status_of(collector.request("POST", PATH, good, stranger)) == 401
    assert collector.rejected("unknown_device") == 1
    bad_fields = collector.upload(devices[0], good, "r", headers={"ESA-Nonce": "xyz"})
    assert status_of(bad_fields) == 401 and collector.rejected("bad_credentials") == 1
    # a signature by another device's key, and one over a different body
    forged = upload_headers(devices[1], 0, "report-x00002", good, int(time.time() * 1000))
    forged["ESA-Device"] = devices[0].key_id
    assert status_of(collector.request("POST", PATH, good, forged)) == 401
    swapped = upload_headers(devices[0], 0, "report-x00003", good, int(time.time() * 1000))
    assert status_of(collector.request("POST", PATH, _body(0, ["z"]), swapped)) == 401
    assert collector.rejected("bad_signature") == 2
    # a signature for instance 1 sent to instance 0
    assert status_of(collector.upload(devices[0], good, "report-x00004", instance=1)) == 401
    assert collector.rejected("bad_signature") == 3
    # clock skew
    skewed = collector.upload(
        devices[2], good, "report-x00005", int(time.time() * 1000) - 3_600_000
    )
    assert status_of(skewed) == 401 and collector.rejected("clock_skew") == 1
    # a replayed request (same nonce): the first is stored, the replay refused
    replayed = upload_headers(devices[3], 0, "report-x00006", good, int(time.time() * 1000))
    assert status_of(collector.request("POST", PATH, good, replayed)) == 200
    assert status_of(collector.request("POST", PATH, good, replayed)) == 409
    assert collector.rejected("replayed_nonce") == 1
    # oversized: refused from Content-Length
    huge = _body(0, ["x"] * 10, payload=b"\0" * 10_000)
    assert status_of(collector.upload(devices[4], huge, "report-x00007")) == 413
    assert collector.rejected("too_large") == 1
    # malformed bodies, correctly signed: not Avro, cut, records for another instance
    assert status_of(collector.upload(devices[5], b"not avro", "report-x00008")) == 400
    assert status_of(collector.upload(devices[5], good[:-20], "report-x00009")) == 400
    assert collector.rejected("malformed") == 2
    assert status_of(collector.upload(devices[6], _body(1), "report-x00010")) == 400
    assert collector.rejected("wrong_instance") == 1
    # one device too fast: burst 3, then 429 with Retry-After
    answers = [
        collector.upload(devices[7], _body(0, [str(i)]), f"report-y{i:05d}") for i in range(5)
    ]
    assert [a[0] for a in answers[:3]] == [200, 200, 200]
    assert answers[3][0] == 429 and int(answers[3][1]["Retry-After"]) >= 1
    assert collector.rejected("rate_limited") == 2
    # everyone else is still served
    assert status_of(collector.upload(devices[8], good, "report-z00001")) == 200
    assert collector.request("GET", "/healthz")[:1] == (200,)
    metrics = collector.metrics()
    assert metrics['esa_collector_uploads_accepted_total{instance="0"}'] == 5
    assert collector.process.poll() is None


def test_a_slow_client_times_out_while_others_are_served(collector, world):
    _, keys, _ = world
    device = keys.credentials()[10]
    context = client_tls_context(keys.ca)
    raw = socket.create_connection(("127.0.0.1", collector.port), timeout=10)
    slow = context.wrap_socket(raw, server_hostname="127.0.0.1")
    body = _body()
    headers = upload_headers(device, 0, "report-slow01", body, int(time.time() * 1000))
    head = f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    slow.sendall(head.encode() + body[:10])  # then nothing: the body never completes
    started = time.monotonic()
    assert collector.upload(keys.credentials()[11], body, "report-fast01")[0] == 200
    answer = b""
    try:
        while b"\r\n" not in answer:
            chunk = slow.recv(4096)
            if not chunk:
                break
            answer += chunk
    finally:
        slow.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert time.monotonic() - started < 8
    assert collector.rejected("slow_client") == 1
    assert collector.process.poll() is None


def test_a_client_dribbling_headers_is_disconnected_after_the_idle_timeout(collector, world):
    _, keys, _ = world
    context = client_tls_context(keys.ca)
    raw = socket.create_connection(("127.0.0.1", collector.port), timeout=20)
    slow = context.wrap_socket(raw, server_hostname="127.0.0.1")
    started = time.monotonic()
    slow.sendall(f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())  # never finished
    assert collector.upload(keys.credentials()[12], _body(), "report-fast02")[0] == 200
    try:
        closed = slow.recv(4096) == b""
    except (ConnectionError, ssl.SSLError):
        closed = True
    finally:
        slow.close()
    assert closed and 1.5 < time.monotonic() - started < 15  # --idle-timeout 2
    assert collector.process.poll() is None


def test_a_full_queue_answers_503_with_retry_after(world, tmp_path):
    _, keys, _ = world
    devices = keys.credentials()
    server = Collector(keys, tmp_path / "collected", 0, 0, "--queue", "1")
    statuses: list[int] = []
    retry_after: list[str] = []

    def send(index: int) -> None:
        status, headers, _ = server.upload(devices[index], _body(), f"report-q{index:05d}")
        statuses.append(status)
        if status == 503:
            retry_after.append(headers["Retry-After"])

    try:
        threads = [threading.Thread(target=send, args=(i,)) for i in range(30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert set(statuses) <= {200, 503} and len(statuses) == 30
        assert statuses.count(503) == server.rejected("queue_full")
        assert statuses.count(503) >= 1 and statuses.count(200) >= 1
        assert retry_after and all(value == "1" for value in retry_after)
    finally:
        assert server.stop() == 0
    assert len(_records(committed_files(server.output))) == statuses.count(200)


def test_bad_command_lines_are_one_line(world, tmp_path):
    _, keys, _ = world
    base = ["collect", "--instance", "0", "--output", str(tmp_path / "o")]
    base += ["--registry", str(keys.devices), "--tls", str(keys.tls)]
    for argv, fragment in (
        ([*base, "--listen", "nowhere"], "--listen must be HOST:PORT"),
        ([*base, "--listen", "127.0.0.1:0", "--max-skew", "soon"], "soon"),
        ([*base[:-2], "--tls", str(tmp_path), "--listen", "127.0.0.1:0"], "--tls"),
        ([*base, "--listen", "127.0.0.1:0", "--queue", "0"], "queue_uploads"),
        (
            [
                "simulate",
                "--output",
                str(tmp_path / "s"),
                "--collector",
                "http://127.0.0.1:1",
                "--device-credentials",
                str(keys.devices),
            ],
            "must be https://",
        ),
        (
            ["simulate", "--output", str(tmp_path / "s"), "--collector", "https://127.0.0.1:1"],
            "needs --device-credentials",
        ),
        (["keys", "enrol", "--devices", "0", "--output", str(tmp_path / "d")], "--devices"),
    ):
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            assert cli.main(argv) == 2
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"esa {argv[0]}: error:"), lines
        assert fragment in lines[0]
    private = keys.devices / "devices.private.jsonl"
    assert oct(os.stat(private).st_mode & 0o777) == "0o600"
    assert oct(os.stat(keys.tls / "collector.key").st_mode & 0o777) == "0o600"
    assert isinstance(client_tls_context(keys.ca), ssl.SSLContext)


@pytest.mark.slow
def test_esa_run_collect_estimates_from_the_authenticated_devices(world, tmp_path):
    """fleet -> 2 collectors -> 2 shufflers -> analyzer: n is the number of enrolled devices
    that uploaded, and the shufflers read only what the collectors committed."""
    _, _, recipe = world
    output = tmp_path / "results"
    code, out = _esa(
        "run", "--output", str(output), "--recipe", recipe, "--population", "uniform",
        "--respondents", str(RESPONDENTS), "--seed", "9", "--collect", "--connections", "8",
        "--crowd-threshold", "1", *FNAPI,
    )  # fmt: skip
    assert code == 0, out
    run = json.loads((output / "run.json").read_text())
    assert run["adds_up"] and "collect" in run["seconds"]
    for u in range(2):
        records = _records(committed_files(output / "collected" / f"instance={u}"))
        assert len({r["origin"] for r in records}) == RESPONDENTS
        assert all(r["origin"].startswith("device-") for r in records)
    reports = read_reports(str(output / "analysis"), 10)
    assert reports["histograms"]
    for crowd in reports["histograms"]:
        assert crowd["respondents_effective"] == RESPONDENTS  # the devices that uploaded

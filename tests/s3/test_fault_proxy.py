"""The fault proxy itself: it forwards faithfully, and each fault kind really happens.

Most tests put the proxy in front of a tiny echo server on loopback (fast, and
it shows exactly what reached the server); the last ones go through to the
session's real S3 server with botocore, whose requests are SigV4-signed.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.s3.fault_proxy import FAULT_KINDS, FaultProxy, FaultRates
from tests.s3.fixtures import S3Bucket


class Echo(BaseHTTPRequestHandler):
    """Answers every request with what it received: method, Host, body length and digest."""

    protocol_version = "HTTP/1.1"
    seen: list[str]  # set on the class by the fixture

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in {b"\r\n", b"\n", b""}:
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _answer(self) -> None:
        body = self._body()
        self.seen.append(self.command)
        reply = (
            f"{self.command} host={self.headers['Host']} len={len(body)} "
            f"sha={hashlib.sha256(body).hexdigest()[:16]} "
            f"expect={self.headers.get('Expect', '-')}"
        ).encode()
        if self.path.startswith("/big"):
            reply += b"x" * 100_000
        self.send_response(200)
        if self.path.startswith("/chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(reply), 7):
                piece = reply[i : i + 7]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("EchoHandler", (Echo,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def proxy(echo: tuple[str, list[str]]) -> Iterator[FaultProxy]:
    with FaultProxy(echo[0], seed=3, timeout_delay=1.0) as running:
        yield running


def _wait_until(condition: Callable[[], bool]) -> None:
    """Wait for something another thread must do; the bound only ends a failing test."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "waited 60 s"
        time.sleep(0.01)


def connect(proxy: FaultProxy, timeout: float = 5.0) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)


def ask(
    conn: http.client.HTTPConnection, method: str = "GET", path: str = "/", **kw: object
) -> str:
    conn.request(method, path, **kw)  # type: ignore[arg-type]
    response = conn.getresponse()
    return f"{response.status} {response.read().decode(errors='replace')[:120]}"


# --- faithful forwarding ---------------------------------------------------------------


def test_forwards_host_bodies_and_keeps_the_connection_alive(
    proxy: FaultProxy, echo: tuple[str, list[str]]
) -> None:
    conn = connect(proxy)
    body = b"abc" * 1000
    digest = hashlib.sha256(body).hexdigest()[:16]
    conn.request("PUT", "/k", body=body, headers={"Host": "bucket.example:1234"})
    assert (
        conn.getresponse()
        .read()
        .decode()
        .startswith(f"PUT host=bucket.example:1234 len=3000 sha={digest}")
    )
    # Chunked upload (framed by the client), then a chunked response (de-chunked by the proxy).
    conn.request("PUT", "/chunked", body=iter([b"abc"] * 1000), encode_chunked=True)
    answer = conn.getresponse()
    assert answer.getheader("Content-Length") is not None
    assert (
        answer.read().decode().startswith(f"PUT host=127.0.0.1:{proxy.port} len=3000 sha={digest}")
    )
    # Expect: 100-continue is answered and the header still reaches the server.
    conn.request("PUT", "/k", body=body, headers={"Expect": "100-continue"})
    assert conn.getresponse().read().decode().endswith("expect=100-continue")
    conn.request("HEAD", "/k")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    assert ask(conn, "GET", "/big").startswith("200 GET")
    conn.close()
    assert proxy.connections == 1 and proxy.forwarded == 5 == len(echo[1])
    assert proxy.total_injected == 0


# --- each fault kind ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "code"), [("error_500", "InternalError"), ("slow_down", "SlowDown")]
)
def test_error_responses_carry_an_s3_error_body_and_keep_the_connection(
    proxy: FaultProxy, echo: tuple[str, list[str]], kind: str, code: str
) -> None:
    conn = connect(proxy)
    proxy.inject_next(kind)  # type: ignore[arg-type]
    conn.request("PUT", "/bucket/key?x=1", body=b"data")
    response = conn.getresponse()
    text = response.read().decode()
    assert response.status == (500 if kind == "error_500" else 503)
    assert response.getheader("Content-Type") == "application/xml"
    assert f"<Code>{code}</Code>" in text and "<Resource>/bucket/key</Resource>" in text
    assert echo[1] == []  # the server never saw it
    assert ask(conn).startswith("200 GET")  # same connection, next request forwarded
    assert proxy.connections == 1 and proxy.counts[kind] == 1


@pytest.mark.parametrize("phase", ["before", "after"])
def test_reset_closes_without_a_response(
    proxy: FaultProxy, echo: tuple[str, list[str]], phase: str
) -> None:
    proxy.inject_next("reset", phase=phase)  # type: ignore[arg-type]
    conn = connect(proxy)
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        ask(conn, "PUT", "/k", body=b"data")
    assert echo[1] == ([] if phase == "before" else ["PUT"])
    assert proxy.phase_counts == {f"reset/{phase}": 1}


@pytest.mark.parametrize("phase", ["before", "after"])
def test_timeout_holds_the_request_past_the_client_timeout(
    proxy: FaultProxy, echo: tuple[str, list[str]], phase: str
) -> None:
    proxy.timeout_delay = 3600.0  # far past the client's timeout; the fixture's stop ends it
    proxy.inject_next("timeout", phase=phase)  # type: ignore[arg-type]
    conn = connect(proxy, timeout=0.3)
    with pytest.raises(TimeoutError):
        ask(conn, "GET", "/k")
    assert echo[1] == ([] if phase == "before" else ["GET"])
    assert proxy.counts["timeout"] == 1


@pytest.mark.parametrize("path", ["/big", "/chunked"])
def test_truncate_sends_fewer_bytes_than_the_content_length(
    proxy: FaultProxy, echo: tuple[str, list[str]], path: str
) -> None:
    proxy.inject_next("truncate")
    conn = connect(proxy)
    conn.request("GET", path)
    response = conn.getresponse()
    length = int(response.getheader("Content-Length") or 0)
    assert length > 0
    with pytest.raises(http.client.IncompleteRead) as caught:
        response.read()
    assert len(caught.value.partial) < length
    assert echo[1] == ["GET"] and proxy.counts["truncate"] == 1


def test_truncate_of_a_bodiless_response_cuts_its_head(proxy: FaultProxy) -> None:
    proxy.inject_next("truncate")
    with pytest.raises((http.client.RemoteDisconnected, http.client.BadStatusLine)):
        ask(connect(proxy), "HEAD", "/k")


# --- rates, down/up, shutdown -------------------------------------------------------------


def test_rates_inject_every_kind_at_about_the_set_rate(
    proxy: FaultProxy, echo: tuple[str, list[str]]
) -> None:
    proxy.timeout_delay = 0.05
    proxy.set_rates(FaultRates.uniform(0.5))
    outcomes = 0
    for _ in range(200):
        conn = connect(proxy, timeout=0.02)
        with contextlib.suppress(OSError, http.client.HTTPException):
            ask(conn, "GET", "/big")
        outcomes += 1
        conn.close()
    # A client that gave up (0.02 s) does not wait for the proxy to finish with its
    # request: let the proxy's threads catch up before counting.
    _wait_until(lambda: proxy.requests == outcomes == 200)
    _wait_until(lambda: len(echo[1]) == proxy.forwarded)
    counts = proxy.counts
    assert set(counts) == set(FAULT_KINDS) and all(counts[k] > 0 for k in FAULT_KINDS), counts
    assert 60 < proxy.total_injected < 140, counts
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultRates(error_500=0.7, reset=0.7)


def test_down_refuses_connections_and_drops_open_ones(proxy: FaultProxy) -> None:
    kept = connect(proxy)
    assert ask(kept).startswith("200")
    proxy.down()
    assert proxy.is_down
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        ask(kept)  # the open keep-alive connection was dropped
    proxy.up()
    assert ask(connect(proxy)).startswith("200")  # same port again


def test_exit_stops_every_thread(echo: tuple[str, list[str]]) -> None:
    with FaultProxy(echo[0], timeout_delay=30.0) as proxy:
        idle = connect(proxy)
        assert ask(idle).startswith("200")
        proxy.inject_next("timeout", phase="before")
        held = connect(proxy, timeout=10)
        held.request("GET", "/")  # held by the proxy for 30 s
        _wait_until(lambda: proxy.counts.get("timeout") == 1)  # the hold has begun
    # Joining is bounded well below the 30 s hold: no thread left means the exit cut it short.
    assert not [t for t in threading.enumerate() if t.name.startswith("fault-proxy")]


# --- through to the real S3 server -----------------------------------------------------------


def test_botocore_requests_pass_signed_and_faults_are_retried(s3_bucket: S3Bucket) -> None:
    server = s3_bucket.server
    if server.endpoint is None or not server.endpoint.startswith("http://"):
        pytest.skip("the fault proxy speaks plain HTTP to a local S3 server only")
    with FaultProxy(server.endpoint, seed=1, timeout_delay=1.0) as proxy:
        direct = server.client()
        via = type(server)(
            endpoint=proxy.endpoint,
            access_key=server.access_key,
            secret_key=server.secret_key,
            region=server.region,
        ).client()
        key = f"{s3_bucket.prefix}proxied"
        data = bytes(range(256)) * 4096
        # A file-like body: botocore sends Expect: 100-continue.
        via.put_object(Bucket=s3_bucket.name, Key=key, Body=io.BytesIO(data))
        assert direct.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read() == data
        # Non-streaming calls (botocore does not retry a streamed body it handed over).
        for kind in ("slow_down", "error_500", "truncate", "reset"):
            proxy.inject_next(kind)  # type: ignore[arg-type]
            listed = via.list_objects_v2(Bucket=s3_bucket.name, Prefix=key)
            assert [o["Key"] for o in listed["Contents"]] == [key]
        assert proxy.counts == {
            "error_500": 1,
            "slow_down": 1,
            "timeout": 0,
            "reset": 1,
            "truncate": 1,
        }

"""The data benchmark's latency proxy: delay per request, bytes unchanged, bounded, stops.

S3 requests go through the real Ceph RGW (the suite's ``s3_server``), with boto3 as
the client, the way the benchmark's readers use it. The bound is checked with a
small echo server on 127.0.0.1 (raw sockets say exactly when a connection is
served). The only clock assertion is a lower bound the proxy guarantees by
construction (it sleeps the delay before passing each request on); nothing about
speed is asserted.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
from benchmarks.data.latency import LatencyProxy
from benchmarks.data.run import parse_args

from tests.s3.fixtures import S3Bucket


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("latency-")]


def test_s3_bytes_pass_unchanged_and_each_request_is_delayed(s3_bucket: S3Bucket) -> None:
    server = s3_bucket.server
    if server.endpoint is None:
        pytest.skip("needs a loopback S3 endpoint to proxy")
    host, port = server.endpoint.removeprefix("http://").split(":")
    body = os.urandom(3 * 1024 * 1024 + 17)
    key = f"{s3_bucket.prefix}blob"
    server.client().put_object(Bucket=s3_bucket.name, Key=key, Body=body)
    delay = 0.25
    with LatencyProxy(host, int(port), delay_s=delay) as proxy:
        client = dataclasses.replace(server, endpoint=proxy.endpoint).client()
        started = time.monotonic()
        whole = client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read()
        ranged = client.get_object(Bucket=s3_bucket.name, Key=key, Range="bytes=1000-2000999")
        part = ranged["Body"].read()
        head = client.head_object(Bucket=s3_bucket.name, Key=key)
        elapsed = time.monotonic() - started
        requests = proxy.requests
    assert whole == body
    assert part == body[1000:2001000]
    assert head["ContentLength"] == len(body)
    # Three requests, each held back once (a response's many chunks are not requests).
    assert requests == 3
    assert elapsed >= 3 * delay
    assert not _proxy_threads()


class _Echo(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _Echo(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _roundtrip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_connections_beyond_the_bound_wait_until_one_closes(echo: tuple[str, int]) -> None:
    with LatencyProxy(*echo, delay_s=0.0, max_connections=2) as proxy:
        first = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        second = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        assert _roundtrip(first, b"one") == b"one"
        assert _roundtrip(second, b"two") == b"two"
        third = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        third.sendall(b"three")
        # Both slots are taken: the third waits in the listen backlog, unanswered.
        third.settimeout(0.5)
        with pytest.raises(TimeoutError):
            third.recv(16)
        first.close()
        third.settimeout(10)
        assert third.recv(16) == b"three"
        assert proxy.peak_connections == 2
        second.close()
        third.close()
        # Many short connections in turn: each frees its slot and its threads when closed.
        for i in range(20):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
                assert _roundtrip(sock, str(i).encode()) == str(i).encode()
        assert proxy.peak_connections == 2
    assert not _proxy_threads()


def test_large_transfers_both_ways_are_unchanged(echo: tuple[str, int]) -> None:
    data = os.urandom(5 * 1024 * 1024 + 3)
    with (
        LatencyProxy(*echo, delay_s=0.01) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock,
    ):
        got = bytearray()
        sender = threading.Thread(target=sock.sendall, args=(data,))
        sender.start()
        while len(got) < len(data):
            chunk = sock.recv(1 << 20)
            assert chunk, "the proxy closed the connection early"
            got += chunk
        sender.join()
        assert bytes(got) == data
        # One turn: the client spoke, the server answered while it was still sending.
        assert proxy.requests >= 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="delay_s"):
        LatencyProxy("127.0.0.1", 1, delay_s=-0.001)
    with pytest.raises(ValueError, match="max_connections"):
        LatencyProxy("127.0.0.1", 1, delay_s=0.0, max_connections=0)


def test_harness_options() -> None:
    args = parse_args(["--s3-latency-ms", "20", "--sample-sizes", "10K,100K,1M"])
    assert args.s3_latency_ms == 20.0
    assert args.sample_size_list == [10 * 1024, 100 * 1024, 1024 * 1024]
    assert parse_args([]).sample_size_list == [100 * 1024]
    with pytest.raises(SystemExit):
        parse_args(["--s3-latency-ms", "-5"])
    with pytest.raises(SystemExit):
        parse_args(["--sample-sizes", "10K,lots"])

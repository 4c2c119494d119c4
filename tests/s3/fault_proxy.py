"""A loopback HTTP/1.1 reverse proxy that injects object-store faults (tests and harnesses).

Put it in front of an S3-protocol server and point a client at
:attr:`FaultProxy.endpoint`. Each request is, at the set rates (seeded), either
forwarded untouched or hit by one fault:

``error_500``
    ``500 InternalError`` with an S3 XML error body; the server never sees the request.
``slow_down``
    ``503 SlowDown`` with an S3 XML error body; the server never sees the request.
``timeout``
    No answer for :attr:`FaultProxy.timeout_delay` seconds (longer than the
    client's timeout), then the connection is closed. Half of them are held
    *before* the request reaches the server, half *after* it was served (the
    work is done, the reply is lost).
``reset``
    The connection is reset (TCP RST, no response). Half before forwarding,
    half after the server answered (the reply is lost).
``truncate``
    The request is served, the response's ``Content-Length`` says N but fewer
    bytes are sent, then the connection is closed. A response without a body
    is cut inside its status line instead.

:meth:`FaultProxy.inject_next` queues specific faults for the next matching
requests (deterministic tests); :meth:`FaultProxy.down` refuses connections
entirely (the object store is down) until :meth:`FaultProxy.up`.

Wire details that matter for S3 clients:

* The request head is forwarded byte for byte: AWS SigV4 signs the ``Host``
  header (and others), so nothing in it may change.
* Request bodies are framed by ``Content-Length`` or ``Transfer-Encoding:
  chunked`` (forwarded raw, trailers included; ``aws-chunked`` streaming
  signatures live inside the body and pass untouched). ``Expect: 100-continue``
  is answered by the proxy itself (``100 Continue``) and the server's own
  interim ``100`` is swallowed. What the clients in this project send: obstore
  (reqwest) sends ``Content-Length`` bodies and no ``Expect``; botocore sends
  ``Content-Length`` bodies, and ``Expect: 100-continue`` on PutObject/UploadPart
  with a file-like body.
* Responses are read whole and re-sent with ``Content-Length`` (a chunked
  response is de-chunked), so a truncation is always a short body under a
  definite length. Keep-alive is kept on both sides; one upstream connection
  per client connection.

Everything binds to 127.0.0.1, every socket wait is bounded, and the context
manager stops and joins every thread it started.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import IO, Literal
from urllib.parse import urlsplit

FaultKind = Literal["error_500", "slow_down", "timeout", "reset", "truncate"]
#: Every kind, in the order the rates are drawn.
FAULT_KINDS: tuple[FaultKind, ...] = ("error_500", "slow_down", "timeout", "reset", "truncate")
#: Where a fault strikes: before the server sees the request, or after it answered.
Phase = Literal["before", "after"]

_MAX_HEAD = 64 * 1024
_MAX_LINE = 16 * 1024
_JOIN_TIMEOUT = 5.0
_ACCEPT_POLL = 0.1


class ProxyProtocolError(Exception):
    """A malformed or oversized HTTP message (the connection is dropped)."""


@dataclass(frozen=True)
class FaultRates:
    """Per-request probability of each fault kind (their sum must be at most 1)."""

    error_500: float = 0.0
    slow_down: float = 0.0
    timeout: float = 0.0
    reset: float = 0.0
    truncate: float = 0.0

    def __post_init__(self) -> None:
        values = [getattr(self, f.name) for f in fields(self)]
        if any(v < 0 for v in values) or sum(values) > 1:
            raise ValueError(f"fault rates must be >= 0 and sum to at most 1: {self}")

    @classmethod
    def uniform(cls, total: float, *, timeout: bool = True) -> FaultRates:
        """``total`` spread evenly over the kinds (over all but ``timeout`` if it is False)."""
        kinds = [k for k in FAULT_KINDS if timeout or k != "timeout"]
        share = total / len(kinds)
        return cls(**dict.fromkeys(kinds, share))

    @property
    def total(self) -> float:
        """The probability that a request gets any fault."""
        return float(sum(getattr(self, f.name) for f in fields(self)))


@dataclass(frozen=True)
class Injected:
    """One fault that happened: its kind, phase, and the request it hit."""

    kind: FaultKind
    phase: Phase
    method: str
    target: str


@dataclass
class _Request:
    method: str
    target: str
    head: bytes  # the request line and headers, exactly as received
    body: bytes  # the body exactly as framed on the wire (raw chunks if chunked)
    close: bool  # the client asked to close after this exchange


@dataclass
class _Response:
    status: int
    head_lines: list[bytes]  # status line and headers, Transfer-Encoding dropped
    body: bytes
    close: bool  # the server closes after this response

    def encode(self) -> bytes:
        lines = [*self.head_lines, f"Content-Length: {len(self.body)}".encode()]
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body


@dataclass
class _Planned:
    kind: FaultKind
    phase: Phase | None
    match: Callable[[str, str], bool] | None
    remaining: int


@dataclass(eq=False)
class _Conn:
    client: socket.socket
    upstream: socket.socket | None = None
    upstream_reader: IO[bytes] | None = None
    closed: threading.Event = field(default_factory=threading.Event)
    aborted: bool = False  # close with an RST, not a FIN


def _read_line(reader: IO[bytes]) -> bytes:
    line = reader.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ProxyProtocolError("header line too long")
    return line


def _read_head(reader: IO[bytes]) -> list[bytes] | None:
    """Lines of one message head without their CRLF; None on a clean EOF before it."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = _read_line(reader)
        if not line:
            if lines:
                raise ProxyProtocolError("connection closed inside a message head")
            return None
        size += len(line)
        if size > _MAX_HEAD:
            raise ProxyProtocolError("message head too large")
        if line in {b"\r\n", b"\n"}:
            if not lines:
                continue  # stray CRLF between messages is allowed (RFC 9112 2.2)
            return lines
        lines.append(line.rstrip(b"\r\n"))


def _headers(lines: list[bytes]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ProxyProtocolError(f"malformed header line {line[:80]!r}")
        key = name.strip().decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        found[key] = f"{found[key]}, {text}" if key in found else text
    return found


def _read_exact(reader: IO[bytes], n: int) -> bytes:
    data = reader.read(n)
    if len(data) != n:
        raise ProxyProtocolError(f"connection closed {n - len(data)} bytes short of a body")
    return data


def _read_chunked(reader: IO[bytes]) -> tuple[bytes, bytes]:
    """A chunked body: (raw wire bytes incl. trailers, decoded payload)."""
    raw, payload = bytearray(), bytearray()
    while True:
        size_line = _read_line(reader)
        if not size_line:
            raise ProxyProtocolError("connection closed inside a chunked body")
        raw += size_line
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProxyProtocolError(f"bad chunk size line {size_line[:40]!r}") from None
        if size == 0:
            while True:  # trailers, up to the empty line
                trailer = _read_line(reader)
                if not trailer:
                    raise ProxyProtocolError("connection closed inside chunk trailers")
                raw += trailer
                if trailer in {b"\r\n", b"\n"}:
                    return bytes(raw), bytes(payload)
        chunk = _read_exact(reader, size + 2)
        raw += chunk
        payload += chunk[:size]


def _is_chunked(headers: dict[str, str]) -> bool:
    codings = [c.strip().lower() for c in headers.get("transfer-encoding", "").split(",")]
    return codings[-1:] == ["chunked"]


def _wants_close(headers: dict[str, str], version: str) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    return "close" in tokens or (version == "HTTP/1.0" and "keep-alive" not in tokens)


def _reset(sock: socket.socket) -> None:
    """Abort the connection: it closes with a TCP RST (SO_LINGER 0) instead of a FIN.

    ``shutdown(SHUT_RD)`` sends nothing but wakes a thread blocked reading the
    socket; the RST goes out when the last reference (a ``makefile`` reader
    included) is closed.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


def _close(sock: socket.socket | None) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def s3_error_body(code: str, message: str, resource: str, request_id: str) -> bytes:
    """An S3 XML error document."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{_xml_escape(resource)}</Resource>"
        f"<RequestId>{request_id}</RequestId></Error>"
    ).encode()


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_ERRORS: dict[str, tuple[int, str, str, str]] = {
    "error_500": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error.",
    ),
    "slow_down": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


class FaultProxy:
    """A fault-injecting reverse proxy on 127.0.0.1 in front of ``upstream``.

    Args:
        upstream: ``http://host:port`` of the real server.
        rates: fault probabilities per request (default: none).
        seed: seeds the fault draws (the interleaving of concurrent requests
            still varies, so the exact sequence does too).
        timeout_delay: how long a ``timeout`` fault holds a request, in seconds;
            make it longer than the client's request timeout.
        io_timeout: bound on every socket wait of the proxy itself, in seconds.

    Attributes:
        requests: requests received (complete heads) while up.
        forwarded: requests that reached the server.
        connections: client connections accepted.
        injected: every fault that happened, in order.
    """

    def __init__(
        self,
        upstream: str,
        rates: FaultRates | None = None,
        *,
        seed: int = 0,
        timeout_delay: float = 3.0,
        io_timeout: float = 60.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.rates = rates or FaultRates()
        self.timeout_delay = timeout_delay
        self.io_timeout = io_timeout
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._planned: list[_Planned] = []
        self._conns: set[_Conn] = set()
        self._threads: set[threading.Thread] = set()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._accepting: threading.Event | None = None
        self._accept_thread: threading.Thread | None = None
        self._down = False
        self.port = 0
        self.requests = 0
        self.forwarded = 0
        self.connections = 0
        self.injected: list[Injected] = []

    # --- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``: where clients connect."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Bind a free loopback port and start accepting."""
        if self.port:
            raise RuntimeError("this proxy was started already")
        self._listen()

    def stop(self) -> None:
        """Close every socket and join every thread (bounded)."""
        self._stop.set()
        self._stop_listening()
        self._drop_connections()
        with self._lock:
            threads = list(self._threads)
        deadline = time.monotonic() + _JOIN_TIMEOUT
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def down(self) -> None:
        """The object store is down: stop listening (connections are refused) and drop all."""
        with self._lock:
            self._down = True
        self._stop_listening()
        self._drop_connections()

    def up(self) -> None:
        """Listen again on the same port."""
        with self._lock:
            if not self._down:
                return
            self._down = False
        self._listen()

    @property
    def is_down(self) -> bool:
        """Whether :meth:`down` is in effect."""
        return self._down

    # --- fault control ---------------------------------------------------------------

    def set_rates(self, rates: FaultRates) -> None:
        """Change the fault rates from the next request on."""
        with self._lock:
            self.rates = rates

    def inject_next(
        self,
        kind: FaultKind,
        count: int = 1,
        *,
        phase: Phase | None = None,
        match: Callable[[str, str], bool] | None = None,
    ) -> None:
        """Hit the next ``count`` requests for which ``match(method, target)`` holds with ``kind``.

        ``phase`` forces before/after where the kind has both (default: drawn).
        Queued faults take precedence over the rates.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self._planned.append(_Planned(kind, phase, match, count))

    @property
    def counts(self) -> dict[str, int]:
        """Injected faults by kind (every kind present, zeros included)."""
        with self._lock:
            counter = Counter(i.kind for i in self.injected)
        return {kind: counter.get(kind, 0) for kind in FAULT_KINDS}

    @property
    def phase_counts(self) -> dict[str, int]:
        """Injected faults by ``kind/phase``."""
        with self._lock:
            counter = Counter(f"{i.kind}/{i.phase}" for i in self.injected)
        return dict(sorted(counter.items()))

    @property
    def total_injected(self) -> int:
        """How many faults were injected."""
        with self._lock:
            return len(self.injected)

    @contextlib.contextmanager
    def rates_set_to(self, rates: FaultRates) -> Iterator[None]:
        """Use ``rates`` inside the block, then the previous ones again."""
        with self._lock:
            before, self.rates = self.rates, rates
        try:
            yield
        finally:
            with self._lock:
                self.rates = before

    def _draw(self, method: str, target: str) -> tuple[FaultKind, Phase] | None:
        with self._lock:
            self.requests += 1
            for plan in self._planned:
                if plan.remaining > 0 and (plan.match is None or plan.match(method, target)):
                    plan.remaining -= 1
                    self._planned = [p for p in self._planned if p.remaining > 0]
                    phase = plan.phase or self._phase_for(plan.kind)
                    return plan.kind, phase
            pick = self._rng.random()
            for kind in FAULT_KINDS:
                rate = float(getattr(self.rates, kind))
                if pick < rate:
                    return kind, self._phase_for(kind)
                pick -= rate
            return None

    def _phase_for(self, kind: FaultKind) -> Phase:
        if kind in {"error_500", "slow_down"}:
            return "before"
        if kind == "truncate":
            return "after"
        return "before" if self._rng.random() < 0.5 else "after"

    def _record(self, kind: FaultKind, phase: Phase, request: _Request) -> None:
        with self._lock:
            self.injected.append(Injected(kind, phase, request.method, request.target))

    # --- sockets ---------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(_ACCEPT_POLL)
        self.port = int(listener.getsockname()[1])
        accepting = threading.Event()
        accepting.set()
        thread = threading.Thread(
            target=self._accept_loop,
            args=(listener, accepting),
            name=f"fault-proxy-accept-{self.port}",
            daemon=True,
        )
        with self._lock:
            self._listener, self._accepting, self._accept_thread = listener, accepting, thread
            self._threads.add(thread)
        thread.start()

    def _stop_listening(self) -> None:
        with self._lock:
            listener, accepting, thread = self._listener, self._accepting, self._accept_thread
            self._listener = self._accepting = self._accept_thread = None
        if accepting is not None:
            accepting.clear()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_JOIN_TIMEOUT)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()

    def _drop_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            self._close_conn(conn, reset=True)

    def _accept_loop(self, listener: socket.socket, accepting: threading.Event) -> None:
        try:
            while accepting.is_set() and not self._stop.is_set():
                try:
                    client, _addr = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not accepting.is_set():
                    _reset(client)
                    return
                client.settimeout(self.io_timeout)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = _Conn(client)
                thread = threading.Thread(
                    target=self._serve, args=(conn,), name="fault-proxy-conn", daemon=True
                )
                with self._lock:
                    self.connections += 1
                    self._conns.add(conn)
                    self._threads.add(thread)
                thread.start()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _close_conn(self, conn: _Conn, *, reset: bool) -> None:
        conn.closed.set()
        if reset or conn.aborted:
            conn.aborted = True
            _reset(conn.client)
        else:
            _close(conn.client)
        self._close_upstream(conn)

    def _abort(self, conn: _Conn) -> None:
        """Reset the client connection (the serving thread closes it with an RST)."""
        conn.aborted = True
        _reset(conn.client)

    def _close_upstream(self, conn: _Conn) -> None:
        upstream, reader = conn.upstream, conn.upstream_reader
        conn.upstream, conn.upstream_reader = None, None
        _close(upstream)
        if reader is not None:
            with contextlib.suppress(OSError):
                reader.close()

    # --- one client connection -------------------------------------------------------

    def _serve(self, conn: _Conn) -> None:
        reader = conn.client.makefile("rb")
        try:
            while not conn.closed.is_set() and not self._stop.is_set():
                request = self._read_request(conn, reader)
                if request is None or not self._exchange(conn, request):
                    break
        except (OSError, ProxyProtocolError):
            pass  # a client that went away or spoke nonsense: drop it
        finally:
            with contextlib.suppress(OSError):
                reader.close()
            self._close_conn(conn, reset=False)
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())

    def _read_request(self, conn: _Conn, reader: IO[bytes]) -> _Request | None:
        lines = _read_head(reader)
        if lines is None:
            return None
        parts = lines[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise ProxyProtocolError(f"bad request line {lines[0][:80]!r}")
        method, target, version = parts
        headers = _headers(lines)
        if headers.get("expect", "").lower() == "100-continue":
            conn.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if _is_chunked(headers):
            body, _payload = _read_chunked(reader)
        elif "content-length" in headers:
            body = _read_exact(reader, int(headers["content-length"]))
        else:
            body = b""
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        return _Request(method, target, head, body, _wants_close(headers, version))

    def _exchange(self, conn: _Conn, request: _Request) -> bool:
        """Answer one request (or fault it); whether the client connection stays open."""
        if conn.closed.is_set():
            return False  # dropped (down or stop) while the request was being read
        fault = self._draw(request.method, request.target)
        kind, phase = fault if fault is not None else (None, None)
        if kind in _ERRORS:
            assert kind is not None and phase is not None
            self._record(kind, phase, request)
            conn.client.sendall(self._error_response(kind, request))
            return not request.close
        if phase == "before":
            assert kind is not None
            self._record(kind, phase, request)
            if kind == "timeout":
                self._hold(conn)
            self._abort(conn)
            return False
        try:
            response = self._forward(conn, request)
        except (OSError, ProxyProtocolError):
            self._close_upstream(conn)
            self._abort(conn)  # the server failed us: the client sees a reset
            return False
        if kind is None:
            conn.client.sendall(response.encode())
            if response.close:
                self._close_upstream(conn)
            return not (request.close or response.close)
        assert phase is not None
        self._record(kind, phase, request)
        self._close_upstream(conn)
        if kind == "timeout":
            self._hold(conn)
            self._abort(conn)
        elif kind == "reset":
            self._abort(conn)
        else:  # truncate
            wire = response.encode()
            head_len = wire.index(b"\r\n\r\n") + 4
            body_len = len(wire) - head_len
            status_len = wire.index(b"\r\n")
            with self._lock:
                cut = head_len + self._rng.randrange(body_len) if body_len else status_len // 2
            conn.client.sendall(wire[:cut])
            _close(conn.client)
        return False

    def _hold(self, conn: _Conn) -> None:
        """Keep the client waiting (bounded by timeout_delay, cut short by stop or down)."""
        deadline = time.monotonic() + self.timeout_delay
        while not conn.closed.is_set() and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            conn.closed.wait(min(remaining, 0.05))

    def _error_response(self, kind: FaultKind, request: _Request) -> bytes:
        status, reason, code, message = _ERRORS[kind]
        request_id = f"mouthguard-fault-proxy-{self.requests}"
        body = b""
        if request.method != "HEAD":
            resource = urlsplit(request.target).path
            body = s3_error_body(code, message, resource, request_id)
        head = [
            f"HTTP/1.1 {status} {reason}",
            "Content-Type: application/xml",
            f"x-amz-request-id: {request_id}",
            f"Content-Length: {len(body)}",
        ]
        if status == 503:
            head.append("Retry-After: 0")
        if request.close:
            head.append("Connection: close")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    def _forward(self, conn: _Conn, request: _Request) -> _Response:
        if conn.upstream is None:
            upstream = socket.create_connection(self.upstream, timeout=self.io_timeout)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.upstream, conn.upstream_reader = upstream, upstream.makefile("rb")
        assert conn.upstream is not None and conn.upstream_reader is not None
        conn.upstream.sendall(request.head + request.body)
        with self._lock:
            self.forwarded += 1
        reader = conn.upstream_reader
        while True:
            lines = _read_head(reader)
            if lines is None:
                raise ProxyProtocolError("the server closed the connection without answering")
            status_parts = lines[0].decode("latin-1").split(" ", 2)
            if len(status_parts) < 2 or not status_parts[1].isdigit():
                raise ProxyProtocolError(f"bad status line {lines[0][:80]!r}")
            status = int(status_parts[1])
            if not 100 <= status < 200 or status == 101:
                break  # interim responses (100 Continue) are swallowed: we sent our own
        headers = _headers(lines)
        close = _wants_close(headers, status_parts[0])
        if request.method == "HEAD" or status in {204, 304}:
            body = b""
        elif _is_chunked(headers):
            _raw, body = _read_chunked(reader)
        elif "content-length" in headers:
            body = _read_exact(reader, int(headers["content-length"]))
        else:
            body, close = reader.read(), True  # delimited by the close
        keep = [
            line
            for line in lines[1:]
            if line.split(b":", 1)[0].strip().lower()
            not in {b"transfer-encoding", b"content-length"}
        ]
        if request.method == "HEAD" and "content-length" in headers:
            # A HEAD's Content-Length describes the object: keep it, send no body.
            head = [lines[0], *keep, f"Content-Length: {headers['content-length']}".encode()]
            return _HeadResponse(status, head, b"", close)
        return _Response(status, [lines[0], *keep], body, close)


class _HeadResponse(_Response):
    """A response to HEAD: the head lines already carry the object's Content-Length."""

    def encode(self) -> bytes:
        return b"\r\n".join(self.head_lines) + b"\r\n\r\n"

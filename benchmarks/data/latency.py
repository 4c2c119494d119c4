"""A loopback TCP proxy that adds a fixed delay to every request: S3 as far away as a bucket.

The benchmark's RGW answers on loopback in well under a millisecond, so a loader
that reads one range after another loses nothing to waiting, while against a real
bucket every request costs a round trip of tens of milliseconds and only requests
kept in flight (parallel ranges, prefetch) hide it. :class:`LatencyProxy` sits
between every reader and the server and holds each request back ``delay_s`` before
passing it on, so every reader (mouthguard and the peers alike) pays the same
delay per request.

What counts as a request: HTTP/1.1 clients (boto3, obstore, curl, fsspec) send one
request on a connection, then wait for its whole response before the next
(none pipelines). So a connection alternates turns, and the first bytes the
client sends in a turn (a fresh connection, or after the server has answered) are
delayed; bytes that continue the same turn (a request body) are not. A PUT with
``Expect: 100-continue`` takes two turns (headers, then the body after the
``100``): the benchmark uploads straight to the server, not through the proxy.

Bytes pass through unchanged, in order, in both directions. Bounds: at most
``max_connections`` connections are served at once (two threads each, plus the
accept thread); a further client waits in the listen backlog until one closes.
Each thread holds one buffer of at most :data:`CHUNK` bytes. The proxy binds
127.0.0.1 only and stops (every connection closed, every thread joined) when its
``with`` block ends.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from contextlib import AbstractContextManager
from types import TracebackType

#: Bytes read from one side before they are written to the other.
CHUNK = 256 * 1024
#: Connections served at once (each loader worker keeps a pool of a few).
MAX_CONNECTIONS = 64
#: How often blocked threads look at the stop flag.
_POLL_S = 0.2


class LatencyProxy(AbstractContextManager["LatencyProxy"]):
    """``with LatencyProxy("127.0.0.1", 7480, delay_s=0.02) as p:`` clients use ``p.endpoint``.

    Args:
        host, port: the server the proxy forwards to.
        delay_s: added before each request is passed on (≥ 0).
        max_connections: connections served at once (≥ 1).

    Raises:
        ValueError: a negative delay or a bound below 1.
    """

    def __init__(
        self, host: str, port: int, delay_s: float, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be ≥ 0, got {delay_s}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be ≥ 1, got {max_connections}")
        self._target = (host, port)
        self.delay_s = delay_s
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        #: Requests delayed so far, and the most connections open at once (for tests).
        self.requests = 0
        self.peak_connections = 0
        self._open = 0

    @property
    def port(self) -> int:
        assert self._listener is not None, "the proxy is not running"
        return int(self._listener.getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LatencyProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(_POLL_S)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, name="latency-accept", daemon=True)
        self._acceptor.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._acceptor is not None:
            self._acceptor.join()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            threads = list(self._threads)
        for thread in threads:
            thread.join()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            # A slot first: past the bound, clients wait in the listen backlog.
            if not self._slots.acquire(timeout=_POLL_S):
                continue
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                self._slots.release()
                continue
            except OSError:
                self._slots.release()
                return
            try:
                server = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                self._slots.release()
                continue
            self._start(client, server)

    def _start(self, client: socket.socket, server: socket.socket) -> None:
        for sock in (client, server):
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        turn = _Turn()
        pair = _Pair(client, server, self)
        upstream = threading.Thread(
            target=self._pump,
            args=(client, server, turn, True, pair),
            name="latency-up",
            daemon=True,
        )
        downstream = threading.Thread(
            target=self._pump,
            args=(server, client, turn, False, pair),
            name="latency-down",
            daemon=True,
        )
        with self._lock:
            self._sockets |= {client, server}
            self._threads |= {upstream, downstream}
            self._open += 1
            self.peak_connections = max(self.peak_connections, self._open)
        upstream.start()
        downstream.start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, turn: _Turn, request: bool, pair: _Pair
    ) -> None:
        """Copy ``src`` to ``dst`` until either side closes; delay each request's first bytes."""
        try:
            while not self._stop.is_set():
                data = src.recv(CHUNK)
                if not data:
                    break
                if request and turn.client_starts():
                    with self._lock:
                        self.requests += 1
                    # Sleeping here, not in the server's direction: the server sees the
                    # request late, as it would across a network.
                    self._stop.wait(self.delay_s)
                elif not request:
                    turn.server_answered()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # One side is done: end the other direction too (HTTP has no half-close use).
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                src.shutdown(socket.SHUT_RDWR)
            pair.done(threading.current_thread())

    def finished(self, pair: _Pair, thread: threading.Thread, *, last: bool) -> None:
        """One of ``pair``'s threads ended; the last one closes it and frees its slot."""
        if last:
            for sock in pair.sockets:
                sock.close()
        with self._lock:
            if last:
                self._sockets -= set(pair.sockets)
                self._open -= 1
            # Last of all: the set holds live threads only (bounded), and __exit__ joins
            # every thread that could still touch a socket.
            self._threads.discard(thread)
        if last:
            self._slots.release()


class _Turn:
    """Whose turn a connection is in: the client's next bytes start a request or continue one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting = True  # a fresh connection: the client speaks first

    def client_starts(self) -> bool:
        """True when these client bytes start a new request (and it is the client's turn now)."""
        with self._lock:
            starts, self._waiting = self._waiting, False
            return starts

    def server_answered(self) -> None:
        with self._lock:
            self._waiting = True


class _Pair:
    """The two sockets of one connection; the second of its threads to end closes them."""

    def __init__(self, client: socket.socket, server: socket.socket, proxy: LatencyProxy) -> None:
        self.sockets = (client, server)
        self._proxy = proxy
        self._left = 2
        self._lock = threading.Lock()

    def done(self, thread: threading.Thread) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        self._proxy.finished(self, thread, last=last)

"""Serving the dashboard with uvicorn: in the foreground (the CLI) or in a thread (embedding).

The listening socket is bound here, before uvicorn starts, so that port 0 (any
free port) works and the caller knows the real address before the first
request; uvicorn serves on that socket. Binding is to the host given, loopback
by default; nothing here widens it.
"""

from __future__ import annotations

import signal
import socket
import threading
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette

#: How long :meth:`DashboardThread.start` waits for uvicorn to accept connections.
START_TIMEOUT = 30.0


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (port 0: a free one), IPv4 or IPv6."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class Address:
    """Where the dashboard listens."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _server(app: Starlette) -> uvicorn.Server:
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    return uvicorn.Server(config)


def serve_forever(app: Starlette, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` in this thread until interrupted (Ctrl-C, SIGTERM).

    Raises:
        KeyboardInterrupt: after a graceful shutdown that a SIGINT started.
    """
    server = _server(app)
    server.run(sockets=[sock])
    # uvicorn shuts down on SIGINT, then restores the handler it found and raises the
    # signal again so that the process ends as Ctrl-C asks. A process started with
    # SIGINT ignored (a background job of a non-interactive shell, as CI's parallel
    # lanes are) gets SIG_IGN back, the second SIGINT is ignored, and run() returns as
    # if the server had simply stopped: exit 0 instead of 130. What uvicorn captured
    # decides here instead.
    if signal.SIGINT in getattr(server, "_captured_signals", ()):
        raise KeyboardInterrupt


class DashboardThread:
    """``app`` served on ``host``:``port`` from a background thread (tests, embedding).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``address``
    is known once :meth:`start` returns, with the real port when ``port`` was 0.
    """

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = bind(host, port)
        self.address = Address(host, self._sock.getsockname()[1])
        self._server = _server(app)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self) -> DashboardThread:
        """Start serving; returns once uvicorn accepts connections.

        Raises:
            RuntimeError: uvicorn did not start within :data:`START_TIMEOUT` seconds.
        """
        self._thread.start()
        started = threading.Event()
        for _ in range(int(START_TIMEOUT / 0.01)):  # bounded: uvicorn has no start callback
            if self._server.started or not self._thread.is_alive():
                break
            started.wait(0.01)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"the dashboard did not start on {self.address.url}")
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (waits for the thread, bounded)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=START_TIMEOUT)
        self._sock.close()

    def __enter__(self) -> DashboardThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

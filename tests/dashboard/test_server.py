"""serve_forever: how a SIGINT that uvicorn captured ends the call."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable

import pytest
import uvicorn
from starlette.applications import Starlette

from mouthguard.dashboard import server


def _returning_after(captured: list[int]) -> Callable[..., None]:
    """A stand-in for uvicorn.Server.run: shut down gracefully after ``captured`` signals."""

    def run(self: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        self._captured_signals.extend(captured)

    return run


def test_a_captured_sigint_comes_out_as_keyboard_interrupt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # uvicorn raises a captured SIGINT again after shutting down; where the process
    # ignores SIGINT (started as a background job) that is lost and run() returns:
    # serve_forever still ends as Ctrl-C asks (main maps it to 130).
    monkeypatch.setattr(uvicorn.Server, "run", _returning_after([signal.SIGINT]))
    with socket.socket() as sock, pytest.raises(KeyboardInterrupt):
        server.serve_forever(Starlette(), sock)


def test_a_shutdown_without_sigint_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn.Server, "run", _returning_after([]))
    with socket.socket() as sock:
        server.serve_forever(Starlette(), sock)

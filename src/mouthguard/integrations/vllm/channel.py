"""The scheduler's questions to the workers' stores, over a local socket.

vLLM runs its scheduler and its workers in different processes (one worker per
tensor-parallel rank), and the KV blocks live where the paged buffers are: each
worker owns a :class:`~mouthguard.kvcache.KVStore` for its rank. The scheduler
still has to know, before it allocates, how much of a prompt those stores hold,
and to pin what it decides to load. So every worker serves four
small calls on a Unix socket and the scheduler calls them:

==============  =======================================  ==================
call            worker does                               scheduler gets
==============  =======================================  ==================
``lookup``      ``store.longest_prefix(tokens)``         tokens covered
``pin``         ``store.pin(tokens)``                    tokens pinned, per rank
``unpin``       ``store.unpin(tokens, n)``               nothing
==============  =======================================  ==================

With several ranks the scheduler takes the minimum: a block counts only if every
rank holds its heads. Messages are a JSON header and the tokens as little-endian
int64 (no pickle: the socket is a trust boundary, however local). The socket lives
in a directory only its user can enter (``$TMPDIR/mouthguard-vllm-<uid>``, mode
0700), which is the access control; its name carries the engine id and the rank.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mouthguard.errors import KVCacheError

log = logging.getLogger(__name__)

#: How long the scheduler waits for a worker's socket to appear (engine start-up).
CONNECT_TIMEOUT_S = 120.0


class PrefixStore(Protocol):
    """The part of :class:`~mouthguard.kvcache.KVStore` the scheduler reaches."""

    def longest_prefix(self, token_ids: Any) -> int: ...  # noqa: D102
    def pin(self, token_ids: Any) -> int: ...  # noqa: D102
    def unpin(self, token_ids: Any, tokens: int | None = None) -> None: ...  # noqa: D102


def socket_dir() -> str:
    """The per-user directory of the sockets, created 0700 (refused if someone else's)."""
    path = Path(tempfile.gettempdir()) / f"mouthguard-vllm-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise KVCacheError(f"{path} must be a directory of this user with mode 0700")
    return str(path)


def socket_path(engine_id: str, tp_rank: int) -> str:
    """The socket of one engine's rank."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in engine_id)[:64]
    return str(Path(socket_dir()) / f"{safe}-tp{tp_rank}.sock")


def _tokens_bytes(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i8").tobytes()


class LookupServer:
    """Serves a worker's store to the scheduler (see the module docstring).

    One thread accepts connections; each connection gets a thread that answers its
    calls in order. :meth:`close` stops accepting and removes the socket.
    """

    def __init__(self, store: PrefixStore, path: str) -> None:
        self._store = store
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()  # left by a worker that died: the engine id is ours
        self._listener = Listener(path, family="AF_UNIX")
        self._closed = False
        self._thread = threading.Thread(
            target=self._accept, name="mouthguard-vllm-lookup", daemon=True
        )
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._serve, args=(conn,), name="mouthguard-vllm-conn", daemon=True
            ).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    header = json.loads(conn.recv_bytes())
                    tokens = np.frombuffer(conn.recv_bytes(), dtype="<i8")
                except (EOFError, OSError):
                    return
                try:
                    reply: dict[str, Any] = {"ok": self._call(header, tokens)}
                except Exception as error:  # noqa: BLE001 - reported to the caller
                    reply = {"error": f"{type(error).__name__}: {error}"}
                try:
                    conn.send_bytes(json.dumps(reply).encode())
                except OSError:
                    return

    def _call(self, header: dict[str, Any], tokens: np.ndarray[Any, Any]) -> int:
        op = header.get("op")
        if op == "lookup":
            return self._store.longest_prefix(tokens)
        if op == "pin":
            # no prefetch: the worker's load reads these blocks right away (in this
            # step's forward, or on its thread), and a prefetch racing it read every
            # disk block a second time (counted: 42 extra disk reads for 3 loads of
            # 15 blocks) and competed with it for the cores
            return self._store.pin(tokens)
        if op == "unpin":
            self._store.unpin(tokens, int(header["tokens"]))
            return 0
        raise KVCacheError(f"unknown call {op!r}")

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self._closed = True
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            Path(self.path).unlink()


class LookupClient:
    """The scheduler's side: one connection per rank, opened on first use."""

    def __init__(self, paths: Sequence[str], *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._paths = list(paths)
        self._timeout_s = timeout_s
        self._conns: list[Connection] = []
        self._lock = threading.Lock()

    def _connect(self) -> list[Connection]:
        if not self._conns:
            deadline = time.monotonic() + self._timeout_s
            for path in self._paths:
                while True:
                    try:
                        self._conns.append(Client(path, family="AF_UNIX"))
                        break
                    except (FileNotFoundError, ConnectionRefusedError):
                        if time.monotonic() > deadline:
                            raise KVCacheError(
                                f"no mouthguard worker answered at {path} within "
                                f"{self._timeout_s:.0f} s"
                            ) from None
                        time.sleep(0.05)
        return self._conns

    def _ask(
        self, op: str, tokens: Sequence[int], counts: Sequence[int] | None = None
    ) -> list[int]:
        payload = _tokens_bytes(tokens)
        with self._lock:
            conns = self._connect()
            # send to every rank, then collect: the ranks work at once
            for rank, conn in enumerate(conns):
                extra = {} if counts is None else {"tokens": int(counts[rank])}
                conn.send_bytes(json.dumps({"op": op, **extra}).encode())
                conn.send_bytes(payload)
            replies = [json.loads(conn.recv_bytes()) for conn in conns]
        for reply in replies:
            if "error" in reply:
                raise KVCacheError(f"mouthguard worker: {reply['error']}")
        return [int(r["ok"]) for r in replies]

    def longest_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` that every rank's store covers."""
        return min(self._ask("lookup", tokens))

    def pin(self, tokens: Sequence[int]) -> list[int]:
        """Pin the stored prefix on every rank; the tokens pinned, per rank.

        Pass ``tokens`` cut to what the scheduler will load, so no rank pins more.
        """
        return self._ask("pin", tokens)

    def unpin(self, tokens: Sequence[int], pinned: Sequence[int]) -> None:
        """Release a :meth:`pin` (``pinned``: what it returned, one count per rank)."""
        self._ask("unpin", tokens, pinned)

    def close(self) -> None:
        """Close the connections."""
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns = []

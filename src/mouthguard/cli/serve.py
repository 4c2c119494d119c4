"""``mouthguard serve``: the operator's web page, ``/api`` JSON and Prometheus ``/metrics``.

Serves :mod:`mouthguard.dashboard` for the store given with ``--store`` until
interrupted. Binds to 127.0.0.1 unless ``--host`` says otherwise (then the page
and the API answer any host name: whoever reaches the port reads them).

Read-only by default. ``--allow-mutations`` enables hold, release and
importance changes, each request authorised by the token in
``$MOUTHGUARD_SERVE_TOKEN`` (at least 16 characters; taken from the environment
so that it never shows in a process listing).

Exit codes (:mod:`mouthguard.cli.common`): on Ctrl-C or SIGTERM the server shuts
down gracefully and the process then ends as the signal asks (uvicorn raises it
again): 130 for Ctrl-C, killed by SIGTERM (a shell reports 143). 2 usage
errors: the ``serve`` extra is not installed (the message says what to install),
``--allow-mutations`` without a token, a port that cannot be bound, an unknown
store.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from rich.console import Console
from rich.markup import escape

from mouthguard.checkpoint.peer_memory import DEFAULT_PATH as DEFAULT_PEER_PATH
from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import EXIT_OK, NON_NEGATIVE, Handler, UsageError, integer

#: How to get the web stack, which only ``serve`` needs.
SERVE_EXTRA = "pip install 'mouthguard[serve]'"
TOKEN_ENV = "MOUTHGUARD_SERVE_TOKEN"  # noqa: S105 - the variable's name, not a secret
MIN_TOKEN = 16
DEFAULT_PORT = 8750
_THIRD_PARTY = ("starlette", "uvicorn", "prometheus_client")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve``."""
    serve = sub.add_parser(
        "serve",
        help="web page, /api JSON and Prometheus /metrics for the store",
        description="Serve the operator's page, /api JSON and Prometheus /metrics for the "
        "store until interrupted. Read-only unless --allow-mutations.",
        epilog=f"exit status: 130 interrupted (Ctrl-C); 2 usage error (the serve extra missing: "
        f"{SERVE_EXTRA}; --allow-mutations without ${TOKEN_ENV}; a port in use)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=integer(0, 65535),  # a TCP port; bind() would fail with a traceback past it
        default=DEFAULT_PORT,
        help=f"port to bind (default {DEFAULT_PORT}; 0: any free port)",
    )
    serve.add_argument(
        "--refresh-seconds",
        type=NON_NEGATIVE,
        default=10.0,
        help="read the store again once the shown state is this old (default 10)",
    )
    serve.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="LOCATION",
        help="also list this dataset (directory or s3:// URL); repeatable",
    )
    serve.add_argument(
        "--peers",
        nargs="?",
        const=DEFAULT_PEER_PATH,
        metavar="PATH",
        help=f"also show the peer memory under PATH, per node (default {DEFAULT_PEER_PATH})",
    )
    serve.add_argument(
        "--allow-mutations",
        action="store_true",
        help=f"allow hold, release and importance changes, with the token in ${TOKEN_ENV}",
    )


def _require_extra() -> None:
    """Import the dashboard, or raise a usage error naming the extra to install."""
    try:
        import mouthguard.dashboard  # noqa: F401, PLC0415 - only serve pays for the web stack
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in _THIRD_PARTY:
            raise  # a broken mouthguard, not a missing extra: let it show
        raise UsageError(f"serve needs the web stack, an optional extra: {SERVE_EXTRA}") from None


def _token(args: argparse.Namespace) -> str | None:
    if not args.allow_mutations:
        return None
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < MIN_TOKEN:
        raise UsageError(
            f"--allow-mutations needs a token of at least {MIN_TOKEN} characters in ${TOKEN_ENV}"
        )
    return token


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(store: Store, args: argparse.Namespace, console: Console) -> int:
    """Serve until interrupted (see the module docstring); returns only if uvicorn stops alone."""
    token = _token(args)
    _require_extra()  # before anything is read or bound
    # After the check, so that a missing extra is one line, not a traceback.
    from mouthguard.dashboard import SnapshotCache, Sources, create_app, server  # noqa: PLC0415
    from mouthguard.dashboard.app import LOOPBACK_NAMES  # noqa: PLC0415

    loopback = _is_loopback(args.host)
    try:
        sock = server.bind(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    address = server.Address(args.host, sock.getsockname()[1])
    cache = SnapshotCache(store, max_age=args.refresh_seconds)
    with console.status(f"reading {escape(str(store.source))}"):
        snapshot = cache.refresh()
    app = create_app(
        cache,
        token=token,
        sources=Sources(datasets=tuple(args.dataset), peers=args.peers),
        allowed_hosts=LOOPBACK_NAMES if loopback else ("*",),
    )
    mode = "mutations allowed with the token" if token else "read-only"
    console.print(
        f"serving {escape(str(store.source))} ({len(snapshot.rows)} checkpoints, read in "
        f"{snapshot.build_seconds:.2f} s) on {address.url} ({mode}); Ctrl-C stops",
        highlight=False,
        soft_wrap=True,
    )
    if not loopback:
        console.print(
            f"[yellow]warning:[/yellow] bound to {escape(args.host)}: anyone who reaches "
            "this port can read the page, the API and the metrics",
            highlight=False,
        )
    sys.stdout.flush()
    server.serve_forever(app, sock)
    return EXIT_OK


HANDLERS: dict[str, Handler] = {"serve": run}

__all__ = ["HANDLERS", "SERVE_EXTRA", "add_parser"]

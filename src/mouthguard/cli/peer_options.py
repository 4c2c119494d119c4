"""The ``--peer-*`` options of ``plan`` and ``simulate``: the peer-memory model's figures.

Each option sets one field of :class:`~mouthguard.plan.peers.PeerModel`; an
option not given keeps the model's default (so the defaults live in one place).
"""

from __future__ import annotations

import argparse
from typing import Any

from mouthguard.cli.common import BYTES, COUNT, integer

__all__ = ["add_peer_options", "peer_changes"]

#: (flag, argparse type, help, the PeerModel field it sets).
_OPTIONS: tuple[tuple[str, Any, str, str], ...] = (
    ("--peer-replication", COUNT, "peers: copies of each rank's file (default 2)", "replication"),
    (
        "--peer-gpus-per-domain",
        COUNT,
        "peers: GPUs per failure domain (default 8)",
        "gpus_per_domain",
    ),
    (
        "--peer-failed-domains",
        COUNT,
        "peers: domains one failure takes (default 1)",
        "failed_domains",
    ),
    (
        "--peer-durable-every",
        integer(0),
        "peers: every Nth save also durable (default 10)",
        "durable_every",
    ),
    (
        "--peer-link-bandwidth",
        BYTES,
        "peers: a domain's link, bytes/s (default 25G)",
        "link_bytes_per_s",
    ),
)


def add_peer_options(p: argparse.ArgumentParser) -> None:
    """Add the ``--peer-*`` options (each defaults to None: the model's default)."""
    for flag, kind, text, _field in _OPTIONS:
        p.add_argument(flag, type=kind, default=None, help=text)


def peer_changes(args: argparse.Namespace) -> dict[str, Any]:
    """PeerModel field -> value, for the ``--peer-*`` options given."""
    out: dict[str, Any] = {}
    for flag, _kind, _text, field in _OPTIONS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            out[field] = value
    return out

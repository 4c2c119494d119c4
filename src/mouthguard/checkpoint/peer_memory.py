"""Peer memory's settings and one node's area of it.

:class:`PeerMemory` is what a user passes (``Checkpointer(..., peers=PeerMemory())``).
:class:`NodeArea` is the shared-memory directory of one failure domain: it
outlives the training processes (torchrun restarts every worker of a job when
one fails) and dies with the node. Its layout is a checkpoint tier's::

    <path>/node-<domain>/<run>/<step:012d>/rank-<r>.safetensors   this node's ranks' files
                                                                  and the copies it holds
    <path>/node-<domain>/<run>/<step:012d>/manifest.json          written last, create-only:
                                                                  the step is complete

A manifest is written into a node's area only once every rank's copies are in
place and verified on every holder, so a step directory without one is an
interrupted save, never loaded and deleted by the next prune.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mouthguard.checkpoint import catalog
from mouthguard.tiers.local import LocalTier

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Where node areas live by default: tmpfs, so "on disk" means in the node's RAM. A
#: fixed name per user, because restarted processes must find it again.
DEFAULT_PATH = f"/dev/shm/mouthguard-peers-{os.getuid()}"  # noqa: S108 - see above
#: Bytes of one transfer chunk (a view of the file, not a buffer: see peer_transfer).
#: Smaller chunks let the receiver hash one while the next ones are on the wire.
DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_RANK_FILE = re.compile(r"rank-(\d+)\.safetensors")


@dataclass(frozen=True)
class PeerMemory:
    """Keep each save's rank files in node memory, with copies on peers in other domains.

    Args:
        replication_factor: copies of each rank's file, its own node's included;
            the others go to ranks in other failure domains
            (:mod:`~mouthguard.checkpoint.peer_placement` states the rule).
        path: the directory holding one area per node (``node-<domain>``); the
            default is on /dev/shm. Tests simulate several nodes on one machine by
            giving ranks different domains under one path.
        domains: ``{rank: domain}`` for every rank; default: the launcher's node
            (torchrun's ``GROUP_RANK``, else ``LOCAL_WORLD_SIZE``), else the host name.
        keep: complete steps kept in each node's area; older ones are deleted at
            the next save. A node holds at most ``keep`` (+1 while a save is in
            flight) times the rank files of its ranks plus the copies it holds.
        disk_every: besides milestone and critical saves, which always go to the
            store too, every ``disk_every``-th transient or routine save also goes
            there (0: never; they live in peer memory only).
        chunk_bytes: transfer chunk: the bytes one send covers and the receiver
            hashes at a time (the link sends from and receives into the files
            themselves, so it adds no buffers of this size).
        timeout: seconds a peer transfer waits before the peer is given up on.
    """

    replication_factor: int = 2
    path: str | os.PathLike[str] = DEFAULT_PATH
    domains: Mapping[int, object] | None = field(default=None, hash=False)
    keep: int = 2
    disk_every: int = 0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    timeout: float = 300.0

    def __post_init__(self) -> None:
        """Refuse settings that cannot work, naming the setting."""
        if self.replication_factor < 1:
            raise ValueError(f"replication_factor must be >= 1, got {self.replication_factor}")
        if self.keep < 1:
            raise ValueError(f"keep must be >= 1 step, got {self.keep}")
        if self.disk_every < 0:
            raise ValueError(f"disk_every must be >= 0, got {self.disk_every}")
        if self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {self.chunk_bytes}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")


@dataclass(frozen=True)
class HeldStep:
    """One step in a node's area: the rank files there and their bytes.

    ``complete`` is False for a step directory without a manifest: a save in
    flight, or one interrupted (never loaded, deleted by the next prune).
    """

    step: int
    ranks: tuple[int, ...]
    nbytes: int
    complete: bool = True


class NodeArea:
    """One failure domain's directory of peer memory (see the module doc)."""

    def __init__(self, path: str | os.PathLike[str], domain: str) -> None:
        self.domain = domain
        root = Path(path) / f"node-{_UNSAFE.sub('_', domain)}"
        # Memory, not a disk: nothing to fsync, and tmpfs has no O_DIRECT.
        self.tier = LocalTier(root, name="peers", domain=domain, durable=False, direct_io=False)

    def step_path(self, run: str, step: int) -> Path:
        """The directory of ``step`` (whether or not it exists)."""
        return Path(self.tier.location(catalog.checkpoint_prefix(run, step)))

    def complete_steps(self, run: str) -> list[int]:
        """Steps whose manifest is here, ascending."""
        return catalog.committed_steps(self.tier, run)

    def held(self, run: str, *, partial: bool = False) -> list[HeldStep]:
        """The complete steps here, with which ranks' files and how many bytes.

        With ``partial``, also the step directories without a manifest
        (``complete=False``), in step order with the others.
        """
        complete = set(self.complete_steps(run))
        steps = catalog.step_dirs(self.tier, run) if partial else sorted(complete)
        return [self._held(run, step, step in complete) for step in steps]

    def _held(self, run: str, step: int, complete: bool) -> HeldStep:
        ranks, nbytes = [], 0
        # A prune or a save may change the directory while it is listed: what is
        # gone by the time it is looked at is simply not counted.
        try:
            entries = sorted(self.step_path(run, step).iterdir())
        except FileNotFoundError:
            entries = []
        for entry in entries:
            try:
                nbytes += entry.stat().st_size
            except FileNotFoundError:
                continue
            match = _RANK_FILE.fullmatch(entry.name)
            if match:
                ranks.append(int(match.group(1)))
        return HeldStep(step, tuple(ranks), nbytes, complete)

    def discard_file(self, run: str, step: int, name: str) -> None:
        """Remove one file of an uncommitted step (an earlier attempt's leftover)."""
        self.tier.delete(catalog.checkpoint_prefix(run, step) + name)

    def runs(self) -> list[str]:
        """Runs with anything in this area."""
        return catalog.list_runs(self.tier)

    def discard_step(self, run: str, step: int) -> None:
        """Delete ``step`` from this area (one that can never be loaded)."""
        shutil.rmtree(self.step_path(run, step), ignore_errors=True)

    def prune(self, run: str, keep: int) -> int:
        """Keep the newest ``keep`` complete steps; delete older ones and stale partial ones.

        A step directory without a manifest is deleted when a complete step is
        newer (its save failed); a newer one may be a save in flight. Returns the
        number of step directories deleted.
        """
        complete = self.complete_steps(run)
        kept = set(complete[-keep:])
        newest = complete[-1] if complete else -1
        deleted = 0
        for step in catalog.step_dirs(self.tier, run):
            if step in kept or (step not in complete and step > newest):
                continue
            self.discard_step(run, step)
            deleted += 1
        return deleted


def node_areas(path: str | os.PathLike[str]) -> list[NodeArea]:
    """The node areas under ``path`` (``node-*`` directories), by name; none if it is absent."""
    root = Path(path)
    if not root.is_dir():
        return []
    return [
        NodeArea(root, entry.name.removeprefix("node-"))
        for entry in sorted(root.iterdir())
        if entry.is_dir() and entry.name.startswith("node-")
    ]

"""Resuming from peer memory: the newest step complete across the nodes, fetched and loaded.

On every rank (one collective sequence)::

    gather   each rank's node inventory: complete steps and whose rank files they hold
    choose   the newest step for which every rank's file is held somewhere
             (:func:`choose`; the same answer on every rank)
    gather   that step's manifest from the lowest rank holding it
    copy     each rank whose node lacks its file receives it from a holder
             (peer_transfer), checked against the manifest's checksum
    commit   a node that lacked the manifest writes it (its lowest rank)
    load     every rank maps its file from its own node's area, copy-on-write,
             and checks every byte's checksum through that mapping before the
             state (views of it) is handed out (mapped_load)

A rank whose node kept its file (the survivors) reads it from there; nothing
crosses the network for it.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.committer import gather
from mouthguard.checkpoint.info import LoadedCheckpoint, Rejection
from mouthguard.checkpoint.loading import Loader
from mouthguard.checkpoint.peer_tier import PeerTier
from mouthguard.checkpoint.peer_transfer import Transfer
from mouthguard.checkpoint.reader import validated_manifest
from mouthguard.checkpoint.store import Store
from mouthguard.errors import CheckpointFallbackWarning, MouthguardError
from mouthguard.format.manifest import Manifest
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.key_material import Keyring

#: One node's inventory: step -> the ranks whose files its area holds (complete steps only).
Inventory = dict[int, list[int]]


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` found.

    Attributes:
        step: the newest step whose every rank file is held somewhere (None: none).
        sources: for each rank, the rank whose node holds its file (a rank of its
            own domain when there is one: a local read).
        lost: newer steps than ``step`` and the ranks none of whose copies is left.
    """

    step: int | None
    sources: dict[int, int] = field(default_factory=dict)
    lost: dict[int, list[int]] = field(default_factory=dict)


def choose(inventories: list[Inventory], domains: list[str]) -> Choice:
    """The newest step recoverable from peer memory (a pure function; see :class:`Choice`).

    Args:
        inventories: each rank's node inventory, indexed by rank.
        domains: each rank's failure domain, indexed by rank.
    """
    world = len(domains)
    steps = sorted({s for inventory in inventories for s in inventory}, reverse=True)
    lost: dict[int, list[int]] = {}
    for step in steps:
        sources: dict[int, int] = {}
        sending = dict.fromkeys(range(world), 0)
        missing = []
        for rank in range(world):
            holding = [q for q in range(world) if rank in inventories[q].get(step, ())]
            local = [q for q in holding if domains[q] == domains[rank]]
            if local:
                sources[rank] = local[0]
            elif holding:
                # Spread the sending over the holders' ranks: one rank sending every
                # lost file would make the resume as slow as its one link.
                sources[rank] = min(holding, key=lambda q: (sending[q], q))
                sending[sources[rank]] += 1
            else:
                missing.append(rank)
        if not missing:
            return Choice(step, sources, lost)
        lost[step] = missing
    return Choice(None, {}, lost)


def inventory(peers: PeerTier, run: str) -> Inventory:
    """This rank's node inventory (rank files of a larger world are not counted)."""
    world = peers.ranks.world_size
    return {held.step: [r for r in held.ranks if r < world] for held in peers.area.held(run)}


def survey(peers: PeerTier, run: str) -> Choice:
    """Every rank's inventory gathered, and :func:`choose` over it (a collective)."""
    mine: JsonValue = {str(s): list(r) for s, r in inventory(peers, run).items()}
    gathered = peers.ranks.all_gather(mine)
    inventories: list[Inventory] = []
    for value in gathered:
        assert isinstance(value, dict)
        inventories.append({int(s): [int(str(r)) for r in v] for s, v in value.items()})  # type: ignore[union-attr]
    return choose(inventories, peers.domains)


def gather_step(peers: PeerTier, run: str, choice: Choice, keys: Keyring | None) -> Manifest:
    """Put ``choice.step`` together in every node's area; its manifest (a collective).

    The manifest is parsed and validated once, here (signed with ``keys`` when
    given), and the load uses it as it is.

    Raises:
        ManifestError, SignatureError: the manifest is not valid.
        CorruptCheckpointError: a fetched file's bytes do not match the manifest.
        RankLostError: a peer died or did not answer within the timeout.
    """
    step = choice.step
    assert step is not None
    me = peers.ranks.rank
    # One copy of the manifest travels: from the lowest rank serving any file.
    sender = min(choice.sources.values())

    def manifest_text() -> JsonValue:
        if me != sender:
            return None
        return peers.area.tier.get(catalog.manifest_key(run, step)).decode()

    raw = str(gather(peers.ranks, manifest_text)[sender]).encode()
    manifest = validated_manifest(raw, run, step, keys)
    files = {f.rank: f for f in manifest.files}
    transfers = [
        Transfer(src, rank, files[rank].name, files[rank].size)
        for rank, src in sorted(choice.sources.items())
        if peers.domains[src] != peers.domains[rank]
    ]
    checksums = {f.name: f.checksum for f in manifest.files}
    gather(peers.ranks, lambda: peers.fetch(run, step, transfers, checksums))
    gather(peers.ranks, lambda: peers.commit_manifest(run, step, raw))
    return manifest


def resume_from_peers(
    peers: PeerTier, loader: Loader, newest_in_store: int | None, into: object
) -> LoadedCheckpoint | None:
    """``Checkpointer.load()`` from peer memory, or None to load from the store (a collective).

    Peer memory is used when its newest recoverable step is at least the
    store's newest committed one. A newer step some of whose rank files lost
    every copy, or a recoverable step that fails to load, gives a
    :class:`CheckpointFallbackWarning` naming it and what was missing. A step
    that lost every copy of a rank file can never be loaded: it is deleted from
    every node's area, so the resumed run can save that step again.
    """
    run = loader.run
    choice = survey(peers, run)
    if peers.is_leader:
        for lost in choice.lost:
            peers.area.discard_step(run, lost)
    step = choice.step
    fallback = f"step {step} in peer memory" if step is not None else "the store"
    if step is not None and newest_in_store is not None and newest_in_store > step:
        fallback = "the store"
    for lost, ranks in sorted(choice.lost.items(), reverse=True):
        _warn(
            f"checkpoint {run} step {lost} in peer memory lost every copy of rank(s) "
            f"{ranks}; falling back to {fallback}"
        )
    if step is None or fallback == "the store":
        return None
    try:
        manifest = gather_step(peers, run, choice, loader.keys)
        # The area is memory and its files are never rewritten in place: the state
        # is handed out as views of a private mapping, hashed once (mapped_load).
        local = dataclasses.replace(
            loader, store=Store([peers.area.tier]), mapped=True, known={step: manifest}
        )
        rejected: list[Rejection] = []
        return local.first_valid([step], None, into, rejected)
    except MouthguardError as exc:
        _warn(
            f"checkpoint {run} step {step} could not be loaded from peer memory ({exc}); "
            "falling back to the store"
        )
        return None


def _warn(message: str) -> None:
    warnings.warn(message, CheckpointFallbackWarning, stacklevel=4)

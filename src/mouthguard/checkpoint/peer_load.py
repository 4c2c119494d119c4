"""Resuming from peer memory: the newest step complete across the nodes, fetched and loaded.

On every rank (one collective sequence)::

    gather   each rank's node inventory: complete steps and whose rank files they hold
    choose   the newest step for which every rank's file is held somewhere
             (:func:`choose`; the same answer on every rank)
    gather   that step's manifest from the lowest rank holding it -- only when a
             file must cross nodes or a node lacks the manifest; otherwise each
             rank's load reads its own node's
    copy     each rank whose node lacks its file receives it from a holder
             (peer_transfer), checked against the manifest's checksum; a
             mismatch is this rank's failure, reported in the load's agreement
    load     every rank maps its file from its own node's area, copy-on-write,
             and checks every byte's checksum through that mapping -- except a
             file it verified earlier in this load: one it received, or (a
             survivor, while the copies were on the wire) its own file hashed
             in place -- before the state (views of it) is handed out
             (mapped_load); the ranks agree on the result
    commit   once every rank loaded, a node that lacked the manifest writes it
             (its lowest rank; no collective: the agreement said every file is there)

A rank whose node kept its file (the survivors) reads it from there; nothing
crosses the network for it.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.committer import gather
from mouthguard.checkpoint.info import LoadedCheckpoint, Rejection
from mouthguard.checkpoint.loading import Loader
from mouthguard.checkpoint.mapped_load import Receipt, hashed_receipt
from mouthguard.checkpoint.peer_tier import PeerTier
from mouthguard.checkpoint.peer_transfer import Transfer
from mouthguard.checkpoint.reader import validated_manifest
from mouthguard.checkpoint.store import Store
from mouthguard.errors import CheckpointFallbackWarning, CorruptCheckpointError, MouthguardError
from mouthguard.format.manifest import Manifest
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.key_material import Keyring

log = logging.getLogger(__name__)

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
        lacking: the ranks whose node's area does not hold ``step`` complete
            (no manifest there): the manifest must travel to them.
    """

    step: int | None
    sources: dict[int, int] = field(default_factory=dict)
    lost: dict[int, list[int]] = field(default_factory=dict)
    lacking: tuple[int, ...] = ()

    def transfers_needed(self, domains: list[str]) -> bool:
        """Whether some rank's file must come from another node."""
        return any(domains[src] != domains[rank] for rank, src in self.sources.items())


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
            lacking = tuple(q for q in range(world) if step not in inventories[q])
            return Choice(step, sources, lost, lacking)
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


@dataclass(frozen=True)
class Fetched:
    """What :func:`fetch_step` put in this rank's node area.

    Attributes:
        manifest: the step's manifest, parsed and validated (None: this rank's
            load reads its own node's).
        raw: its bytes, for a node that lacks it (None with ``manifest``).
        received: receipts of the files this rank verified in this load: those it
            received, and a survivor's own file hashed while the transfers ran.
        failure: why this rank's part cannot load ("" when it can).
    """

    manifest: Manifest | None
    raw: bytes | None = None
    received: frozenset[Receipt] = frozenset()
    failure: str = ""


def fetch_step(peers: PeerTier, run: str, choice: Choice, keys: Keyring | None) -> Fetched:
    """Put ``choice.step``'s rank files in every node's area (a collective).

    The manifest travels (one gather, from the lowest rank serving a file) only
    when a file must cross nodes or some node lacks it; it is then parsed and
    validated once, here (signed with ``keys`` when given), and the load uses it
    as it is. A received file whose checksum is wrong is this rank's failure
    (:attr:`Fetched.failure`), not an exception: the peers learn of it in the
    load's agreement instead of a collective of its own.

    Raises:
        ManifestError, SignatureError: the manifest is not valid (on every rank).
        RankLostError: a peer died or did not answer within the timeout.
    """
    step = choice.step
    assert step is not None
    if not choice.lacking and not choice.transfers_needed(peers.domains):
        return Fetched(None)
    me = peers.ranks.rank
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
    # A survivor hashes its own file while its node's transfers are on the wire
    # (xxhash and gloo's waits release the GIL), instead of after them in map_copy.
    kept = None if any(t.dst == me for t in transfers) else files.get(me)
    with ThreadPoolExecutor(1, thread_name_prefix="mouthguard-peer-hash") as pool:
        own = None
        if kept is not None:
            path = peers.area.tier.path_of(catalog.checkpoint_prefix(run, step) + kept.name)
            own = pool.submit(hashed_receipt, path, kept)
        try:
            received = peers.fetch(run, step, transfers, checksums)
        except CorruptCheckpointError as exc:
            return Fetched(manifest, raw, failure=str(exc))
    receipts = set(received)
    if own is not None and (receipt := own.result()) is not None:
        receipts.add(receipt)
    return Fetched(manifest, raw, frozenset(receipts))


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
        fetched = fetch_step(peers, run, choice, loader.keys)
        # The area is memory and its files are never rewritten in place: the state
        # is handed out as views of a private mapping, hashed once (mapped_load).
        local = dataclasses.replace(
            loader,
            store=Store([peers.area.tier]),
            mapped=True,
            known={} if fetched.manifest is None else {step: fetched.manifest},
            received=fetched.received,
            unloadable=fetched.failure,
        )
        rejected: list[Rejection] = []
        loaded = local.first_valid([step], None, into, rejected)
    except MouthguardError as exc:
        _warn(
            f"checkpoint {run} step {step} could not be loaded from peer memory ({exc}); "
            "falling back to the store"
        )
        return None
    if fetched.raw is not None and peers.ranks.rank in choice.lacking:
        _commit(peers, run, step, fetched.raw)
    return loaded


def _commit(peers: PeerTier, run: str, step: int, raw: bytes) -> None:
    """Make ``step`` complete in this node's area (its lowest rank writes the manifest).

    Every rank loaded and verified its file (the agreement), so the node's files
    are in place. A failure here costs only this node's copy of the step (the
    next failure cannot resume from it here), not the load: it is logged.
    """
    try:
        peers.commit_manifest(run, step, raw)
    except MouthguardError as exc:
        log.warning("peer memory: %s step %d not committed on this node: %s", run, step, exc)


def _warn(message: str) -> None:
    warnings.warn(message, CheckpointFallbackWarning, stacklevel=4)

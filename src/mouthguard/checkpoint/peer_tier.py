"""One rank's part in peer memory: saving a step there, and where its copies come from.

A save in peer memory, on every rank (one collective sequence; one rank fails, all raise)::

    write   this rank's file into its node's area (refused if the step is complete there)
    gather  every rank's file and tensor records
    copy    each file to its holders in other domains (peer_transfer), every
            received copy checked against its sender's checksum, then renamed in
    gather  every rank's "my copies are in place" (or its error)
    agree   the coordinator's manifest over every rank's records (signed as usual)
    commit  each node's lowest rank writes the manifest, create-only, into its area
    gather  every node committed; each node's lowest rank prunes to ``keep`` steps

A rank that dies anywhere before the last gather leaves no manifest on any
node (or, past the second gather, manifests only over copies that are all in
place): an interrupted step is never complete. The survivors raise
:class:`~mouthguard.errors.RankLostError` within the timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.committer import (
    SaveRequest,
    agree,
    build_manifest,
    gather,
    records_from_json,
    records_json,
)
from mouthguard.checkpoint.mapped_load import Receipt
from mouthguard.checkpoint.peer_memory import NodeArea, PeerMemory
from mouthguard.checkpoint.peer_placement import detect_domain, domains_from_map, holders
from mouthguard.checkpoint.peer_transfer import PeerLink, Transfer
from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.errors import CheckpointExistsError, CorruptCheckpointError, ObjectExistsError
from mouthguard.format.manifest import FileRecord, Manifest, TensorRecord
from mouthguard.tiers.base import PutMode, Tier

#: Writes this rank's file under a prefix of a tier; returns its manifest records.
AreaWriter = Callable[[Tier, str], tuple[FileRecord, list[TensorRecord]]]


class PeerTier:
    """Peer memory as one rank of ``ranks`` sees it (built at ``Checkpointer`` construction).

    Construction is a collective when there are several ranks (the domains are
    gathered unless given, and the transfer group is created).

    Raises:
        ValueError: the domains cannot hold ``replication_factor`` copies in
            distinct domains, or the explicit map misses a rank.
    """

    def __init__(self, config: PeerMemory, ranks: RankGroup) -> None:
        self.config = config
        self.ranks = ranks
        if config.domains is not None:
            domains = domains_from_map(config.domains, ranks.world_size)
        else:
            gathered = ranks.all_gather(detect_domain(ranks.rank))
            domains = [str(d) for d in gathered]
        self.domains = domains
        #: For every rank, the ranks holding its file (itself first).
        self.holders = holders(domains, config.replication_factor)
        self.area = NodeArea(config.path, domains[ranks.rank])
        #: The node's lowest rank writes its manifests and prunes its area.
        self.is_leader = domains.index(domains[ranks.rank]) == ranks.rank
        self.link = PeerLink(config.timeout) if ranks.world_size > 1 else None

    def save(self, request: SaveRequest, write_rank: AreaWriter) -> Manifest:
        """Save one step in peer memory (the module docstring's sequence).

        Raises:
            CheckpointExistsError: the step is complete in this node's area already.
            CorruptCheckpointError: a copy arrived with other bytes than were sent.
            RankLostError: a peer died or did not answer within the timeout.
            RankFailedError: another rank failed.
        """
        run, step = request.run, request.step
        prefix = catalog.checkpoint_prefix(run, step)

        def write() -> tuple[FileRecord, list[TensorRecord]]:
            if self.area.tier.exists(catalog.manifest_key(run, step)):
                raise CheckpointExistsError(
                    f"checkpoint {run} step {step} is complete in peer memory already"
                )
            # An earlier attempt at this step may have left this rank's file.
            self.area.discard_file(run, step, catalog.rank_file_name(self.ranks.rank))
            return write_rank(self.area.tier, prefix)

        gathered = gather(self.ranks, lambda: records_json(write(), request.skeleton))
        files = [records_from_json(value)[0] for value in gathered]
        transfers = [
            Transfer(rank, holder, record.name, record.size)
            for rank, record in enumerate(files)
            for holder in self.holders[rank][1:]
        ]
        gather(self.ranks, lambda: self._copy(run, step, transfers, files))
        world = self.ranks.world_size

        def manifest_text() -> str:
            return build_manifest(request, gathered, world).to_bytes(request.signing).decode()

        raw = str(agree(self.ranks, manifest_text)).encode()
        gather(self.ranks, lambda: self.commit_manifest(run, step, raw))
        if self.is_leader:
            self.area.prune(run, self.config.keep)
        return Manifest.from_bytes(raw)

    def _copy(
        self, run: str, step: int, transfers: list[Transfer], files: list[FileRecord]
    ) -> None:
        """Take part in ``transfers``; keep each copy received only if its checksum matches."""
        self.fetch(run, step, transfers, {r.name: r.checksum for r in files})

    def fetch(
        self, run: str, step: int, transfers: list[Transfer], checksums: dict[str, str]
    ) -> list[Receipt]:
        """Run ``transfers`` of ``step``'s files; keep what this rank receives once verified.

        Returns a :class:`~mouthguard.checkpoint.mapped_load.Receipt` of each file
        this rank received, taken right after it was renamed in: the caller's
        load of it need not hash it again.

        Raises:
            CorruptCheckpointError: a received file's checksum is not ``checksums[name]``.
            RankLostError: a peer died or did not answer within the timeout.
        """
        if self.link is None or not transfers:
            return []
        directory = self.area.step_path(run, step)
        directory.mkdir(parents=True, exist_ok=True)

        def part(t: Transfer) -> Path:
            return directory / f"{t.name}.part"

        digests = self.link.exchange(
            transfers, lambda t: directory / t.name, part, self.config.chunk_bytes
        )
        receipts: list[Receipt] = []
        for t, digest in digests.items():
            if digest != checksums[t.name]:
                part(t).unlink(missing_ok=True)
                raise CorruptCheckpointError(
                    f"peer memory: the copy of {run} step {step} {t.name} from rank {t.src} "
                    f"arrived as {digest}, sent as {checksums[t.name]}"
                )
            part(t).replace(directory / t.name)
            receipts.append(
                Receipt.of(self.area.tier.path_of(catalog.checkpoint_prefix(run, step) + t.name))
            )
        return receipts

    def commit_manifest(self, run: str, step: int, raw: bytes) -> None:
        """The node's lowest rank writes the manifest, create-only (the step's commit here).

        A manifest already there with the same bytes is fine (a recovery re-commits).
        """
        if not self.is_leader:
            return
        key = catalog.manifest_key(run, step)
        try:
            self.area.tier.put(key, raw, mode=PutMode.CREATE)
        except ObjectExistsError:
            if self.area.tier.get(key) != raw:
                raise CheckpointExistsError(
                    f"checkpoint {run} step {step} is complete in peer memory with another manifest"
                ) from None

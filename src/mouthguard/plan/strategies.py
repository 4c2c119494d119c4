"""Storage strategies the simulator compares, as data.

A *strategy* is how a storage platform treats checkpoints -- importance-aware
(mouthguard), access-temperature tiering, one flat tier -- not mouthguard's own
importance policy (:mod:`mouthguard.policy`), which the model does not run.

A strategy says only what changes the cost of a failure: where the checkpoint a
recovery needs is sitting (fast or slow tier, at what read bandwidth) and
whether reading it from the slow tier may wait on an erasure-code rebuild. Corruption
is the scenario's and costs every strategy the same way: a resume reads the
corrupt checkpoint, fails to load it and falls back one checkpoint (see
"verification" below for why mouthguard is no exception). Everything else
(interval, write time, failure process) is the scenario's and is the same for
every strategy, so differences in the results are the strategy's doing.

Units: bandwidths in bytes per second (decimal, 1 GB/s = 1e9 B/s), times in
seconds, probabilities in ``[0, 1]``.

Default figures and where they come from (published vendor and practitioner
figures, quoted; "assumption" marks a figure no source gives):

* fast tier read, 100 GB/s aggregate: a parallel filesystem of the BeeGFS or
  Lustre class (100 GB/s; 40 OSTs x 4 GB/s = 160 GB/s), the "100 GB/s of
  checkpoints, datasets and state" a foundation-model pipeline moves. The
  840 GB Llama 3 70B checkpoint reads back in about 8 s.
* slow tier read, 10 GB/s aggregate: a managed NFS or object store reached over
  the network (EFS "10+ GB/s"; S3 first bytes 5-50 ms). 840 GB takes ~84 s,
  a 180 TB 15T-MoE checkpoint five hours: "minutes to potentially hours".
* demotion after 5 minutes: access-temperature tiering flags write-once data
  as cold "within minutes" and evicts it first.
* erasure-code rebuild: a demoted checkpoint "sitting on an HDD tier behind an
  erasure coding rebuild". How often a recovery meets a rebuild is not given
  (assumption: one recovery in two, since the hardware fault that killed the
  job often took drives with it); the wait is exponential with a 30-minute
  mean (assumption), so a rebuild costs about one more 30-minute checkpoint
  interval -- the often-quoted "$300K failure becomes a $600K failure" -- with a
  tail of hours.
* verification: mouthguard does not read the primary copy back when it is
  written. Its checksums are computed from the bytes handed to the tier, and
  only the replicas are read back as they are copied. The background
  replicator reads the primary back shortly after the save (when a second tier
  exists), but a primary found corrupt then cannot be repaired -- the replicas
  would be copied from it -- so it stays, reported as damaged, and a resume
  still reads it, fails and falls back one checkpoint, as on the other
  platforms. Damage that strikes one copy *after* a verified replica exists
  would be served from the replica instead; the model has no such damage (see
  docs/economics.md, "What the model leaves out").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mouthguard.plan.peers import PeerModel

__all__ = [
    "DEFAULT_STRATEGIES",
    "FAST_READ_BYTES_PER_S",
    "FLAT",
    "IMPORTANCE",
    "PEERS",
    "REBUILD_MEAN_SECONDS",
    "REBUILD_PROBABILITY",
    "SLOW_READ_BYTES_PER_S",
    "STRATEGIES",
    "TEMPERATURE",
    "StorageStrategy",
    "get_strategy",
    "with_peers",
    "with_rebuild",
]

FAST_READ_BYTES_PER_S = 100e9
SLOW_READ_BYTES_PER_S = 10e9
DEMOTE_AFTER_SECONDS = 5 * 60.0
REBUILD_PROBABILITY = 0.5
REBUILD_MEAN_SECONDS = 30 * 60.0


@dataclass(frozen=True)
class StorageStrategy:
    """How a storage platform treats checkpoints, as far as recovery cost goes.

    Attributes:
        name: short identifier (the key of ``--json`` output).
        summary: one line for tables and legends.
        fast_read_bytes_per_s: aggregate read bandwidth from the tier
            checkpoints are written to, bytes/s.
        slow_read_bytes_per_s: aggregate read bandwidth once demoted, bytes/s.
        demote_after_seconds: age (since the checkpoint landed) at which it is
            moved to the slow tier; ``None`` = the checkpoints a recovery reads
            stay on the fast tier.
        rebuild_probability: chance that a recovery reading from the slow tier
            first waits for an erasure-code rebuild.
        rebuild_mean_seconds: mean of that wait (exponentially distributed), s.
        peers: checkpoints in peers' memory (:mod:`~mouthguard.plan.peers`):
            saves land there at network speed, a recovery reads from the peers
            unless the failure took every copy of some rank, then from the
            newest durable copy on the fast tier. ``None``: no peer memory.
    """

    name: str
    summary: str
    fast_read_bytes_per_s: float = FAST_READ_BYTES_PER_S
    slow_read_bytes_per_s: float = SLOW_READ_BYTES_PER_S
    demote_after_seconds: float | None = None
    rebuild_probability: float = 0.0
    rebuild_mean_seconds: float = 0.0
    peers: PeerModel | None = None

    def __post_init__(self) -> None:
        for label, value in (
            ("fast_read_bytes_per_s", self.fast_read_bytes_per_s),
            ("slow_read_bytes_per_s", self.slow_read_bytes_per_s),
        ):
            if not value > 0 or math.isinf(value):
                raise ValueError(f"{label} must be a finite number > 0, got {value}")
        if self.demote_after_seconds is not None and not 0 <= self.demote_after_seconds < math.inf:
            raise ValueError(f"demote_after_seconds must be >= 0, got {self.demote_after_seconds}")
        if not 0.0 <= self.rebuild_probability <= 1.0:
            raise ValueError(
                f"rebuild_probability must be in [0, 1], got {self.rebuild_probability}"
            )
        if not 0.0 <= self.rebuild_mean_seconds < math.inf:
            raise ValueError(f"rebuild_mean_seconds must be >= 0, got {self.rebuild_mean_seconds}")

    def read_seconds(self, nbytes: float, *, demoted: bool) -> float:
        """Seconds to read ``nbytes`` back from the tier the checkpoint sits on."""
        rate = self.slow_read_bytes_per_s if demoted else self.fast_read_bytes_per_s
        return nbytes / rate


# In this model importance behaves as one fast tier would: what it adds over a
# flat all-fast store (older checkpoints moved to cheaper tiers, replicas in
# another failure domain) is capacity and protection the model does not price.
IMPORTANCE = StorageStrategy(
    "importance",
    "mouthguard: newest valid checkpoints pinned on the fast tier, replicated",
)
TEMPERATURE = StorageStrategy(
    "temperature",
    "access-temperature tiering: demoted within minutes, erasure-coded, unverified",
    demote_after_seconds=DEMOTE_AFTER_SECONDS,
    rebuild_probability=REBUILD_PROBABILITY,
    rebuild_mean_seconds=REBUILD_MEAN_SECONDS,
)
# One tier that neither punishes nor elevates write-once data: the fast tier's
# bandwidth for every read, but nobody checks a checkpoint until it is loaded.
FLAT = StorageStrategy("flat", "one tier, no tiering, no verification")
# importance with mouthguard.PeerMemory: every save lands in peers' memory, every
# k-th also on the fast tier, as importance keeps it.
PEERS = StorageStrategy(
    "peers",
    "mouthguard with peer memory: saves in other domains' RAM, every k-th also durable",
    peers=PeerModel(),
)

#: The strategies ``mouthguard simulate`` compares, in display order.
DEFAULT_STRATEGIES: tuple[StorageStrategy, ...] = (IMPORTANCE, TEMPERATURE, FLAT, PEERS)

#: Strategy name -> strategy.
STRATEGIES: Mapping[str, StorageStrategy] = MappingProxyType(
    {s.name: s for s in DEFAULT_STRATEGIES}
)


def get_strategy(name: str) -> StorageStrategy:
    """The built-in strategy called ``name``; :class:`ValueError` naming the known ones if none."""
    try:
        return STRATEGIES[name]
    except KeyError:
        known = ", ".join(STRATEGIES)
        raise ValueError(f"unknown strategy {name!r}; known: {known}") from None


def with_rebuild(
    strategies: Iterable[StorageStrategy],
    *,
    probability: float | None = None,
    mean_seconds: float | None = None,
) -> list[StorageStrategy]:
    """``strategies`` with the erasure-code rebuild figures changed where given.

    Only a strategy that demotes ever reads from the erasure-coded slow tier, so
    the others are returned unchanged.
    """
    return [_with_rebuild(s, probability, mean_seconds) for s in strategies]


def with_peers(strategies: Iterable[StorageStrategy], **changes: Any) -> list[StorageStrategy]:
    """``strategies`` with the given :class:`PeerModel` fields changed in those that have one.

    Raises :class:`ValueError` (from :class:`PeerModel`) for a value out of range
    and :class:`TypeError` for a field it does not have.
    """
    return [_with_peers(s, changes) for s in strategies]


def _with_peers(s: StorageStrategy, changes: dict[str, Any]) -> StorageStrategy:
    if s.peers is None or not changes:
        return s
    return dataclasses.replace(s, peers=dataclasses.replace(s.peers, **changes))


def _with_rebuild(
    s: StorageStrategy, probability: float | None, mean_seconds: float | None
) -> StorageStrategy:
    if s.demote_after_seconds is None:
        return s
    return dataclasses.replace(
        s,
        rebuild_probability=s.rebuild_probability if probability is None else probability,
        rebuild_mean_seconds=s.rebuild_mean_seconds if mean_seconds is None else mean_seconds,
    )

"""Checkpoints in peers' memory, as the planner models them: placement, loss, recovery.

mouthguard's peer memory (``mouthguard.PeerMemory``, docs/peer-memory.md) keeps
each rank's file of a save in its node's memory and sends ``R - 1`` copies to
the ranks of the next ``R - 1`` failure domains on a ring: with the domains
ordered ``D_0 .. D_{n-1}``, a rank of ``D_d`` has its copies in
``D_d, D_{d+1}, .., D_{d+R-1}`` (indices mod ``n``). So the sets of domains
holding some rank's copies are exactly the ``n`` cyclic windows of ``R``
consecutive domains.

**Loss.** A failure that takes ``f`` domains at once, any ``f`` of the ``n``
equally likely, loses some rank's every copy if and only if it takes a whole
window, that is ``R`` cyclically consecutive domains. Counting the ``f``-subsets
of an ``n``-cycle with no ``R`` consecutive members (a standard result; proved
by cutting the cycle into the ``n - f`` gaps between unfailed domains, each
holding fewer than ``R`` failed ones)::

    N(n, f, R) = n / (n - f) * sum_{j >= 0} (-1)^j C(n - f, j) C(n - jR - 1, n - f - 1)

for ``f < n``, so ``P(loss) = 1 - N(n, f, R) / C(n, f)``; ``P = 0`` when
``f < R`` and ``P = 1`` when ``f = n``. For ``R = 2`` and ``f = 2`` this is
``n / C(n, 2) = 2 / (n - 1)``: of the ``C(n, 2)`` pairs of domains, the ``n``
neighbouring pairs on the ring lose a rank. The tests check the formula against
enumerating every subset.

**Recovery.** Without a loss, each replacement domain receives its ranks' files
(``checkpoint / n`` bytes) from the peers holding them over its link, in
parallel; surviving ranks read their own memory (not charged: it is memory
speed next to the network). With a loss, the run resumes from the newest
durable copy (every ``durable_every``-th save also goes to the durable tier,
written in the background from host memory, landing ``W`` after its save).

**Saving.** A save lands in peer memory once each domain has sent its
``R - 1`` copies of ``checkpoint / n`` bytes over its link. Memory-speed
copies inside a node are not charged.

Pure arithmetic: seconds, bytes, bytes per second, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_DURABLE_EVERY",
    "DEFAULT_GPUS_PER_DOMAIN",
    "DEFAULT_LINK_BYTES_PER_S",
    "PeerModel",
    "all_copies_lost_probability",
    "expected_lost_seconds_per_failure_peers",
    "optimal_interval_peers",
]

#: One node of 8 GPUs is one failure domain (the launcher's node rank).
DEFAULT_GPUS_PER_DOMAIN = 8
#: One 200 Gb/s link per node (an assumption: the model's figure for a node's NIC).
DEFAULT_LINK_BYTES_PER_S = 25e9
#: Every 10th save also goes to the durable tier (an assumption; ``disk_every=10``).
DEFAULT_DURABLE_EVERY = 10


def all_copies_lost_probability(domains: int, replication: int, failed: int) -> float:
    """P(a failure of ``failed`` random domains takes every copy of some rank). See the module.

    Raises :class:`ValueError` unless ``1 <= replication <= domains`` and
    ``0 <= failed <= domains`` (placement refuses more copies than domains).
    """
    n, r, f = domains, replication, failed
    if not 1 <= r <= n:
        raise ValueError(f"replication must be in 1..{n} (the domains), got {r}")
    if not 0 <= f <= n:
        raise ValueError(f"failed domains must be in 0..{n}, got {f}")
    if f < r:
        return 0.0
    if f == n:
        return 1.0
    safe: int = sum(
        (-1) ** j * math.comb(n - f, j) * math.comb(n - j * r - 1, n - f - 1)
        for j in range(f // r + 1)
        if n - j * r - 1 >= n - f - 1
    )
    # n * safe is divisible by n - f (it counts subsets); exact integers to the end.
    return 1.0 - (n * safe // (n - f)) / math.comb(n, f)


@dataclass(frozen=True)
class PeerModel:
    """How a peer-memory strategy saves and recovers, given the job's GPUs.

    Attributes:
        replication: copies of each rank's file, ``R`` (its own included).
        gpus_per_domain: GPUs per failure domain (a node).
        failed_domains: domains one failure takes (1: a node; the domain count
            or more: the whole job, every copy gone).
        durable_every: every this many saves also goes to the durable tier
            (0: never; the run's start is always recoverable).
        link_bytes_per_s: one domain's network bandwidth, each way.
    """

    replication: int = 2
    gpus_per_domain: int = DEFAULT_GPUS_PER_DOMAIN
    failed_domains: int = 1
    durable_every: int = DEFAULT_DURABLE_EVERY
    link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S

    def __post_init__(self) -> None:
        for name, least in (
            ("replication", 1),
            ("gpus_per_domain", 1),
            ("failed_domains", 1),
            ("durable_every", 0),
        ):
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
            if not ok:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not self.link_bytes_per_s > 0 or math.isinf(self.link_bytes_per_s):
            raise ValueError(
                f"link_bytes_per_s must be a finite number > 0: {self.link_bytes_per_s}"
            )

    def domains(self, gpus: int) -> int:
        """Failure domains of a job of ``gpus`` GPUs (at least one)."""
        return max(1, gpus // self.gpus_per_domain)

    def loss_probability(self, gpus: int) -> float:
        """P(one failure loses every copy of some rank); ValueError if ``R`` > domains."""
        n = self.domains(gpus)
        return all_copies_lost_probability(n, self.replication, min(self.failed_domains, n))

    def read_seconds(self, checkpoint_bytes: float, gpus: int) -> float:
        """Seconds for a replacement domain to receive its ranks' files from their holders."""
        return checkpoint_bytes / self.domains(gpus) / self.link_bytes_per_s

    def write_seconds(self, checkpoint_bytes: float, gpus: int) -> float:
        """Seconds for a save to land in peer memory: ``R - 1`` copies out over each link."""
        return (self.replication - 1) * self.read_seconds(checkpoint_bytes, gpus)


def expected_lost_seconds_per_failure_peers(  # noqa: PLR0917 - the formula's terms
    cycle_seconds: float,
    peer_land_seconds: float,
    peer_read_seconds: float,
    loss_probability: float,
    durable_every: int,
    durable_land_seconds: float,
    durable_read_seconds: float,
    restart_seconds: float = 0.0,
) -> float:
    """Expected wall seconds one failure costs with peer memory, first order.

    With ``c`` the cycle (interval plus stall), ``P`` the loss probability and
    ``k`` the durable period in saves::

        (1 - P) * (c/2 + L_p + R + r_p) + P * (k c/2 + W + R + r_d)

    where ``L_p`` is when a save lands in peer memory after its stall (0 for a
    sync save), ``r_p`` the read from peers, ``W`` when a durable copy lands
    after its save and ``r_d`` the read from the durable tier. With ``k = 0``
    the loss term is undefined (the run would rewind to its start): only
    ``P = 0`` is accepted then.
    """
    if durable_every == 0 and loss_probability > 0:
        raise ValueError("with no durable copies a loss rewinds to the run's start: no formula")
    peer = cycle_seconds / 2 + peer_land_seconds + restart_seconds + peer_read_seconds
    durable = (
        durable_every * cycle_seconds / 2
        + durable_land_seconds
        + restart_seconds
        + durable_read_seconds
    )
    return (1 - loss_probability) * peer + loss_probability * durable


def optimal_interval_peers(
    stall_seconds: float, mtbf_seconds: float, loss_probability: float, durable_every: int
) -> float:
    """Young's interval with peer memory: ``sqrt(2 S M / (1 - P + P k))``.

    The waste per second is ``S/T`` (stalls) plus, per failure, the rewound
    ``(1 - P) T/2 + P k T/2``; minimising ``S/T + T (1 - P + P k) / (2M)`` gives
    it. With ``P = 0`` it is Young's ``sqrt(2SM)`` for the peer save's stall.
    """
    if durable_every == 0 and loss_probability > 0:
        raise ValueError("with no durable copies a loss rewinds to the run's start: no formula")
    weight = 1 - loss_probability + loss_probability * durable_every
    if weight <= 0:
        raise ValueError("no failure rewinds anything: the interval is unbounded")
    return math.sqrt(2 * stall_seconds * mtbf_seconds / weight)

"""Where each rank's copies live in peer memory: a pure function of the failure domains.

The rule (a ring over domains, like the "replication jump" of NVIDIA's
resiliency extension, with a jump of one domain)::

    domains, in the order of their lowest rank:   D_0, D_1, ..., D_{n-1}
    members of a domain, ascending by rank:       m(D)
    rank r, the i-th member of domain D_d:
        copy 0 (its own)      r itself, in D_d
        copy k (1 <= k < R)   the (i mod |m(D')|)-th member of D' = D_{(d+k) mod n}

So the R holders of a rank's file are in R distinct domains (k < R <= n), and
ranks spread their copies over the next domain's members (a rank whose domain
has more members than the next one shares a holder with another rank). Losing
one domain never loses every copy of anything when R >= 2; losing R domains
that are consecutive on the ring can.

:func:`detect_domain` reads the launcher's node of this process: torchrun's
``GROUP_RANK`` (the node rank of the rendezvous), else ``RANK //
LOCAL_WORLD_SIZE``, else the host name.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence


def holders(domains: Sequence[str], replication_factor: int) -> list[list[int]]:
    """For every rank, the ranks holding its file: itself first, then its peers.

    Args:
        domains: the failure domain of each rank, indexed by rank.
        replication_factor: copies of each rank's file, its own included (>= 1).

    Raises:
        ValueError: ``replication_factor`` < 1, or more copies than distinct domains.
    """
    if replication_factor < 1:
        raise ValueError(f"replication_factor must be >= 1, got {replication_factor}")
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for rank, domain in enumerate(domains):
        if domain not in members:
            order.append(domain)
            members[domain] = []
        members[domain].append(rank)
    if replication_factor > len(order):
        raise ValueError(
            f"replication_factor {replication_factor} needs as many failure domains, "
            f"but the {len(domains)} ranks are in {len(order)}: {order}"
        )
    index = {domain: d for d, domain in enumerate(order)}
    result = []
    for rank, domain in enumerate(domains):
        position = members[domain].index(rank)
        chosen = [rank]
        for k in range(1, replication_factor):
            other = members[order[(index[domain] + k) % len(order)]]
            chosen.append(other[position % len(other)])
        result.append(chosen)
    return result


def detect_domain(rank: int, environ: Mapping[str, str] | None = None) -> str:
    """This process's failure domain as the launcher tells it (see the module doc)."""
    env = os.environ if environ is None else environ
    if env.get("GROUP_RANK", "").isdigit():
        return f"node{int(env['GROUP_RANK'])}"
    local = env.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 0:
        return f"node{rank // int(local)}"
    return socket.gethostname()


def domains_from_map(mapping: Mapping[int, object], world_size: int) -> list[str]:
    """Each rank's domain from an explicit ``{rank: domain}`` map covering every rank.

    Raises:
        ValueError: a rank of ``range(world_size)`` is missing from the map.
    """
    missing = [r for r in range(world_size) if r not in mapping]
    if missing:
        raise ValueError(f"domains map has no domain for rank(s) {missing}")
    return [str(mapping[r]) for r in range(world_size)]

"""The read path of :class:`~mouthguard.kvcache.store.KVStore`: a prefix's blocks, in order.

The leading run of memory hits is looked up under one hold of the placement's lock
and copied outside it (a payload's bytes are never written after creation); each
block after it is read from wherever it is now (disk, remote) and, with
``promote``, brought into memory. The first block that cannot be read ends the
prefix. What ``get`` promises its caller (copies, views, ``out`` buffers) is
written on :meth:`KVStore.get <mouthguard.kvcache.store.KVStore.get>`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mouthguard.kvcache.blocks import Block, decode, rebuild
from mouthguard.kvcache.placement import Placement


def read_prefix(
    placement: Placement,
    keys: list[bytes],
    *,
    out: Sequence[Block] | None,
    device: Any,
    promote: bool,
    view: bool,
) -> list[Block]:
    """The blocks of ``keys``' longest readable prefix (see :meth:`KVStore.get`)."""
    started = time.perf_counter()
    hot = placement.memory_run(keys)
    lookup = (time.perf_counter() - started) / max(1, len(hot))
    result: list[Block] = []
    times: list[float] = []
    plain = out is None and device is None
    clock = time.perf_counter
    for index, payload in enumerate(hot):
        began = clock()
        if plain:  # the common case, inlined: one copy, rebuilt as the caller's type
            result.append(rebuild(payload.data if view else payload.data.copy(), payload.desc))
        elif out is not None and index < len(out):  # straight into the caller's buffer
            result.append(decode(payload.data, payload.desc, out=out[index]))
        else:
            result.append(decode(payload.data.copy(), payload.desc, device=device))
        times.append(lookup + clock() - began)
    if hot:
        placement.record_memory_hits(times, hot[0].nbytes)
    for index in range(len(hot), len(keys)):
        found = _read_lower(
            placement,
            keys[index],
            index,
            out=out,
            device=device,
            promote=promote,
            view=view,
            result=result,
        )
        if not found:
            break
    return result


def _read_lower(
    placement: Placement,
    key: bytes,
    index: int,
    *,
    out: Sequence[Block] | None,
    device: Any,
    promote: bool,
    view: bool,
    result: list[Block],
) -> bool:
    """Read one block from wherever it is now into ``result``; False on a miss."""
    started = time.perf_counter()
    found = placement.read(key)
    if found is None:
        return False
    target = out[index] if out is not None and index < len(out) else None
    data = found.data
    if found.shared:
        if target is not None:
            result.append(decode(data, found.desc, out=target))
        else:
            data = data if view else data.copy()
            result.append(decode(data, found.desc, device=device))
        placement.record_memory_hits([time.perf_counter() - started], data.nbytes)
        return True
    if promote:
        # The memory copy must not share bytes with what the caller may write.
        # (a view's caller only reads, so the two may share them)
        mine = data if target is not None or view else data.copy()
        with placement.lock:
            placement.promote(key, mine, found)
    result.append(decode(data, found.desc, out=target, device=device))
    return True

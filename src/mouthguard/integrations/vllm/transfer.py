"""What the connector's scheduler side hands its workers, and the page copy both sides use.

Imports vLLM (``MouthguardMetadata`` is a ``KVConnectorMetadata``); loaded with
:mod:`mouthguard.integrations.vllm.connector`. ``Match`` and ``Tracked`` are the
scheduler's own records of a request, kept here beside the ``Transfer`` they carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

if TYPE_CHECKING:
    from vllm.v1.request import Request


@dataclass
class Transfer:
    """One request's load or save in one step.

    Attributes:
        req_id: the request.
        tokens: the request's tokens up to the end of the last block concerned.
        first: index of the first block concerned (blocks before it are not moved).
        block_ids: the engine's pages of blocks ``first, first + 1, ...``.
    """

    req_id: str
    tokens: list[int]
    first: int
    block_ids: list[int]


@dataclass
class MouthguardMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vLLM is untyped
    """What the scheduler tells the workers for one step."""

    loads: list[Transfer] = field(default_factory=list)  # before this step's forward
    async_loads: list[Transfer] = field(default_factory=list)  # on the worker's thread
    saves: list[Transfer] = field(default_factory=list)


def copy_page(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target.copy_(source)`` for one page, as one memcpy on this thread when on the host.

    A page is a few hundred KiB, above torch's grain for splitting a copy over its
    thread pool, and on a CPU engine those threads are the forward's: each small
    copy then waits for busy threads (a prefix hit's 15 x 8 pages took ~1 s that
    way on a loaded 2-core machine, ~50 ms as plain memcpys). numpy copies on the
    calling thread. Other devices, and pages numpy cannot view, take torch's copy.
    """
    host = target.device.type == "cpu" and source.device.type == "cpu"
    if not host or target.dtype != source.dtype or target.shape != source.shape:
        target.copy_(source)
        return
    if target.dim() == 0 or target.stride(-1) != 1 or source.stride(-1) != 1:
        target.copy_(source)
        return
    np.copyto(target.view(torch.uint8).numpy(), source.view(torch.uint8).numpy())


class Match(NamedTuple):
    """What ``get_num_new_matched_tokens`` found, for ``update_state_after_alloc``."""

    hit: int  # tokens to load (whole blocks, short of the prompt's last token)
    stored_blocks: int  # leading blocks the stores hold (may be one more than loaded)
    asynchronous: bool  # offered as an async load


@dataclass
class Tracked:
    """The scheduler's record of one live request."""

    request: Request
    stored_blocks: int = 0  # leading blocks the store holds (none of these is saved again)
    load: Transfer | None = None
    load_async: bool = False  # the load runs while the request waits (WAITING_FOR_REMOTE_KVS)
    failed_pages: set[int] = field(default_factory=set)  # of ``load``, reported so far
    pinned: list[int] | None = None
    loaded_tokens: int = 0
    failed_tokens: int = 0
    async_loads: int = 0  # loads that ran on the worker's thread while the request waited

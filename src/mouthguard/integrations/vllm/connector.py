"""``MouthguardConnector``: vLLM's v1 KV connector over :class:`~mouthguard.kvcache.KVStore`.

Imports vLLM; reach it through :mod:`mouthguard.integrations.vllm`, which loads this
module only when the class is asked for. One mouthguard block is one vLLM block
(``block_tokens`` is the engine's block size) with every layer's K and V:
``[layers, *per-layer block shape]``, the per-layer shape being the engine's
standardized ``[heads, tokens, content]`` page. The namespace names the model, the
KV dtype, that layout and the tensor-parallel rank, so a block is only ever found
by an engine that would have computed the same bytes.

Call order, per engine step (vLLM's contract, and what each call does here):

scheduler process
    ``get_num_new_matched_tokens`` asks every rank's store how much of the prompt it
    holds (``longest_prefix``, less the last token, which the engine must compute)
    and offers the part beyond the engine's own prefix cache, synchronously
    (``False``: the load happens inside the next forward) or, with ``async_load``,
    asynchronously (``True``: vLLM parks the request in ``WAITING_FOR_REMOTE_KVS``
    until the worker reports it loaded). ``update_state_after_alloc``
    pins those blocks (no prefetch: the load reads them at once, and a prefetch beside
    it read each disk block twice) and plans the load into the pages just allocated.
    ``build_connector_meta`` hands the step's loads, and the saves of every block
    that this step completes and the store lacks, to the workers.
    ``update_connector_output`` learns which loads failed; ``request_finished``
    unpins and reports the request's counts in ``kv_transfer_params["mouthguard"]``
    (a sync load of a request that stops in its load's step is counted there, since
    vLLM finishes that request before it hands the connector the step's output).
worker process (one per rank)
    ``register_kv_caches`` opens the rank's store and the socket the scheduler asks.
    ``start_load_kv`` reads each planned prefix with ``get(view=True)`` and copies
    each block's layers straight into their pages (one copy per byte); a block the
    store cannot return (checksum failure, evicted or vanished since the lookup) is
    reported by ``get_block_ids_with_load_errors``, and vLLM recomputes from there
    (``kv_load_failure_policy="recompute"``; with vLLM's default ``"fail"`` the
    request fails instead) -- a wrong block is never served.
    An async load goes to one background thread (:mod:`.loading`, at most
    ``MAX_ASYNC_LOADS`` in flight, one per request); ``get_finished`` reports the
    request once its pages are filled, with its failed pages in the same step.
    ``save_kv_layer`` copies each layer's finished pages as the forward pass produces
    them; ``wait_for_save`` hands the blocks to ``put(wait=False)``, which copies them
    into the store's RAM and returns: the disk write happens on the store's own thread.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.request import RequestStatus

from mouthguard.errors import KVCacheError
from mouthguard.integrations.vllm.channel import LookupClient, LookupServer, socket_path
from mouthguard.integrations.vllm.loading import MAX_ASYNC_LOADS, BackgroundLoads
from mouthguard.integrations.vllm.options import open_remote, parse_options, rank_disk_dir
from mouthguard.integrations.vllm.transfer import (
    Match,
    MouthguardMetadata,
    Tracked,
    Transfer,
    copy_page,
)
from mouthguard.kvcache import KVNamespace, KVStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

# ``Transfer`` and ``MouthguardMetadata`` live in .transfer; scripts import them from here
__all__ = ["MouthguardConnector", "MouthguardMetadata", "Transfer"]


class MouthguardConnector(KVConnectorBase_V1):  # type: ignore[misc]  # vLLM is untyped
    """vLLM v1 KV connector backed by a :class:`~mouthguard.kvcache.KVStore` per rank.

    Select it with ``KVTransferConfig(kv_connector="MouthguardConnector",
    kv_connector_module_path="mouthguard.integrations.vllm", kv_role="kv_both",
    kv_load_failure_policy="recompute", kv_connector_extra_config={...})``; the extra
    config takes KVStore's parameter names (see
    :mod:`mouthguard.integrations.vllm.options`).
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = self._kv_transfer_config
        self._options = parse_options(transfer.kv_connector_extra_config)
        self._block = int(vllm_config.cache_config.block_size)
        wanted = self._options.store.get("block_tokens", self._block)
        if wanted != self._block:
            raise KVCacheError(
                f"block_tokens {wanted} differs from the engine's block size {self._block}: "
                "a mouthguard block is one vLLM block (leave block_tokens out)"
            )
        self._tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self._engine_id = str(transfer.engine_id)
        model = vllm_config.model_config
        revision = getattr(model, "revision", None)
        self._model_id = self._options.model_id or (
            f"{model.model}@{revision}" if revision else str(model.model)
        )
        if role == KVConnectorRole.SCHEDULER:
            if transfer.kv_load_failure_policy != "recompute":
                log.warning(
                    "mouthguard: kv_load_failure_policy is %r; a block that fails its "
                    "checksum then fails its request instead of being recomputed",
                    transfer.kv_load_failure_policy,
                )
            paths = [socket_path(self._engine_id, rank) for rank in range(self._tp_size)]
            self._client = LookupClient(paths)
            self._tracked: dict[str, Tracked] = {}
            self._matched: dict[str, Match] = {}
            self._pending_loads: list[Transfer] = []
            self._pending_async: list[Transfer] = []
            self._loading: set[str] = set()  # async loads not yet reported finished
        else:
            self._store: KVStore | None = None
            self._server: LookupServer | None = None
            self._layers: dict[str, torch.Tensor] = {}
            self._staging: dict[str, torch.Tensor] = {}
            self._filled: dict[str, set[str]] = {}
            self._load_errors: set[int] = set()
            self._background: BackgroundLoads | None = None

    # ----------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Tokens the stores hold beyond the engine's own ``num_computed_tokens``."""
        tokens = list(request.all_token_ids)
        try:
            stored = self._client.longest_prefix(tokens)
        except (KVCacheError, OSError) as error:
            log.warning("mouthguard: lookup failed (%s); computing the prompt", error)
            stored = 0
        # the engine must compute at least one token itself to sample from it; the
        # block holding that token is stored all the same, so it is not saved again
        hit = min(stored, len(tokens) - 1)
        hit -= hit % self._block
        new = max(0, hit - num_computed_tokens)
        # at the bound, a load runs inside the forward instead of waiting for a slot
        asynchronous = self._options.async_load and new > 0
        asynchronous = asynchronous and len(self._loading) < MAX_ASYNC_LOADS
        self._matched[request.request_id] = Match(hit, stored // self._block, asynchronous)
        return new, asynchronous

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Track the request; plan and pin its load when there is one."""
        req_id = request.request_id
        hit, stored_blocks, asynchronous = self._matched.pop(req_id, Match(0, 0, False))
        tracked = self._tracked.get(req_id)
        if tracked is None:
            tracked = self._tracked[req_id] = Tracked(request)
        tracked.stored_blocks = stored_blocks
        if num_external_tokens <= 0:
            return
        tokens = list(request.all_token_ids)[:hit]
        first = (hit - num_external_tokens) // self._block
        block_ids = list(blocks.get_block_ids()[0][first : hit // self._block])
        tracked.load = Transfer(req_id, tokens, first, block_ids)
        tracked.failed_pages = set()
        # vLLM drops an async load only by loading nothing (num_external_tokens 0, so
        # not here): a request offered one waits until get_finished names it
        tracked.load_async = asynchronous
        self._unpin(tracked)  # a preempted request planned again: its old pin goes first
        try:
            tracked.pinned = self._client.pin(tokens)
        except (KVCacheError, OSError) as error:
            # the worker's get will come up short and report it: a recompute
            log.warning("mouthguard: pin failed (%s)", error)
        if tracked.load_async:
            self._loading.add(req_id)
            self._pending_async.append(tracked.load)
        else:
            self._pending_loads.append(tracked.load)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's loads, and saves of every block this step completes."""
        meta = MouthguardMetadata(loads=self._pending_loads, async_loads=self._pending_async)
        self._pending_loads, self._pending_async = [], []
        steps: list[tuple[str, int]] = [
            (new.req_id, new.num_computed_tokens) for new in scheduler_output.scheduled_new_reqs
        ]
        cached = scheduler_output.scheduled_cached_reqs
        steps += zip(cached.req_ids, cached.num_computed_tokens, strict=True)
        for req_id, computed in steps:
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            known = list(tracked.request.all_token_ids)
            done = computed + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            end = min(done, len(known)) // self._block
            if end <= tracked.stored_blocks:
                continue
            pages = self._pages(req_id)
            if len(pages) < end:
                continue
            first = tracked.stored_blocks
            meta.saves.append(
                Transfer(req_id, known[: end * self._block], first, list(pages[first:end]))
            )
            tracked.stored_blocks = end
        return meta

    def _pages(self, req_id: str) -> list[int]:
        manager = self._kv_cache_manager
        if manager is None:
            return []
        return list(manager.get_block_ids(req_id)[0])

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Count each load as loaded or failed (the engine recomputes the failed part).

        A sync load ends in the step it ran; an async one when ``finished_recving``
        names its request (its failed pages may come in that step or before).
        """
        invalid = set(connector_output.invalid_block_ids or ())
        finished = set(connector_output.finished_recving or ())
        self._loading -= finished
        for tracked in self._tracked.values():
            load = tracked.load
            if load is None:
                continue
            tracked.failed_pages |= invalid.intersection(load.block_ids)
            if tracked.load_async and load.req_id not in finished:
                continue
            tracked.load = None
            tracked.async_loads += tracked.load_async
            bad = [i for i, page in enumerate(load.block_ids) if page in tracked.failed_pages]
            good = bad[0] if bad else len(load.block_ids)
            tracked.loaded_tokens += good * self._block
            tracked.failed_tokens += (len(load.block_ids) - good) * self._block
            if bad:
                # the store dropped what failed: save those blocks again once recomputed
                tracked.stored_blocks = min(tracked.stored_blocks, load.first + good)

    def request_finished(
        self,
        request: Request,
        block_ids: list[int],  # noqa: ARG002 - vLLM's signature
    ) -> tuple[bool, dict[str, Any] | None]:
        """Unpin; the pages are held past the request only while an async load fills them.

        Saves are done by now. A request aborted while its async load runs keeps its
        pages (``True``) until ``finished_recving`` names it: vLLM frees them then.
        """
        tracked = self._tracked.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        if tracked is None:
            return False, None
        self._settle_sync_load(tracked, request)
        self._unpin(tracked)
        counts = {
            "loaded_tokens": tracked.loaded_tokens,
            "failed_tokens": tracked.failed_tokens,
            "async_loads": tracked.async_loads,
        }
        return request.request_id in self._loading, {"mouthguard": counts}

    def _settle_sync_load(self, tracked: Tracked, request: Request) -> None:
        """Count a sync load whose step's output this connector has not seen yet.

        vLLM finishes a request that stops in the step its load ran in (``max_tokens=1``)
        before it hands that step's output to :meth:`update_connector_output`, so the
        load is still open here. Its outcome follows from how the request finished:
        vLLM keeps a request whose load failed out of that step's stop checks (policy
        ``"recompute"``: it is scheduled again, so it cannot finish in that step) or
        finishes it with ``FINISHED_ERROR`` (policy ``"fail"``). So a request that
        finished by its own output loaded every page, and one finished with an error
        counts the load as failed. One aborted before the output (no tokens from
        it) counts neither way: whether its load ran is not known here.
        """
        load = tracked.load
        if load is None or tracked.load_async:  # an async load is settled by finished_recving
            return
        tracked.load = None
        tokens = len(load.block_ids) * self._block
        if request.status == RequestStatus.FINISHED_ERROR:
            tracked.failed_tokens += tokens
        elif request.status not in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_IGNORED):
            tracked.loaded_tokens += tokens  # stopped, length-capped, repetition: by its output

    def _unpin(self, tracked: Tracked) -> None:
        if tracked.pinned is None:
            return
        pinned, tracked.pinned = tracked.pinned, None
        try:
            self._client.unpin(list(tracked.request.all_token_ids), pinned)
        except (KVCacheError, OSError) as error:
            log.warning("mouthguard: unpin failed (%s)", error)

    # -------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Open this rank's store, and the socket the scheduler asks, for these pages."""
        layers = dict(kv_caches)
        if not layers:
            raise KVCacheError("mouthguard: the engine registered no KV cache")
        first = next(iter(layers.values()))
        for name, tensor in layers.items():
            if tensor.shape != first.shape or tensor.dtype != first.dtype:
                raise KVCacheError(
                    f"mouthguard: layer {name} has KV pages {tuple(tensor.shape)} "
                    f"{tensor.dtype}, unlike {tuple(first.shape)} {first.dtype}: only "
                    "models whose layers share one page shape are supported"
                )
        self._layers = layers
        from vllm.distributed.parallel_state import (  # noqa: PLC0415 - initialised by now
            get_tensor_model_parallel_rank,
        )

        rank = int(get_tensor_model_parallel_rank()) if self._tp_size > 1 else 0
        page = list(first.shape[1:])
        layout = f"vllm:{self._kv_cache_config.kv_cache_layout}:[layers={len(layers)}]+{page}"
        namespace = KVNamespace(
            self._model_id,
            dtype=str(first.dtype).removeprefix("torch."),
            layout=layout,
            tp_rank=rank,
            tp_size=self._tp_size,
        )
        options = dict(self._options.store)
        options["block_tokens"] = self._block
        if options.get("disk_dir") is not None:
            options["disk_dir"] = rank_disk_dir(options["disk_dir"], rank, self._tp_size)
        remote = open_remote(self._options.remote) if self._options.remote else None
        self._store = KVStore(namespace=namespace, remote=remote, **options)
        self._server = LookupServer(self._store, socket_path(self._engine_id, rank))
        if self._options.async_load:
            self._background = BackgroundLoads()
        log.info(
            "mouthguard: KV store for %s, rank %d of %d (options from %s)",
            self._model_id,
            rank,
            self._tp_size,
            self._options.config_file or "kv_connector_extra_config only",
        )

    def _block_shape(self) -> tuple[int, ...]:
        first = next(iter(self._layers.values()))
        return (len(self._layers), *first.shape[1:])

    def start_load_kv(
        self,
        forward_context: ForwardContext,  # noqa: ARG002 - vLLM's signature
        **kwargs: Any,  # noqa: ARG002
    ) -> None:
        """Fill the step's sync loads now; hand its async loads to the background thread."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, MouthguardMetadata)
        if self._store is None:
            return
        for load in meta.loads:
            self._load_errors.update(self._fill(load))
        background = self._background
        for load in meta.async_loads:
            if background is None:  # cannot happen: the scheduler reads the same options
                self._load_errors.update(load.block_ids)
                continue
            job = functools.partial(self._fill, load)
            background.submit(load.req_id, load.block_ids, job)

    def _fill(self, load: Transfer) -> list[int]:
        """Copy ``load``'s blocks from the store into its pages; the pages not filled.

        ``get(view=True)`` hands back the store's own bytes (verified when they came
        from disk or remote; a memory hit is not copied at all), and each block's
        layers are copied straight into their pages: one copy per byte. A block the
        store cannot return (checksum failure, evicted or vanished since the
        lookup), or of another shape, ends the usable prefix, and every page from
        there is returned. The views are dropped on return, so the store's memory
        bound holds but for the blocks of one load.
        """
        store = self._store
        if store is None:
            return list(load.block_ids)
        try:
            blocks = store.get(load.tokens, view=True)
        except (KVCacheError, OSError) as error:
            log.warning("mouthguard: load of %s failed (%s)", load.req_id, error)
            blocks = []
        shape = self._block_shape()
        layers = list(self._layers.values())
        usable = 0
        for page, block in zip(load.block_ids, blocks[load.first :], strict=False):
            wrong = not isinstance(block, torch.Tensor) or tuple(block.shape) != shape
            if wrong or block.dtype != layers[0].dtype:
                log.warning("mouthguard: a stored block of %s is of another shape", load.req_id)
                break
            for index, layer in enumerate(layers):
                copy_page(layer[page], block[index])
            usable += 1
        return list(load.block_ids[usable:])

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: :meth:`start_load_kv` loads every layer before the forward."""

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,  # noqa: ARG002 - vLLM's signature
        **kwargs: Any,  # noqa: ARG002
    ) -> None:
        """Copy this layer's pages of the step's saves, now that the layer wrote them."""
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, MouthguardMetadata) or layer_name not in self._layers:
            return
        index = list(self._layers).index(layer_name)
        for save in meta.saves:
            self._copy_layer(save, index, kv_layer)
            self._filled.setdefault(save.req_id, set()).add(layer_name)

    def _copy_layer(self, save: Transfer, index: int, kv_layer: torch.Tensor) -> None:
        staging = self._staging.get(save.req_id)
        if staging is None:
            shape = (len(save.block_ids), *self._block_shape())
            staging = self._staging[save.req_id] = torch.empty(shape, dtype=kv_layer.dtype)
        for row, page in enumerate(save.block_ids):
            copy_page(staging[row, index], kv_layer[page])

    def wait_for_save(self) -> None:
        """Put the step's completed blocks (``wait=False``: the disk write is not awaited)."""
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        store = self._store
        if not isinstance(meta, MouthguardMetadata) or store is None:
            return
        try:
            for save in meta.saves:
                filled = self._filled.get(save.req_id, set())
                for index, (name, layer) in enumerate(self._layers.items()):
                    if name not in filled:  # a backend that did not call save_kv_layer
                        self._copy_layer(save, index, layer)
                staging = self._staging[save.req_id]
                blocks: list[torch.Tensor | None] = [None] * save.first
                blocks += list(staging)
                store.put(save.tokens, blocks, wait=False)
        except (KVCacheError, OSError) as error:
            log.warning("mouthguard: save failed (%s); those blocks stay uncached", error)
        finally:
            self._staging.clear()
            self._filled.clear()

    def get_finished(
        self,
        finished_req_ids: set[str],  # noqa: ARG002 - vLLM's signature (saves never wait)
    ) -> tuple[set[str] | None, set[str] | None]:
        """Requests whose async load ended; their failed pages join the load errors.

        vLLM asks this before :meth:`get_block_ids_with_load_errors` in the same
        step, so a request is never reported loaded before its failed pages are.
        """
        if self._background is None:
            return None, None
        done, failed = self._background.finished()
        self._load_errors |= failed
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Pages whose load failed since the last call (vLLM recomputes them)."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        """Stop answering the scheduler and close the store (RAM blocks go to disk)."""
        if self._role == KVConnectorRole.SCHEDULER:
            self._client.close()
            return
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._background is not None:
            self._background.close()  # before the store closes under its reads
            self._background = None
        if self._store is not None:
            self._store.close()
            self._store = None

"""The connector's scheduler side driven in vLLM's call order, without an engine.

Usage: ``python connector_order.py WORKDIR`` with the vLLM environment's interpreter
(run by tests/integrations/test_vllm_connector_order.py). Builds the connector's
two roles from one real ``VllmConfig`` (the tiny model's config, block size 16): the
worker role registers two layers of host pages and saves a prompt's first blocks
into its store through ``wait_for_save``; the scheduler role asks that worker over
its socket, as in an engine. Each case then calls the scheduler-side methods in the
order vLLM's scheduler does for one request, and the worker's load in between:

``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta``;
the worker's ``start_load_kv``; then either ``request_finished`` before
``update_connector_output`` (a request that stops in its load's step:
``max_tokens=1``) or the other way round (one that runs on), and writes each
case's ``kv_transfer_params["mouthguard"]`` and whether the loaded pages match
the saved ones to ``WORKDIR/result.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).parent))
from common import make_model, prompt, write_result

BLOCK = 16
PAGES = 16
LAYERS = 2
SAVED_BLOCKS = 3  # the prompt's first 3 blocks are stored
PROMPT = prompt(7, SAVED_BLOCKS * BLOCK + 5)


def main(workdir: Path) -> None:
    """Run every case; write their counts."""
    import torch  # noqa: PLC0415 - the vLLM environment's, imported in main
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig  # noqa: PLC0415
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: PLC0415
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: PLC0415
    from vllm.v1.core.kv_cache_utils import KVCacheBlock  # noqa: PLC0415
    from vllm.v1.core.sched.output import SchedulerOutput  # noqa: PLC0415
    from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: PLC0415
    from vllm.v1.outputs import KVConnectorOutput  # noqa: PLC0415
    from vllm.v1.request import Request, RequestStatus  # noqa: PLC0415

    from mouthguard.integrations.vllm.connector import (  # noqa: PLC0415
        MouthguardConnector,
        MouthguardMetadata,
        Transfer,
    )

    model = make_model(workdir / "model")
    transfer = KVTransferConfig(
        kv_connector="MouthguardConnector",
        kv_connector_module_path="mouthguard.integrations.vllm",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={
            "disk_dir": str(workdir / "kv"),
            "memory_bytes": 8 << 20,
            "disk_bytes": 32 << 20,
        },
    )
    config = VllmConfig(
        model_config=ModelConfig(model=str(model), skip_tokenizer_init=True, dtype="float32"),
        cache_config=CacheConfig(block_size=BLOCK),
        kv_transfer_config=transfer,
    )
    kv_config = KVCacheConfig(num_blocks=PAGES, kv_cache_tensors=[], kv_cache_groups=[])
    worker = MouthguardConnector(config, KVConnectorRole.WORKER, kv_config)
    generator = torch.Generator().manual_seed(0)
    layers = {
        f"layer{i}": torch.rand((PAGES, 2, 2, BLOCK, 4), generator=generator) for i in range(LAYERS)
    }
    worker.register_kv_caches(layers)
    saved_pages = list(range(SAVED_BLOCKS))
    worker.bind_connector_metadata(
        MouthguardMetadata(
            saves=[Transfer("saver", PROMPT[: SAVED_BLOCKS * BLOCK], 0, saved_pages)]
        )
    )
    worker.wait_for_save()
    worker.clear_connector_metadata()
    scheduler = MouthguardConnector(config, KVConnectorRole.SCHEDULER, kv_config)

    def one_request(
        name: str, pages: list[int], stops_in_load_step: bool, status: Any
    ) -> dict[str, Any]:
        request = Request(name, list(PROMPT), SamplingParams(max_tokens=1), None)
        offered, asynchronous = scheduler.get_num_new_matched_tokens(request, 0)
        blocks = KVCacheBlocks(([KVCacheBlock(page) for page in pages],))
        scheduler.update_state_after_alloc(request, blocks, offered or 0)
        meta = scheduler.build_connector_meta(SchedulerOutput.make_empty())
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(None)
        errors = worker.get_block_ids_with_load_errors()
        worker.clear_connector_metadata()
        output = KVConnectorOutput(invalid_block_ids=errors)
        if stops_in_load_step:  # vLLM: the stop check (and request_finished) come first
            request.status = status
            _, params = scheduler.request_finished(request, pages)
            scheduler.update_connector_output(output)
        else:
            scheduler.update_connector_output(output)
            request.status = status
            _, params = scheduler.request_finished(request, pages)
        same = all(
            torch.equal(layer[page], layer[saved])
            for layer in layers.values()
            for page, saved in zip(pages[:SAVED_BLOCKS], saved_pages, strict=True)
        )
        return {
            "offered": offered,
            "asynchronous": asynchronous,
            "errors": sorted(errors),
            "pages_match": same,
            "counts": (params or {}).get("mouthguard"),
        }

    result = {
        "stops_in_load_step": one_request(
            "one-token", [4, 5, 6, 7], True, RequestStatus.FINISHED_LENGTH_CAPPED
        ),
        "runs_on": one_request(
            "longer", [8, 9, 10, 11], False, RequestStatus.FINISHED_LENGTH_CAPPED
        ),
        "failed_with_error": one_request(
            "error", [12, 13, 14, 15], True, RequestStatus.FINISHED_ERROR
        ),
    }
    scheduler.shutdown()
    worker.shutdown()
    write_result(workdir / "result.json", result)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

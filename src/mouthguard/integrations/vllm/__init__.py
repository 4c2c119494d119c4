"""vLLM plug-ins: the ``MouthguardConnector`` KV connector and the ``mouthguard`` load format.

::

    from vllm import LLM
    from vllm.config import KVTransferConfig

    llm = LLM(model=..., kv_transfer_config=KVTransferConfig(
        kv_connector="MouthguardConnector",
        kv_connector_module_path="mouthguard.integrations.vllm",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"disk_dir": "/nvme/kv", "disk_bytes": 100 << 30},
    ))

This package imports without vLLM (the options and the scheduler-worker channel are
plain Python); the vLLM classes load when they are first named, which is how vLLM's
connector factory finds them (``getattr(module, "MouthguardConnector")``).
See ``docs/integrations.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (each imports vLLM).
_LAZY = {
    "MouthguardConnector": "mouthguard.integrations.vllm.connector",
    "MouthguardMetadata": "mouthguard.integrations.vllm.transfer",
}

__all__ = ["MouthguardConnector", "MouthguardMetadata"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

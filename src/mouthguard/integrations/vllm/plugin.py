"""vLLM's plug-in entry point (``vllm.general_plugins``): registers the load format.

vLLM calls :func:`register` in every one of its processes, for every user who has
mouthguard installed, so it stays cheap: the loader's module imports only vLLM
pieces the engine has already loaded, and mouthguard's weights reader loads when a
model is loaded with ``load_format="mouthguard"``.
"""

from __future__ import annotations


def register() -> None:
    """Register the ``mouthguard`` load format with vLLM."""
    from mouthguard.integrations.vllm.loader import (  # noqa: PLC0415 - vLLM only when it asks
        register as register_loader,
    )

    register_loader()

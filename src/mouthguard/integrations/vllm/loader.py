"""The ``mouthguard`` load format: vLLM reads model weights through :func:`mouthguard.weights.load`.

Imports vLLM. Registered by :func:`register`, which vLLM calls in each of its
processes through the ``vllm.general_plugins`` entry point that installing
mouthguard declares; ``LLM(model=..., load_format="mouthguard")`` and
``vllm serve --load-format mouthguard`` then need nothing else.

``model_loader_extra_config`` (all optional):

* ``source``: where the weights are, when not the model directory itself: an
  ``s3://`` URL (read through the verified node cache, ``cache_dir``), another
  directory, or a mouthguard store (with ``run`` and ``step``). vLLM still reads
  the model's ``config.json`` from ``model``.
* ``run``, ``step``: a checkpoint of that store (default step: the newest).
* ``cache_dir``: the node cache of a remote source.
* ``verify`` (default true): every file with a checksum (a manifest's xxh3) is
  checked, and a mismatch fails the load.

Every tensor is read whole, verified, and handed to the model's own
``load_weights``, whose per-parameter loaders take this rank's slice under tensor
parallelism (and fuse q/k/v and gate/up): the same path vLLM's default loader
takes, so a parameter is sliced exactly as vLLM expects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from mouthguard.errors import WeightsError

log = logging.getLogger(__name__)

LOAD_FORMAT = "mouthguard"
_OPTIONS = {"source": str, "run": str, "step": int, "cache_dir": str, "verify": bool}


def loader_options(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check ``model_loader_extra_config``; raise :class:`WeightsError` on a bad key or type."""
    options = dict(extra or {})
    for name, value in options.items():
        wanted = _OPTIONS.get(name)
        if wanted is None:
            raise WeightsError(
                f"unknown mouthguard load option {name!r}; known: {sorted(_OPTIONS)}"
            )
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            raise WeightsError(
                f"mouthguard load option {name!r} must be {wanted.__name__}, got {value!r}"
            )
    return options


class MouthguardModelLoader(BaseModelLoader):  # type: ignore[misc]  # vLLM is untyped
    """vLLM model loader backed by :func:`mouthguard.weights.load` (see the module docstring)."""

    def download_model(self, model_config: Any) -> None:
        """Nothing to fetch ahead: a remote source is pulled into its cache on load."""

    def load_weights(self, model: torch.nn.Module, model_config: Any) -> None:
        """Read, verify and hand every tensor to ``model.load_weights``.

        Raises:
            WeightsError: a parameter of the model got no tensor, or bad options.
        """
        from mouthguard import weights  # noqa: PLC0415 - torch-heavy, only when loading

        options = loader_options(self.load_config.model_loader_extra_config)
        source = options.pop("source", None) or str(model_config.model)
        started = time.perf_counter()
        loaded = weights.load(source, device="cpu", **options)
        # every vLLM model defines load_weights (torch types module attributes as Tensor)
        names = model.load_weights(loaded.tensors.items())  # type: ignore[operator]
        if names is not None:
            missing = sorted({name for name, _ in model.named_parameters()} - set(names))
            if missing:
                raise WeightsError(f"{loaded.source}: no weights for {missing[:5]} (and more?)")
        log.info(
            "mouthguard: %.2f GiB of weights from %s (%s, %d verified files) in %.2f s",
            loaded.nbytes / 2**30,
            loaded.source,
            loaded.kind,
            len(loaded.verified_files),
            time.perf_counter() - started,
        )


def register() -> None:
    """Register the ``mouthguard`` load format (vLLM may call this more than once)."""
    register_model_loader(LOAD_FORMAT)(MouthguardModelLoader)

"""The ``mouthguard`` load format: vLLM streams weights from mouthguard.weights.iter_tensors.

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

The weights are streamed: each tensor is handed to the model's own
``load_weights`` as a view of the mapped file as soon as it is reached (no
private copy of the file; memory beyond the model's own parameters is the page
cache), and the model's per-parameter loaders copy it into place, taking this
rank's slice under tensor parallelism (and fusing q/k/v and gate/up): the same
path vLLM's default loader takes. A file with a checksum is hashed on a thread
while its tensors are copied, and checked before the load returns: a wrong byte
raises :class:`~mouthguard.errors.WeightsError` naming the file, and the engine
fails to start rather than serve a token.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from mouthguard.errors import ChecksumMismatchError, WeightsError

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
        """Stream every tensor into ``model.load_weights``; verify before returning.

        Raises:
            WeightsError: a file failed its checksum, a parameter of the model got
                no tensor, or bad options.
        """
        from mouthguard import weights  # noqa: PLC0415 - torch-heavy, only when loading

        options = loader_options(self.load_config.model_loader_extra_config)
        source = options.pop("source", None) or str(model_config.model)
        stream = weights.iter_tensors(source, **options)
        try:
            # every vLLM model defines load_weights (torch types module attributes as Tensor)
            names = model.load_weights(stream)  # type: ignore[operator]
            stream.check()  # a model that stopped iterating early: check what it took
        except ChecksumMismatchError as exc:
            raise WeightsError(f"refusing to serve damaged weights: {exc}") from exc
        if names is not None:
            missing = sorted({name for name, _ in model.named_parameters()} - set(names))
            if missing:
                raise WeightsError(f"{stream.source}: no weights for {missing[:5]} (and more?)")
        stats = stream.stats
        log.info(
            "mouthguard: %.2f GiB of weights from %s (%s, %d verified files) in %.2f s",
            stats.nbytes / 2**30,
            stream.source,
            stream.kind,
            len(stats.verified_files),
            stats.seconds,
        )


def register() -> None:
    """Register the ``mouthguard`` load format (vLLM may call this more than once)."""
    register_model_loader(LOAD_FORMAT)(MouthguardModelLoader)

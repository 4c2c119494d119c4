"""Capture and restore a whole training state, so that resume is bitwise exact.

Saving only model weights is not enough to continue a run as if it never
stopped: the optimizer's moments and step counts, the LR scheduler's position,
and every random number generator (Python, NumPy, torch CPU, CUDA) must come
back too, or dropout masks and data shuffles diverge from the uninterrupted run.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Protocol

from mouthguard.errors import DatasetChangedError, StateMismatchError

# numpy and torch are imported by the two functions that use them: this module is
# part of ``import mouthguard``, which the CLI's non-tensor commands do without them.


class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict`` (models, optimizers, schedulers)."""

    def state_dict(self) -> Any:
        """Return the object's state."""

    def load_state_dict(self, state_dict: Any, /) -> Any:
        """Restore the object's state."""


def capture_rng_state() -> dict[str, object]:
    """Snapshot every RNG a training loop commonly draws from."""
    import numpy as np  # noqa: PLC0415 - see the module's imports
    import torch  # noqa: PLC0415

    version, internal, gauss = random.getstate()
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)  # legacy=True always gives the MT19937 tuple
    kind, keys, pos, has_gauss, cached = legacy
    state: dict[str, object] = {
        "python": (version, tuple(internal), gauss),
        "numpy": (str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, object]) -> None:
    """Restore RNG states captured by :func:`capture_rng_state`.

    Raises:
        StateMismatchError: the snapshot is malformed.
    """
    import numpy as np  # noqa: PLC0415 - see the module's imports
    import torch  # noqa: PLC0415

    try:
        python_state: Any = state["python"]
        version, internal, gauss = python_state
        random.setstate((version, tuple(internal), gauss))
        numpy_state: Any = state["numpy"]
        kind, keys, pos, has_gauss, cached = numpy_state
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
        torch_state: Any = state["torch"]
        torch.set_rng_state(torch_state)
        cuda = state.get("cuda")
        if cuda is not None and torch.cuda.is_available():
            cuda_states: Any = cuda
            torch.cuda.set_rng_state_all(list(cuda_states))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateMismatchError(f"malformed RNG state in checkpoint: {exc}") from None


class TrainingState:
    """Bundles model, optimizer, scheduler, RNGs, step and metadata into one state.

    ``state_dict()`` returns a plain nested dict for ``Checkpointer.save``;
    ``load_state_dict()`` restores everything from what ``Checkpointer.load``
    returned. Passing ``into=training_state.state_dict()`` to ``load`` fills the
    model's parameters and the optimizer's moment tensors in place.

    Args:
        model: the model (anything with ``state_dict``/``load_state_dict``).
        optimizer: optional optimizer.
        scheduler: optional LR scheduler.
        step: the current training step.
        metadata: user values saved alongside (typed JSON: no arbitrary objects).
        data: optional data-loader position (``mouthguard.data.StreamingDataLoader``),
            saved under ``"data"``. Restoring it first refuses a changed dataset
            (``DatasetChangedError`` naming both fingerprints) before anything else
            is touched; ``load_state_dict(state, force_data=True)`` resumes anyway.
    """

    def __init__(
        self,
        model: Stateful,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        *,
        step: int = 0,
        metadata: dict[str, object] | None = None,
        data: Stateful | None = None,
    ) -> None:
        self.model = model
        self.data = data
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.step = step
        self.metadata: dict[str, object] = dict(metadata or {})

    def state_dict(self) -> dict[str, object]:
        """The whole training state, ready for ``Checkpointer.save``."""
        state: dict[str, object] = {
            "step": self.step,
            "model": self.model.state_dict(),
            "rng": capture_rng_state(),
            "metadata": dict(self.metadata),
        }
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.data is not None:
            state["data"] = self.data.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, object], *, force_data: bool = False) -> None:
        """Restore everything captured by :meth:`state_dict`.

        Args:
            state: what :meth:`state_dict` returned (as loaded from a checkpoint).
            force_data: resume the data position even if the dataset changed.

        Raises:
            StateMismatchError: a part this object needs is missing from ``state``.
            DatasetChangedError: the data position belongs to another dataset version.
        """
        for part, owner in (
            ("optimizer", self.optimizer),
            ("scheduler", self.scheduler),
            ("data", self.data),
        ):
            if owner is not None and part not in state:
                raise StateMismatchError(f"checkpoint has no {part} state to restore")
        step = state.get("step")
        if not isinstance(step, int):
            raise StateMismatchError("checkpoint has no integer 'step'")
        if self.data is not None:  # first: a refused dataset leaves everything untouched
            data: Any = self.data
            if force_data:
                data.load_state_dict(state["data"], force=True)
            else:
                try:
                    data.load_state_dict(state["data"])
                except DatasetChangedError as exc:
                    # The loader names its own keyword; here the way past it is ours.
                    raise DatasetChangedError.refusing(
                        exc.saved,
                        exc.current,
                        resume_with="TrainingState.load_state_dict(state, force_data=True)",
                    ) from None
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        rng = state.get("rng")
        if not isinstance(rng, Mapping):
            raise StateMismatchError("checkpoint has no RNG state")
        restore_rng_state(rng)
        metadata = state.get("metadata", {})
        self.metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
        self.step = step

"""The power-loss harness's ``dcp`` variant: saves through ``torch.distributed.checkpoint``.

:func:`record_dcp` saves three steps with ``dcp.save`` and mouthguard's DCP
``Writer`` (one rank, ``no_dist``), recording the file-system operations as the
other variants do; :class:`DcpView` is the checker's view of such a run: it
lists with the ``Checkpointer`` (a DCP checkpoint is an ordinary committed
checkpoint) and loads with the DCP ``Reader``, which the ``Checkpointer``
refuses to stand in for. The state is tensors only: DCP would pickle anything
else, and mouthguard's reader refuses pickled items by default.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

import mouthguard
from mouthguard.checkpoint.catalog import GarbageReport
from mouthguard.checkpoint.store import Store
from mouthguard.dcp import Reader, Writer
from reliability.crash_worker import importance_for, state_for
from reliability.fsrecord import Recorder

#: The mark a DCP recording starts with: the checker loads through the DCP reader.
MARK = "dcp"
#: Steps saved: routine, routine, milestone.
STEPS = (2, 3, 4)


def dcp_expected(step: int, elements: int) -> dict[str, Any]:
    """The tensors saved at ``step`` (``state_for`` without its plain values)."""
    state = state_for(step, elements)
    return {"model": state["model"], "optim": state["optim"]}


def record_dcp(run: str, elements: int, store_dir: Path, log: Path) -> None:
    """Save :data:`STEPS` through DCP into ``store_dir``, recording into ``log``."""
    with Recorder(store_dir, log) as rec:
        rec.mark(ev=MARK)
        store = mouthguard.open_store(store_dir)
        for step in STEPS:
            writer = Writer(
                store, run=run, step=step, importance=importance_for(step), background=False
            )
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
                dcp_save(dcp_expected(step, elements), storage_writer=writer, no_dist=True)
            rec.mark(ev="acked", step=step)


@dataclass(frozen=True)
class Loaded:
    """What :meth:`DcpView.load` read: the step the reader chose and the state."""

    step: int
    state: dict[str, Any]


class DcpView:
    """The checker's view of a DCP-saved run: list as any checkpoint, load through DCP."""

    def __init__(self, store: Store, run: str, elements: int) -> None:
        self.store, self.run, self.elements = store, run, elements
        self._ckpt = mouthguard.Checkpointer(store, run=run, background=False)

    def steps(self) -> list[int]:
        """Committed steps, ascending."""
        return self._ckpt.steps()

    def collect_garbage(self, *, grace_seconds: float) -> list[GarbageReport]:
        """Remove leftovers of interrupted saves (as the ``Checkpointer`` does)."""
        return self._ckpt.collect_garbage(grace_seconds=grace_seconds)

    def load(self, step: int | None = None) -> Loaded:
        """``dcp.load`` of ``step`` (None: the newest valid), every byte verified.

        Raises:
            MouthguardError: what the reader raised (DCP wraps it; unwrapped here).
        """
        # Every step holds tensors of one shape (the variant's elements are few).
        target = {
            part: {k: torch.zeros_like(t) for k, t in tensors.items()}
            for part, tensors in dcp_expected(0, self.elements).items()
        }
        reader = Reader(self.store, run=self.run, step=step)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
                dcp_load(target, storage_reader=reader, no_dist=True)
        except CheckpointException as exc:
            (error, _trace), *_ = exc.failures.values()
            raise error from None
        assert reader.resolved_step is not None
        return Loaded(reader.resolved_step, target)

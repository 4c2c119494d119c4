"""The demo's last act: a run whose newest checkpoint holds a NaN resumes from the one before.

Checksums prove that bytes are the ones saved, not that the state is worth
resuming from: a job whose loss went to NaN saves a perfectly intact checkpoint
of a dead model. Here the resumed run's final state is saved as a sibling run
``<run>-diverged`` (step ``N``), then again with one weight set to NaN (step
``N + 1``, saved without a guard, as a job that did not look would). A resume
with ``load(check=mouthguard.checks.finite())`` rejects ``N + 1``, marks it
suspect in the store (``mouthguard ls`` shows why) and returns ``N``. Step
``N`` of the sibling run is then replicated like every other checkpoint.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.store import Store
from mouthguard.checks import finite
from mouthguard.errors import CheckpointFallbackWarning
from mouthguard.format.state_tree import iter_tensors
from mouthguard.jobs.replicator import Replicator


@dataclass(frozen=True)
class DivergedRecord:
    """What the NaN resume did.

    Attributes:
        run: the sibling run holding the two checkpoints.
        good_step: the step saved with the intact final state.
        nan_step: the step saved with a NaN in its weights.
        poisoned: the key path of the tensor that got the NaN.
        resumed_step: the step ``load(check=finite())`` returned.
        warning: the fallback warning it gave.
        suspect: the reason recorded on the NaN step (as ``ls``/``show`` give it).
    """

    run: str
    good_step: int
    nan_step: int
    poisoned: str
    resumed_step: int
    warning: str
    suspect: str

    @property
    def ok(self) -> bool:
        """The resume skipped the NaN step, said so, and marked it suspect."""
        return self.resumed_step == self.good_step and bool(self.warning) and bool(self.suspect)


def diverge_and_resume(store: Store, run: str) -> DivergedRecord:
    """Save ``run``'s newest state twice (the second with a NaN) and resume with a check."""
    final = Checkpointer(store, run, background=False).load()
    sibling = f"{run}-diverged"
    ckpt = Checkpointer(store, sibling, background=False)
    good, bad = final.step, final.step + 1
    ckpt.save(good, final.state)
    path, tensor = next(
        (p, t) for p, t in iter_tensors(final.state) if t.is_floating_point() and t.numel()
    )
    tensor.view(-1)[0] = float("nan")  # the loaded tensors are ours to change
    ckpt.save(bad, final.state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointFallbackWarning)
        resumed = ckpt.load(check=finite())
    # The side run is the store's like any other: its sound checkpoint is protected
    # before the page is shown (the suspect one is, rightly, never protected).
    Replicator(store).replicate(sibling, good)
    info = ckpt.info(bad)
    said = [str(w.message) for w in caught if issubclass(w.category, CheckpointFallbackWarning)]
    return DivergedRecord(
        run=sibling,
        good_step=good,
        nan_step=bad,
        poisoned=".".join(map(str, path)),
        resumed_step=resumed.step,
        warning=said[0] if said else "",
        suspect=info.suspect if info is not None else "",
    )

"""mouthguard: importance-aware storage for AI training and inference.

The public API::

    import mouthguard
    store = mouthguard.open_store("./mouthguard-store")
    ckpt = mouthguard.Checkpointer(store, run="my-run")
    ckpt.save(step, state, importance="milestone")
    loaded = ckpt.load()            # newest valid checkpoint, verified
    gate = mouthguard.burst_gate(store)   # busy while a save runs: loaders' prefetch yields
"""

from mouthguard import checks
from mouthguard.checkpoint import (
    Checkpointer,
    CheckpointInfo,
    CopyInfo,
    LoadedCheckpoint,
    PeerMemory,
    PreemptionGuard,
    Store,
    TrainingState,
    capture_rng_state,
    open_store,
    restore_rng_state,
)
from mouthguard.errors import CheckpointFallbackWarning, MouthguardError, SuspectStateWarning
from mouthguard.policy.importance import Importance
from mouthguard.version import VERSION
from mouthguard.wiring import burst_gate
from mouthguard.wiring import install as _install_listeners

__version__ = VERSION

# Every store's saves and commits reach the background service (see wiring.py).
_install_listeners()

__all__ = [
    "CheckpointFallbackWarning",
    "CheckpointInfo",
    "Checkpointer",
    "CopyInfo",
    "Importance",
    "LoadedCheckpoint",
    "MouthguardError",
    "PeerMemory",
    "PreemptionGuard",
    "Store",
    "SuspectStateWarning",
    "TrainingState",
    "__version__",
    "burst_gate",
    "capture_rng_state",
    "checks",
    "open_store",
    "restore_rng_state",
]

"""Checkpoints: verified, crash-safe save and load of training state."""

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.emergency import PreemptionGuard
from mouthguard.checkpoint.info import CheckpointInfo, CopyInfo, LoadedCheckpoint, Rejection
from mouthguard.checkpoint.peer_memory import PeerMemory
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.checkpoint.training_state import TrainingState, capture_rng_state, restore_rng_state

__all__ = [
    "CheckpointInfo",
    "Checkpointer",
    "CopyInfo",
    "LoadedCheckpoint",
    "PeerMemory",
    "PreemptionGuard",
    "Rejection",
    "Store",
    "TrainingState",
    "capture_rng_state",
    "open_store",
    "restore_rng_state",
]

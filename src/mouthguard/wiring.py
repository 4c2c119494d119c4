"""The composition root: every store's saves and commits reach the background service.

``checkpoint`` reports saves, commits and damage to a
:class:`~mouthguard.checkpoint.listeners.CheckpointListener` and must not import
``jobs``; ``jobs`` implement the listener (``BackgroundService``). This module,
above both, joins them: importing ``mouthguard`` (which every import of a
submodule does first) installs :func:`background_service` as the default
listener of every :class:`~mouthguard.checkpoint.store.Store`.

So ``Checkpointer(store, run)`` starts the store's background replication
whenever the store has a second tier, on the coordinator, unless
``background=False`` -- the Checkpointer decides *whether* to tell, the store
decides *whom*.

The same service holds the store's :class:`~mouthguard.jobs.burst.BurstGate`,
which its checkpointers' saves mark busy. :func:`burst_gate` hands it out, so
other background I/O -- a dataset loader's prefetch
(``StreamingDataset(..., burst=mouthguard.burst_gate(store))``) -- can yield to
checkpoint bursts as replication does. It lives here because only this module
knows that a store's listener is the jobs' service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.checkpoint.store import Store, install_default_listener

if TYPE_CHECKING:
    from mouthguard.jobs.burst import BurstGate


def background_service(store: Store) -> CheckpointListener:
    """The background service of ``store`` in this process, started on first use."""
    # Imported when a save first needs it: `import mouthguard` (the CLI's `ls`, say)
    # must not pay for replication, retention and scrubbing it may never run.
    from mouthguard.jobs.service import service_for  # noqa: PLC0415

    return service_for(store)


def install() -> None:
    """Make :func:`background_service` the default listener of every store (idempotent)."""
    install_default_listener(background_service)


def burst_gate(store: Store) -> BurstGate:
    """The burst gate of ``store``: busy while one of its checkpoints is being saved.

    Checkpointers on ``store`` (``background=True``, the default) mark the gate
    busy for the length of each save's write to the fast tier, and when a save is
    announced (``Checkpointer.announce``) shortly before it. Background I/O that
    should not compete with a save waits on it with a bound: ``gate.busy`` and
    ``gate.wait(timeout)`` (``mouthguard.data.StreamingDataset(..., burst=gate)``
    does so before each prefetch). The same object for the same store while it
    lives, in this process; getting it starts the store's background service, as
    the first save would.

    Raises:
        ValueError: the store was built with a listener of its own (``Store(...,
            listener=...)``) that is not the background service: its saves mark no
            gate this function could return.
    """
    from mouthguard.jobs.service import BackgroundService  # noqa: PLC0415 - see background_service

    listener = store.listener()
    if not isinstance(listener, BackgroundService):  # how the store was built, not a type error
        raise ValueError(  # noqa: TRY004
            f"{store!r} reports its saves to {type(listener).__name__}, not to the background "
            "service: it has no burst gate (build the store without listener=, or pass that "
            "listener's own signal)"
        )
    return listener.gate

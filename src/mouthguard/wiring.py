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
"""

from __future__ import annotations

from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.checkpoint.store import Store, install_default_listener


def background_service(store: Store) -> CheckpointListener:
    """The background service of ``store`` in this process, started on first use."""
    # Imported when a save first needs it: `import mouthguard` (the CLI's `ls`, say)
    # must not pay for replication, retention and scrubbing it may never run.
    from mouthguard.jobs.service import service_for  # noqa: PLC0415

    return service_for(store)


def install() -> None:
    """Make :func:`background_service` the default listener of every store (idempotent)."""
    install_default_listener(background_service)

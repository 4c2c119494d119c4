"""What the checkpoint layer tells whoever listens: saves, commits, damage, idleness.

The checkpoint layer never imports what sits above it. Replication, retention
and scrubbing (``mouthguard.jobs``) need to hear of saves and commits, so the
checkpoint layer speaks to a :class:`CheckpointListener` that the
:class:`~mouthguard.checkpoint.store.Store` hands out, and the jobs implement it
(``jobs/service.py``'s ``BackgroundService``). Which listener a store hands out
is decided by whoever builds the store, or by the process-wide default that
``mouthguard/wiring.py`` installs when the package is imported.

Contract for implementations:

* every method is called from the saving or loading thread and must return
  quickly: queue the work, do not do it (``wait_idle`` alone blocks, by design);
* a failure inside a listener must not fail the save that reported it, so
  implementations log their own errors rather than raise them;
* ``save_started``/``save_finished`` come in pairs, also when the save fails;
* ``notify_commit`` is for commits only (the backlog estimate counts them as
  saves); damage found later is ``request_repair``.
"""

from __future__ import annotations

from typing import Protocol


class CheckpointListener(Protocol):
    """Hears of the checkpoint layer's events on one store (see the module docstring)."""

    def save_started(self) -> None:
        """A save began writing to the fast tier: background copies should yield the disk."""

    def save_finished(self) -> None:
        """The save that :meth:`save_started` announced ended (committed or failed)."""

    def announce(self, seconds_until_save: float, nbytes: int) -> None:
        """A save of ``nbytes`` comes in ``seconds_until_save``: clear the disk for it."""

    def notify_commit(self, run: str, step: int) -> None:
        """Checkpoint ``run``/``step`` committed on the fast tier: replicate it soon."""

    def request_repair(self, run: str, step: int) -> None:
        """A copy of ``run``/``step`` was found damaged: confirm it and replace it."""

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is queued or in flight; False once ``timeout`` passed."""

"""Emergency save on preemption: SIGTERM means "you have a grace period, then SIGKILL".

Schedulers (Slurm, Kubernetes, spot instances) announce a preemption with
SIGTERM and kill the job a grace period later. Whatever was trained since the
last checkpoint is lost unless the job saves now. :class:`PreemptionGuard` is
opt-in: installed, it turns SIGTERM into one last save and a clean exit.

Why the save is not done inside the signal handler: the handler runs between
two bytecodes of the training loop, possibly in the middle of an optimizer
step, so the state could be half-updated. The handler only records the request;
the loop calls :meth:`PreemptionGuard.at_step_boundary` once per step, where the
state is consistent, and that call saves and exits. If the loop does not reach a
boundary before the grace period runs out (a step longer than the grace), a
watchdog ends the process with the conventional 128 + signal code, because a
save that cannot finish in time is worth less than a clean, prompt exit: the
previous checkpoint is intact either way.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.policy.importance import Importance

log = logging.getLogger(__name__)

StateFn = Callable[[], tuple[int, object]]


class PreemptionGuard:
    """Saves the newest state when SIGTERM arrives, then exits cleanly.

    Args:
        checkpointer: where the emergency checkpoint goes.
        state_fn: returns ``(step, state)`` for the current, consistent state.
        grace_seconds: the scheduler's grace period; the save must start before it
            runs out (the watchdog exits the process at the deadline).
        importance: importance of the emergency checkpoint (milestone by default:
            it is the run's newest recovery point and gets two verified copies).
        exit_code: the exit status after a successful emergency save.

    Use::

        guard = PreemptionGuard(ckpt, lambda: (ts.step, ts.state_dict()), grace_seconds=30)
        with guard:
            for batch in data:
                train_step(batch)
                guard.at_step_boundary()   # saves and exits if SIGTERM arrived
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        state_fn: StateFn,
        *,
        grace_seconds: float = 30.0,
        importance: str | Importance = Importance.MILESTONE,
        exit_code: int = 0,
    ) -> None:
        self.checkpointer = checkpointer
        self.state_fn = state_fn
        self.grace_seconds = grace_seconds
        self.importance = importance
        self.exit_code = exit_code
        self._requested_at: float | None = None
        self._previous: signal.Handlers | Callable[[int, FrameType | None], object] | int | None = (
            None
        )
        self._saving = threading.Event()

    @property
    def requested(self) -> bool:
        """Whether SIGTERM has arrived."""
        return self._requested_at is not None

    def install(self) -> PreemptionGuard:
        """Install the SIGTERM handler (main thread only)."""
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the previous SIGTERM handler."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._requested_at is not None:
            return
        self._requested_at = time.monotonic()
        log.warning("SIGTERM: emergency checkpoint at the next step boundary")
        threading.Thread(target=self._watchdog, args=(signum,), daemon=True).start()

    def _watchdog(self, signum: int) -> None:
        """Exit at the deadline if the loop never reached a step boundary to save at."""
        assert self._requested_at is not None
        remaining = self._requested_at + self.grace_seconds - time.monotonic()
        time.sleep(max(0.0, remaining))
        if not self._saving.is_set():
            log.error("grace period over before a step boundary: exiting without a save")
            os._exit(128 + signum)

    def at_step_boundary(self) -> None:
        """Call once per step, where the state is consistent. Saves and exits if asked to.

        Raises:
            SystemExit: after the emergency checkpoint is committed (``exit_code``).
        """
        if self._requested_at is None:
            return
        self._saving.set()  # from here the save runs to the end; the scheduler's kill is the bound
        step, state = self.state_fn()
        started = time.monotonic()
        if self.checkpointer.exists(step):
            log.warning("step %d is already checkpointed: exiting without a new save", step)
        else:
            self.checkpointer.save(step, state, importance=self.importance)
            log.warning(
                "emergency checkpoint of step %d committed in %.2f s",
                step,
                time.monotonic() - started,
            )
        raise SystemExit(self.exit_code)

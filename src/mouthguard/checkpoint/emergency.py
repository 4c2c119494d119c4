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

Why the watchdog does not wait for the Python handler: CPython runs signal
handlers in the main thread only, the next time it executes bytecode. A step
blocked in C (a hung collective, a long kernel, ``time.sleep``) while the kernel
delivers SIGTERM to another thread (torch's worker threads take signals too)
would never run the handler, and nothing would end the process before SIGKILL.
So the guard also listens on CPython's signal wakeup fd, which the C-level
handler writes from whichever thread the signal lands on, and a reader thread
arms the watchdog from there. Where another wakeup fd is already set (an asyncio
loop), the guard leaves it alone and relies on the handler alone.
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
        self._arming = threading.RLock()  # the handler and the wakeup reader both arm
        self._wakeup: tuple[int, int] | None = None  # (read end, write end)

    @property
    def requested(self) -> bool:
        """Whether SIGTERM has arrived."""
        return self._requested_at is not None

    def install(self) -> PreemptionGuard:
        """Install the SIGTERM handler and the wakeup-fd listener (main thread only)."""
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        if previous != -1:  # someone else's (an asyncio loop): give it back
            signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
            os.close(read_end)
            os.close(write_end)
            log.info("a signal wakeup fd is already set: the watchdog relies on the handler")
            return self
        self._wakeup = (read_end, write_end)
        threading.Thread(target=self._listen, args=(read_end,), daemon=True).start()
        return self

    def uninstall(self) -> None:
        """Restore the previous SIGTERM handler and stop listening."""
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            os.close(self._wakeup[1])  # the reader sees end of file and stops
            self._wakeup = None
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _listen(self, read_end: int) -> None:
        """Arm the watchdog when the C-level handler reports SIGTERM, from any thread."""
        try:
            while chunk := os.read(read_end, 64):
                if signal.SIGTERM in chunk:
                    self._arm(signal.SIGTERM)
        except OSError:
            pass  # the pipe was closed under us: uninstalled
        finally:
            os.close(read_end)

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._arm(signum)

    def _arm(self, signum: int) -> None:
        """Record the request and start the grace watchdog, once."""
        with self._arming:
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

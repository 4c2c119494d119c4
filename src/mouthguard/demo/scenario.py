"""The ``mouthguard demo`` scenario: train, kill mid-save, damage, resume, verify, compare.

On a store of two local tiers, ``fast`` and ``durable`` (the default layout),
checkpoints are replicated in the background. Phases (the training ones are
real ``python -m mouthguard.demo.worker`` processes):

1. **train** - a fresh run checkpoints every ``every`` steps and waits after
   each save until it is replicated, so every committed step has a verified copy
   on both tiers. Its ``kill_at_save``-th save goes through a throttled tier;
   once a fraction of that save is on disk the process gets ``SIGKILL``.
   ``Checkpointer.list()`` is then taken to show the killed step never became
   visible.
2. **damage** - on disk, behind mouthguard's back: a few bytes are flipped in
   *every* copy of the newest committed checkpoint (it is lost for real), and
   the fast copy of the one before loses its rank file.
3. **resume** - a new process loads the newest *valid* checkpoint: ``load()``
   rejects the lost step on both tiers and the damaged fast copy of the one
   before (a ``CheckpointFallbackWarning`` each), and reads that step's intact
   ``durable`` copy. It trains to the end, checkpointing again: re-saving the
   lost step sets its damaged fast copy aside, and background replication sets
   the other damaged copies aside, repairs the fast copy from ``durable`` and
   replicates the new checkpoints. The worker waits for replication to finish.
4. **verify** - every committed copy of the run on every tier is read back, as
   ``mouthguard verify`` does.
5. **reference** - the same job trains uninterrupted, without checkpoints.
6. **lifecycle** - the final checkpoints' importance and state, and what retention
   would do to them: a dry run that deletes nothing (:mod:`~mouthguard.demo.lifecycle`).
7. **diverged** - the final state saved again as a sibling run, then once more
   with a NaN in its weights; ``load(check=finite())`` skips the NaN step, marks
   it suspect and resumes from the one before (:mod:`~mouthguard.demo.diverged`).

The final loss and digests of every weight and optimizer tensor of the resumed
and reference runs must be bitwise identical. Nothing here prints: progress goes
to an optional callback and the outcome is returned as a :class:`DemoReport`.
Every wait has a deadline and every worker is killed if the scenario fails.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.store import open_store
from mouthguard.demo import (
    CopyCheck,
    DamageKind,
    DamageRecord,
    DemoConfig,
    DemoEvent,
    DemoReport,
    FinalState,
    KillRecord,
    Phase,
    ResumeRecord,
    SaveRecord,
    SaveStatus,
    SetAsideRecord,
)
from mouthguard.demo.damage import (
    check_local_store,
    corrupt_checkpoint,
    delete_rank_file,
    replica_checks,
    set_aside_copies,
    verify_run,
)
from mouthguard.demo.diverged import diverge_and_resume
from mouthguard.demo.lifecycle import inspect_lifecycle
from mouthguard.demo.process import (
    DemoError,
    Event,
    WorkerProcess,
    event_field,
    final_state,
    resume_record,
)

__all__ = ["EventCallback", "corrupt_checkpoint", "default_run_name", "run_scenario"]

EventCallback = Callable[[DemoEvent], None]
_POLL_SECONDS = 0.01


def default_run_name(now: dt.datetime | None = None) -> str:
    """``demo-<UTC timestamp>``: a fresh run for every demo on the same store."""
    return (now or dt.datetime.now(dt.UTC)).strftime("demo-%Y%m%dT%H%M%SZ")


def _dir_bytes(directory: Path) -> tuple[int, Path | None]:
    """Bytes of every regular file in ``directory`` (temp files too), and the largest file."""
    total, largest, largest_size = 0, None, -1
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    total += size
                    if size > largest_size:
                        largest, largest_size = Path(entry.path), size
    except FileNotFoundError:
        return 0, None
    return total, largest


class _Scenario:
    """One demo run; holds what the phases learn. Use :func:`run_scenario`."""

    def __init__(
        self, store_path: Path, config: DemoConfig, run: str | None, on_event: EventCallback | None
    ):
        self.config = config
        self.store = open_store(store_path)
        check_local_store(self.store)
        self.run = run or self._fresh_run_name()
        self.run_dir = Path(self.store.fast.location(f"{self.run}/"))
        # The parent only looks (and damages): replication is the workers' business.
        self.checkpointer = Checkpointer(self.store, self.run, background=False)
        self.on_event = on_event
        self.saves: list[SaveRecord] = []
        self.set_aside_by_save: dict[str, int] = {}  # directory name -> step re-saved
        self.params = 0
        self.resumed_from: ResumeRecord | None = None

    def _fresh_run_name(self) -> str:
        base = default_run_name()
        taken = {run for tier in self.store.tiers for run in tier.list_dirs("")}
        for attempt in range(1, 100):  # bounded: two demos in one second are rare
            name = base if attempt == 1 else f"{base}-{attempt}"
            if name not in taken and not Path(self.store.fast.location(f"{name}/")).exists():
                return name
        raise DemoError(f"cannot find a free run name starting with {base}")

    def _emit(self, phase: Phase, step: int, message: str = "", loss: float | None = None) -> None:
        if self.on_event is not None:
            self.on_event(DemoEvent(phase, step, self.config.steps, message, loss))

    def _worker(self, *extra: str) -> WorkerProcess:
        c = self.config
        options = {
            "--store": self.store.source,
            "--run": self.run,
            "--steps": c.steps,
            "--every": c.every,
            "--milestone-every": c.milestone_every,
            "--seed": c.seed,
            "--hidden": c.hidden,
            "--depth": c.depth,
            "--replication-timeout": c.phase_timeout,
        }
        args = [str(part) for pair in options.items() for part in pair] + list(extra)
        return WorkerProcess(args, timeout=c.phase_timeout)

    def _handle(self, phase: Phase, event: Event) -> FinalState | None:
        """Apply one worker event (any phase); return the run's final state on ``done``."""
        kind = event["event"]
        if kind == "start":
            self.params = event_field(event, "params", int)
        elif kind == "step":
            self._emit(
                phase, event_field(event, "step", int), loss=event_field(event, "loss", float)
            )
        elif kind == "resumed":
            resumed = self.resumed_from = resume_record(event)
            rejected = (
                ", ".join(f"step {r.step} on {r.tier}" for r in resumed.rejections) or "nothing"
            )
            self._emit(
                phase,
                resumed.step,
                f"load() rejected {rejected}; resumed from step {resumed.step},"
                f" read from tier {resumed.tier}",
            )
        elif kind == "saved":
            self._saved(phase, event)
        elif kind == "done":
            return final_state(event)
        elif kind == "error":
            raise DemoError(f"the {phase} worker failed: {event.get('message')}")
        return None

    def _saved(self, phase: Phase, event: Event) -> None:
        step = event_field(event, "step", int)
        aside = event.get("set_aside", [])
        if not isinstance(aside, list):
            raise DemoError(f"malformed saved event: {event!r}")
        self.set_aside_by_save.update((str(name), step) for name in aside)
        before = {s.status for s in self.saves if s.step == step}
        detail = (
            "re-saved, damaged fast copy set aside"
            if aside
            else "re-saved"
            if SaveStatus.CORRUPTED in before
            else "re-save of the killed step"
            if SaveStatus.KILLED in before
            else ""
        )
        self.saves.append(
            SaveRecord(
                step,
                event_field(event, "importance", str),
                phase,
                SaveStatus.COMMITTED,
                event_field(event, "bytes", int),
                event_field(event, "seconds", float),
                detail,
                stall_seconds=event_field(event, "stall", float),
                memcpy_seconds=event_field(event, "memcpy", float),
            )
        )

    def _drive(self, phase: Phase, worker: WorkerProcess) -> FinalState:
        """Feed a worker's events to :meth:`_handle` until it is done and has exited."""
        while (event := worker.next_event()) is not None:
            final = self._handle(phase, event)
            if final is not None:
                if worker.reap() != 0:
                    raise worker.failure(f"the {phase} worker failed after finishing")
                return final
        raise worker.failure(f"the {phase} worker exited before finishing")

    # --- phases -------------------------------------------------------------

    def train_and_kill(self) -> KillRecord:
        """Phase 1: train a fresh run and kill it in the middle of its ``kill_at_save``-th save."""
        kill_step = self.config.kill_step
        throttle = (
            "--throttle-step",
            str(kill_step),
            "--throttle-seconds",
            str(self.config.throttle_seconds),
        )
        with self._worker(*throttle, "--wait-replicated") as worker:
            while (event := worker.next_event()) is not None:
                if event["event"] == "saving" and event.get("step") == kill_step:
                    return self._kill_mid_save(
                        worker, kill_step, event_field(event, "importance", str)
                    )
                if self._handle(Phase.TRAIN, event) is not None:
                    break
            raise worker.failure(f"the first run never reached the save of step {kill_step}")

    def _kill_mid_save(self, worker: WorkerProcess, step: int, importance: str) -> KillRecord:
        # The interrupted file will be as large as the previous save's (same tensors).
        expected = self.saves[-1].nbytes if self.saves else 1
        threshold = max(1, int(expected * self.config.kill_fraction))
        self._emit(
            Phase.TRAIN, step, f"saving step {step} through a throttled tier, to kill it mid-save"
        )
        deadline = time.monotonic() + self.config.phase_timeout
        while True:
            partials = sorted(self.run_dir.glob(f"{step:012d}.partial-*"))
            if partials and sum(_dir_bytes(p)[0] for p in partials) >= threshold:
                break
            if worker.returncode() is not None or worker.saw("saved", step):
                raise worker.failure(
                    f"the save of step {step} ended before it could be interrupted"
                )
            if time.monotonic() > deadline:
                raise worker.failure(
                    f"the save of step {step} did not progress in {self.config.phase_timeout:.0f} s"
                )
            time.sleep(_POLL_SECONDS)
        pid = worker.pid
        # The whole point: no cleanup code of the worker can run. The pid cannot have
        # been reused: nobody has reaped the worker since returncode() said it runs.
        os.kill(pid, signal.SIGKILL)
        worker.reap()
        if not partials[0].is_dir():
            raise DemoError(f"the save of step {step} completed just before the kill")
        # Measured after the kill: nothing can write any more.
        on_disk, largest = _dir_bytes(partials[0])
        listed = tuple(info.step for info in self.checkpointer.list())
        self.saves.append(
            SaveRecord(step, importance, Phase.TRAIN, SaveStatus.KILLED, on_disk, 0.0)
        )
        self._emit(
            Phase.TRAIN, step, f"SIGKILL sent to pid {pid} in the middle of the save of step {step}"
        )
        return KillRecord(step, pid, partials[0], largest or partials[0], on_disk, expected, listed)

    def replicas(self, listed: tuple[int, ...]) -> tuple[CopyCheck, ...]:
        """Which verified copies the first run left (it waited for each replication)."""
        checks = replica_checks(self.checkpointer, listed)
        missing = [f"step {c.step} on {c.tier}" for c in checks if not c.ok]
        if missing:
            raise DemoError(
                "the first run left checkpoints without a verified copy on every tier"
                f" ({', '.join(missing)}): is the store's policy replicating them?"
            )
        return checks

    def damage(self, listed: tuple[int, ...]) -> tuple[DamageRecord, ...]:
        """Phase 2: corrupt every copy of the newest checkpoint, lose a file of the one before."""
        if len(listed) < 2:
            raise DemoError(
                f"need two committed checkpoints to lose one and fall back, have {list(listed)}"
            )
        lost, previous = listed[-1], listed[-2]
        records = [
            corrupt_checkpoint(self.checkpointer, lost, tier.name) for tier in self.store.tiers
        ]
        records.append(delete_rank_file(self.checkpointer, previous, self.store.fast.name))
        self.saves = [
            dataclasses.replace(s, status=SaveStatus.CORRUPTED)
            if s.step == lost and s.status is SaveStatus.COMMITTED
            else s
            for s in self.saves
        ]
        for record in records:
            what = (
                f"deleted {record.file.name}"
                if record.kind is DamageKind.DELETED
                else f"flipped {record.length} bytes of {record.tensor}"
            )
            self._emit(Phase.DAMAGE, record.step, f"{what} in step {record.step} on {record.tier}")
        return tuple(records)

    def resume(self) -> tuple[ResumeRecord, FinalState]:
        """Phase 3: resume from the newest valid checkpoint and train to the end."""
        with self._worker("--resume") as worker:
            final = self._drive(Phase.RESUME, worker)
        if self.resumed_from is None:
            raise DemoError("the resumed run never reported what it loaded")
        return self.resumed_from, final

    def set_aside(self) -> tuple[SetAsideRecord, ...]:
        """The damaged copies set aside, and who did it (a save, or background replication)."""
        records = []
        for step, tier, name in set_aside_copies(self.store, self.run):
            resaved = self.set_aside_by_save.get(name) if tier == self.store.fast.name else None
            by = f"the re-save of step {resaved}" if resaved is not None else "replication"
            records.append(SetAsideRecord(step, tier, name, by))
        return tuple(records)

    def verify(self) -> tuple[CopyCheck, ...]:
        """Phase 4: read back every committed copy of the run on every tier."""
        checks = verify_run(self.store, self.run)
        tiers = len({c.tier for c in checks})
        bad = sum(not c.ok for c in checks)
        self._emit(
            Phase.VERIFY,
            self.config.steps,
            f"{len(checks) - bad} copies on {tiers} tiers verified, {bad} invalid",
        )
        return checks

    def reference(self) -> FinalState:
        """Phase 5: the same job, uninterrupted and never checkpointed."""
        with self._worker("--no-checkpoints") as worker:
            return self._drive(Phase.REFERENCE, worker)


def run_scenario(
    store_path: Path,
    *,
    config: DemoConfig | None = None,
    run: str | None = None,
    on_event: EventCallback | None = None,
) -> DemoReport:
    """Run the whole demo on the store at ``store_path`` and report what happened.

    Args:
        store_path: the store directory (created if missing) or a ``mouthguard.toml``
            whose tiers are all local directories (at least two).
        config: sizes and timings; the defaults are the ``mouthguard demo`` scenario.
        run: the run name; default ``demo-<UTC timestamp>`` (unused in the store).
        on_event: called from this thread with progress and notable moments.

    Returns:
        The report; ``report.matches`` says whether the resumed run is bitwise
        identical to the reference.

    Raises:
        DemoError: a worker failed, hung past ``config.phase_timeout``, or the
            store is not laid out as the demo needs. No worker outlives the call.
        MouthguardError: the store could not be opened.
    """
    started = time.monotonic()
    scenario = _Scenario(store_path, config or DemoConfig(), run, on_event)
    kill = scenario.train_and_kill()
    replicas = scenario.replicas(kill.listed_after_kill)
    damage = scenario.damage(kill.listed_after_kill)
    resumed_from, resumed = scenario.resume()
    set_aside = scenario.set_aside()
    verification = scenario.verify()
    reference = scenario.reference()
    lifecycle = inspect_lifecycle(scenario.store, scenario.run)
    diverged = diverge_and_resume(scenario.store, scenario.run)
    return DemoReport(
        run=scenario.run,
        store=Path(store_path),
        run_dir=scenario.run_dir,
        tiers=tuple(t.name for t in scenario.store.tiers),
        config=scenario.config,
        params=scenario.params,
        saves=tuple(scenario.saves),
        kill=kill,
        replicas=replicas,
        damage=damage,
        resume=resumed_from,
        reference=reference,
        resumed=resumed,
        listed_final=tuple(info.step for info in scenario.checkpointer.list()),
        set_aside=set_aside,
        verification=verification,
        lifecycle=lifecycle,
        seconds=time.monotonic() - started,
        diverged=diverged,
    )

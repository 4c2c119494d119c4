"""The ``mouthguard demo`` scenario: train, kill mid-save, corrupt, resume, compare.

Phases, each a real ``python -m mouthguard.demo.worker`` process:

1. **train** - a fresh run checkpoints every ``every`` steps. Its
   ``kill_at_save``-th save goes through a throttled tier; once a fraction of
   that save is on disk the process gets ``SIGKILL``. ``Checkpointer.list()`` is
   then taken to show the killed step never became visible.
2. **corrupt** - a few bytes of the newest committed checkpoint's tensor data
   are flipped on disk.
3. **resume** - a new process loads the newest *valid* checkpoint (``load()``
   rejects the corrupted one with a ``CheckpointFallbackWarning``), restores
   the whole training state and trains to the end, checkpointing again.
4. **reference** - the same job trains uninterrupted, without checkpoints.

The final loss and digests of every weight and optimizer tensor of the resumed
and reference runs must be bitwise identical. Nothing here prints: progress goes
to an optional callback and the outcome is returned as a :class:`DemoReport`.
Every wait has a deadline and every worker is killed if the scenario fails.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import Rejection
from mouthguard.checkpoint.store import open_store
from mouthguard.demo import (
    CorruptionRecord,
    DemoConfig,
    DemoEvent,
    DemoReport,
    FinalState,
    KillRecord,
    Phase,
    ResumeRecord,
    SaveRecord,
    SaveStatus,
)
from mouthguard.demo.worker import DemoError, Event, WorkerProcess

T = TypeVar("T")


def _field(event: Event, key: str, kind: type[T]) -> T:
    """``event[key]`` checked to be a ``kind`` (ints are accepted as floats)."""
    value = event.get(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DemoError(f"malformed worker event {event.get('event')!r}: {key}={value!r}")
    return value


def _final_state(event: Event) -> FinalState:
    return FinalState(
        step=_field(event, "step", int),
        loss=_field(event, "loss", float),
        loss_hex=_field(event, "loss_hex", str),
        weights_sha256=_field(event, "weights_sha256", str),
        optimizer_sha256=_field(event, "optimizer_sha256", str),
        tensors=_field(event, "tensors", int),
    )


def _resume_record(event: Event) -> ResumeRecord:
    rejected = event.get("rejected")
    warned = event.get("warnings")
    if not isinstance(rejected, list) or not isinstance(warned, list):
        raise DemoError(f"malformed resumed event: {event!r}")
    loss = event.get("loss")
    return ResumeRecord(
        step=_field(event, "step", int),
        seconds=_field(event, "seconds", float),
        loss=float(loss) if isinstance(loss, int | float) else None,
        rejections=tuple(
            Rejection(_field(r, "step", int), _field(r, "tier", str), _field(r, "reason", str))
            for r in rejected
            if isinstance(r, dict)
        ),
        warnings=tuple(str(w) for w in warned),
    )


EventCallback = Callable[[DemoEvent], None]
_POLL_SECONDS = 0.01
_FLIPPED_BYTES = 4


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


def corrupt_checkpoint(checkpointer: Checkpointer, step: int) -> CorruptionRecord:
    """Flip a few bytes in the middle of the largest tensor of ``step``'s rank file.

    The file is located through the public ``Checkpointer.info`` and parsed as
    plain safetensors (an 8-byte little-endian header length, a JSON header,
    then the data), exactly as an outside tool would see it.

    Raises:
        DemoError: the checkpoint is not a local file with tensor data.
    """
    info = checkpointer.info(step)
    assert info is not None  # info() raises rather than return None without missing_ok
    record = info.files[0]
    path = Path(info.copies[0].location) / record.name
    with path.open("r+b") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if not 0 < header_len < record.size:
            raise DemoError(f"{path} does not look like a safetensors file")
        header = json.loads(handle.read(header_len))
        spans = {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}
        if not spans:
            raise DemoError(f"{path} holds no tensors to corrupt")
        tensor = max(spans, key=lambda k: spans[k][1] - spans[k][0])
        begin, end = spans[tensor]
        offset = 8 + header_len + (begin + end) // 2
        handle.seek(offset)
        original = handle.read(_FLIPPED_BYTES)
        handle.seek(offset)
        handle.write(bytes(b ^ 0xFF for b in original))
        handle.flush()
        # Durable like real bit rot: the resume must find the damage on disk.
        os.fsync(handle.fileno())
    return CorruptionRecord(step, path, offset, len(original), tensor)


class _Scenario:
    """One demo run; holds what the phases learn. Use :func:`run_scenario`."""

    def __init__(
        self, store_path: Path, config: DemoConfig, run: str | None, on_event: EventCallback | None
    ):
        self.config = config
        self.store = open_store(store_path)
        fast = self.store.fast
        if not (fast.capabilities.persistent and fast.capabilities.atomic_rename):
            raise DemoError(f"the demo needs a local directory as fast tier, not {fast!r}")
        self.run = run or self._fresh_run_name()
        self.run_dir = Path(fast.location(f"{self.run}/"))
        self.checkpointer = Checkpointer(self.store, self.run)
        self.on_event = on_event
        self.saves: list[SaveRecord] = []
        self.params = 0
        self.resumed_from: ResumeRecord | None = None

    def _fresh_run_name(self) -> str:
        base = default_run_name()
        taken = set(self.store.fast.list_dirs(""))
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
        }
        args = [str(part) for pair in options.items() for part in pair] + list(extra)
        return WorkerProcess(args, timeout=c.phase_timeout)

    def _handle(self, phase: Phase, event: Event) -> FinalState | None:
        """Apply one worker event (any phase); return the run's final state on ``done``."""
        kind = event["event"]
        if kind == "start":
            self.params = _field(event, "params", int)
        elif kind == "step":
            self._emit(phase, _field(event, "step", int), loss=_field(event, "loss", float))
        elif kind == "resumed":
            self.resumed_from = _resume_record(event)
            rejected = (
                ", ".join(f"step {r.step}" for r in self.resumed_from.rejections) or "nothing"
            )
            self._emit(
                phase,
                self.resumed_from.step,
                f"load() rejected {rejected}; resumed from step {self.resumed_from.step}",
            )
        elif kind == "saved":
            step = _field(event, "step", int)
            before = {s.status for s in self.saves if s.step == step}
            detail = (
                "re-save; damaged copy set aside"
                if SaveStatus.CORRUPTED in before
                else "re-save of the killed step"
                if SaveStatus.KILLED in before
                else ""
            )
            self.saves.append(
                SaveRecord(
                    step,
                    _field(event, "importance", str),
                    phase,
                    SaveStatus.COMMITTED,
                    _field(event, "bytes", int),
                    _field(event, "seconds", float),
                    detail,
                )
            )
        elif kind == "done":
            return _final_state(event)
        elif kind == "error":
            raise DemoError(f"the {phase} worker failed: {event.get('message')}")
        return None

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
        with self._worker(*throttle) as worker:
            while (event := worker.next_event()) is not None:
                if event["event"] == "saving" and event.get("step") == kill_step:
                    return self._kill_mid_save(worker, kill_step, _field(event, "importance", str))
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

    def corrupt(self, listed: tuple[int, ...]) -> CorruptionRecord:
        """Phase 2: flip bytes in the newest committed checkpoint."""
        if len(listed) < 2:
            raise DemoError(
                f"need two committed checkpoints to corrupt one and fall back, have {list(listed)}"
            )
        record = corrupt_checkpoint(self.checkpointer, listed[-1])
        self.saves = [
            dataclasses.replace(s, status=SaveStatus.CORRUPTED)
            if s.step == record.step and s.status is SaveStatus.COMMITTED
            else s
            for s in self.saves
        ]
        self._emit(
            Phase.CORRUPT,
            record.step,
            f"flipped {record.length} bytes of {record.tensor} in step {record.step}",
        )
        return record

    def resume(self) -> tuple[ResumeRecord, FinalState]:
        """Phase 3: resume from the newest valid checkpoint and train to the end."""
        with self._worker("--resume") as worker:
            final = self._drive(Phase.RESUME, worker)
        if self.resumed_from is None:
            raise DemoError("the resumed run never reported what it loaded")
        return self.resumed_from, final

    def reference(self) -> FinalState:
        """Phase 4: the same job, uninterrupted and never checkpointed."""
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
            whose fast tier is a local directory.
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
    corruption = scenario.corrupt(kill.listed_after_kill)
    resumed_from, resumed = scenario.resume()
    reference = scenario.reference()
    return DemoReport(
        run=scenario.run,
        store=Path(store_path),
        run_dir=scenario.run_dir,
        config=scenario.config,
        params=scenario.params,
        saves=tuple(scenario.saves),
        kill=kill,
        corruption=corruption,
        resume=resumed_from,
        reference=reference,
        resumed=resumed,
        listed_final=tuple(info.step for info in scenario.checkpointer.list()),
        set_aside=tuple(sorted(p.name for p in scenario.run_dir.glob("*.rejected-*"))),
        seconds=time.monotonic() - started,
    )

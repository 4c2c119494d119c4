"""A seeded discrete-event simulation of one training run with failures, per storage strategy.

The timeline (all times wall-clock seconds from the start of the run):

* Training alternates ``T`` seconds of compute (the interval) with a blocking
  stall: the whole write ``W`` when saving synchronously, only the snapshot
  ``S`` when saving asynchronously. An async checkpoint lands ``W`` seconds
  after its snapshot, while compute goes on; the next snapshot waits for it
  (one staging buffer), so ``W > T`` stalls anyway. A checkpoint protects only
  once it has landed.
* Failures of the whole job come from a Poisson process with the job MTBF, or
  from a given list of wall times. They strike at any moment, recoveries
  included.
* A failure rewinds to the newest landed checkpoint the strategy can deliver.
  Recovery costs the restart ``R``, plus reading every checkpoint tried (from
  the tier the strategy left it on), plus, when any of them had been demoted, a
  possible erasure-code rebuild wait. A checkpoint is corrupt with probability
  ``p``; the recovery reads it, fails to load it, and falls back one more
  checkpoint, whatever the strategy (none repairs a checkpoint written corrupt).
  The state a segment resumed from is known good (it was just loaded).
* Lost seconds per failure = wall time since compute last resumed from the
  restored state, plus the recovery. What is neither useful compute nor lost
  is checkpoint overhead (stalls of checkpoints that were kept), so
  ``wall = work + lost + overhead`` exactly.

Events are failures and the run's end: between two of them the checkpoint
schedule is periodic, so the simulator computes the landed checkpoints in
closed form instead of stepping through each (a 14-day run costs one step per
failure, not per save). Randomness comes from a counter-based generator keyed
by ``(seed, run, stream, index)``: every strategy and every interval sees the
same failure times, corruption draws and rebuild draws for a given run (common
random numbers), so differences between curves are the model's, not noise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from mouthguard.plan.strategies import StorageStrategy

__all__ = [
    "MAX_FAILURES_PER_RUN",
    "MAX_RUNS",
    "RunResult",
    "Scenario",
    "StrategyResult",
    "simulate",
    "simulate_run",
    "sweep_intervals",
]

#: Bounds that keep one call finite: a run that needs more failures than this
#: to finish cannot make progress (interval too long for the MTBF).
MAX_FAILURES_PER_RUN = 10_000
MAX_RUNS = 10_000

_HOUR = 3600.0
_MASK = (1 << 64) - 1
_FAIL, _CORRUPT, _REBUILD, _REBUILD_WAIT, _PEER_LOSS = 1, 2, 3, 4, 5


def _finite(name: str, value: float, *, positive: bool = False) -> None:
    ok = value > 0 if positive else value >= 0
    if not ok or math.isinf(value):  # `not ok` also rejects NaN
        raise ValueError(f"{name} must be a finite number {'>' if positive else '>='} 0: {value}")


@dataclass(frozen=True)
class Scenario:
    """What is simulated, the same for every strategy. Seconds, bytes, USD.

    Attributes:
        work_seconds: useful compute the run must complete (> 0).
        interval_seconds: compute between checkpoints, ``T`` (> 0).
        write_seconds: time to land one checkpoint on the fast tier, ``W``.
        checkpoint_bytes: bytes a recovery reads per checkpoint it tries.
        gpus: GPUs in the job (cost and GPU-hours scale with it).
        gpu_hour_usd: price of one GPU-hour.
        mtbf_seconds: job MTBF for exponential failures; exactly one of this
            and ``failure_times``.
        failure_times: failure wall times (sorted, seconds from the start).
        mode: ``"sync"`` (stall = ``W``) or ``"async"`` (stall = ``S``).
        snapshot_seconds: async snapshot stall ``S``.
        restart_seconds: ``R``, rescheduling and warm-up before the read.
        corruption_probability: chance each checkpoint is silently corrupt.
    """

    work_seconds: float
    interval_seconds: float
    write_seconds: float
    checkpoint_bytes: float
    gpus: int = 1
    gpu_hour_usd: float = 0.0
    mtbf_seconds: float | None = None
    failure_times: tuple[float, ...] | None = None
    mode: Literal["sync", "async"] = "sync"
    snapshot_seconds: float = 0.0
    restart_seconds: float = 0.0
    corruption_probability: float = 0.0

    def __post_init__(self) -> None:
        for name in ("work_seconds", "interval_seconds"):
            _finite(name, getattr(self, name), positive=True)
        for name in ("write_seconds", "checkpoint_bytes", "gpu_hour_usd", "snapshot_seconds"):
            _finite(name, getattr(self, name))
        _finite("restart_seconds", self.restart_seconds)
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"gpus must be an integer >= 1, got {self.gpus!r}")
        if self.mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {self.mode!r}")
        if not 0.0 <= self.corruption_probability <= 1.0:
            raise ValueError(
                f"corruption probability must be in [0, 1]: {self.corruption_probability}"
            )
        if (self.mtbf_seconds is None) == (self.failure_times is None):
            raise ValueError("give exactly one of mtbf_seconds or failure_times")
        if self.mtbf_seconds is not None:
            _finite("mtbf_seconds", self.mtbf_seconds, positive=True)
        for t in self.failure_times or ():
            _finite("failure time", t)
        if list(self.failure_times or ()) != sorted(self.failure_times or ()):
            raise ValueError("failure times must be in increasing order")

    @property
    def stall_seconds(self) -> float:
        """Seconds each save blocks training: the write (sync) or the snapshot (async)."""
        return self.write_seconds if self.mode == "sync" else self.snapshot_seconds

    def with_interval(self, interval_seconds: float) -> Scenario:
        """This scenario with another checkpoint interval."""
        return dataclasses.replace(self, interval_seconds=interval_seconds)


@dataclass(frozen=True)
class RunResult:
    """One simulated run. Seconds are wall-clock seconds of the whole job (not GPU-seconds)."""

    wall_seconds: float
    work_seconds: float
    lost_seconds: float
    recovery_seconds: float
    failures: int
    fallbacks: int
    checkpoints: int

    @property
    def overhead_seconds(self) -> float:
        """Checkpoint stalls of the checkpoints that were kept (the rest of the waste)."""
        return self.wall_seconds - self.work_seconds - self.lost_seconds


@dataclass(frozen=True)
class StrategyResult:
    """One strategy's results, averaged over runs.

    Attributes:
        strategy: the strategy's name.
        runs: how many runs were averaged.
        cost_usd: GPU time not spent on useful compute (lost work, recoveries
            and checkpoint stalls) times the GPU-hour price, per run.
        lost_gpu_hours: GPU-hours lost to failures (rewound work + recovery).
        overhead_gpu_hours: GPU-hours spent stalled on kept checkpoints.
        goodput: useful compute / wall time (mean work over mean wall).
        failures: failures per run; fallbacks: corrupt checkpoints a resume
            had to skip, per run.
        wall_hours: mean wall-clock length of the run, hours.
        recovery_hours: mean wall time spent recovering, hours.
    """

    strategy: str
    runs: int
    cost_usd: float
    lost_gpu_hours: float
    overhead_gpu_hours: float
    goodput: float
    failures: float
    fallbacks: float
    wall_hours: float
    recovery_hours: float

    def as_dict(self) -> dict[str, float | int]:
        """The JSON form (without ``strategy``: the name is the key it is stored under)."""
        out = dataclasses.asdict(self)
        del out["strategy"]
        return out


def _mix(x: int) -> int:
    # splitmix64's finaliser: a counter-based generator, so draw k of a stream
    # never depends on how many draws another strategy or interval consumed.
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class _Draws:
    """Uniform numbers in [0, 1) keyed by (stream, index) for one (seed, run)."""

    def __init__(self, seed: int, run: int) -> None:
        self._key = _mix(_mix(seed & _MASK) ^ run)

    def uniform(self, stream: int, index: int) -> float:
        return (_mix(self._key ^ _mix((stream << 48) ^ index)) >> 11) * 2.0**-53

    def exponential(self, stream: int, index: int, mean: float) -> float:
        return -mean * math.log1p(-self.uniform(stream, index))


def _failures(sc: Scenario, draws: _Draws) -> Iterator[float]:
    if sc.failure_times is not None:
        yield from sc.failure_times
    else:
        assert sc.mtbf_seconds is not None
        t, k = 0.0, 0
        while True:
            t += draws.exponential(_FAIL, k, sc.mtbf_seconds)
            k += 1
            yield t
    while True:
        yield math.inf


class _Run:
    """One run's mutable state; :meth:`play` advances it failure by failure to the end."""

    def __init__(self, sc: Scenario, strategy: StorageStrategy, draws: _Draws) -> None:
        self.sc, self.strategy, self.draws = sc, strategy, draws
        self.fails = _failures(sc, draws)
        sync = sc.mode == "sync"
        peers = strategy.peers
        # What a save blocks for and when it lands: the scenario's write, or with
        # peer memory the copies to the peers (the durable copy is background work).
        write = sc.write_seconds
        self.peer_loss = 0.0
        if peers is not None:
            write = peers.write_seconds(sc.checkpoint_bytes, sc.gpus)
            self.peer_loss = peers.loss_probability(sc.gpus)
        stall = write if sync else sc.snapshot_seconds
        self.cycle = sc.interval_seconds + stall
        # An async snapshot waits for the previous write (one staging buffer);
        # an async checkpoint lands W after its snapshot, a sync one at stall end.
        self.queue = 0.0 if sync else max(0.0, write - sc.interval_seconds)
        self.land = 0.0 if sync else write
        self.durable_progress = 0.0  # work at the newest durable state (peers only)
        self.start = self.progress = 0.0  # where the current segment resumed compute
        self.base_bytes = 0.0  # the initial state costs nothing to load; a restored one does
        self.first_write = 0
        self.lost = self.recovery = 0.0
        self.failures = self.fallbacks = self.checkpoints = 0

    def stall_end(self, i: int) -> float:
        """Wall time compute resumes after checkpoint ``i`` of the segment (0: its start)."""
        return self.start if i == 0 else self.start + i * self.cycle + (i - 1) * self.queue

    def landed(self, tf: float, n: int) -> int:
        """How many of the segment's ``n`` checkpoints had landed by ``tf``."""
        k = math.floor((tf - self.start - self.land + self.queue) / (self.cycle + self.queue))
        k = min(n, max(0, k))
        # The closed form can be off by one in floating point: settle it exactly.
        while k < n and self.stall_end(k + 1) + self.land <= tf:
            k += 1
        while k > 0 and self.stall_end(k) + self.land > tf:
            k -= 1
        return k

    def demoted(self, landed_at: float, now: float) -> bool:
        after = self.strategy.demote_after_seconds
        return after is not None and now - landed_at >= after

    def restore(self, tf: float, k: int) -> tuple[int, float, float]:
        """Pick the checkpoint to resume from: ``(index, total read s, its own read s)``.

        Tries landed checkpoints newest first; a corrupt one is read in full
        before the load fails. Adds the rebuild wait to the total. With peer
        memory see :meth:`restore_peers` (its index may be negative).
        """
        if self.strategy.peers is not None:
            return self.restore_peers(tf, k)
        sc, strategy = self.sc, self.strategy
        read = own = 0.0
        slow_read = False
        target = 0
        for i in range(k, 0, -1):
            slow = self.demoted(self.stall_end(i) + self.land, tf)
            own = strategy.read_seconds(sc.checkpoint_bytes, demoted=slow)
            read, slow_read = read + own, slow_read or slow
            bad = self.draws.uniform(_CORRUPT, self.first_write + i - 1) < sc.corruption_probability
            if not bad:
                target = i
                break
            self.fallbacks += 1
        if target == 0:  # the state this segment resumed from, known good; hot since then
            slow = self.demoted(self.start, tf) and self.base_bytes > 0
            own = strategy.read_seconds(self.base_bytes, demoted=slow)
            read, slow_read = read + own, slow_read or slow
        if slow_read and self.draws.uniform(_REBUILD, self.failures) < strategy.rebuild_probability:
            read += self.draws.exponential(
                _REBUILD_WAIT, self.failures, strategy.rebuild_mean_seconds
            )
        return target, read, own

    def durable(self, i: int) -> bool:
        """Whether the segment's checkpoint ``i`` also went to the durable tier.

        Saves are numbered by the work they hold (save ``n`` holds ``n T``), so a
        resumed run's saves keep their numbers and every ``k``-th is durable.
        """
        peers = self.strategy.peers
        assert peers is not None
        every = peers.durable_every
        return every > 0 and (round(self.progress / self.sc.interval_seconds) + i) % every == 0

    def restore_peers(self, tf: float, k: int) -> tuple[int, float, float]:
        """:meth:`restore` with peer memory: from the peers, else from a durable copy.

        One draw per failure says whether it took every copy of some rank (the
        peer model's loss probability). If not, the landed checkpoints are read
        from the peers, newest first, as :meth:`restore` does. If so, only the
        durable ones that had landed (``W`` after their save) count, read from
        the fast tier; when the segment has none the run rewinds to the newest
        durable state before it: the returned index is then ``-m``, ``m``
        intervals before the segment's start.
        """
        sc, peers = self.sc, self.strategy.peers
        assert peers is not None
        peer_read = peers.read_seconds(sc.checkpoint_bytes, sc.gpus)
        durable_read = sc.checkpoint_bytes / self.strategy.fast_read_bytes_per_s
        lost = self.peer_loss > 0 and self.draws.uniform(_PEER_LOSS, self.failures) < self.peer_loss
        read = own = 0.0
        for i in range(k, 0, -1):
            if lost and not (self.durable(i) and self.stall_end(i) + sc.write_seconds <= tf):
                continue
            own = durable_read if lost else peer_read
            read += own
            if self.draws.uniform(_CORRUPT, self.first_write + i - 1) >= sc.corruption_probability:
                self.note_durable(tf, i)
                return i, read, own
            self.fallbacks += 1
        if not lost:  # the state this segment resumed from, still in peer memory
            own = peer_read if self.base_bytes > 0 else 0.0
            self.note_durable(tf, 0)
            return 0, read + own, own
        back = round((self.progress - self.durable_progress) / sc.interval_seconds)
        own = durable_read if self.durable_progress > 0 else 0.0
        return -back, read + own, own

    def note_durable(self, tf: float, target: int) -> None:
        """Remember the newest durable state at or before ``target`` that had landed by ``tf``."""
        for i in range(target, 0, -1):
            if self.durable(i) and self.stall_end(i) + self.sc.write_seconds <= tf:
                self.durable_progress = self.progress + i * self.sc.interval_seconds
                return

    def count_failure(self) -> None:
        self.failures += 1
        if self.failures > MAX_FAILURES_PER_RUN:
            raise ValueError(
                f"a run needed more than {MAX_FAILURES_PER_RUN} failures and did not finish: "
                "the interval or the recovery is too long for the MTBF"
            )

    def play(self) -> RunResult:
        sc = self.sc
        next_fail = next(self.fails)
        while True:
            remaining = sc.work_seconds - self.progress
            n = max(0, math.ceil(remaining / sc.interval_seconds - 1e-9) - 1)  # saves before end
            end = self.stall_end(n) + (remaining - n * sc.interval_seconds)
            if next_fail >= end:
                return RunResult(
                    end,
                    sc.work_seconds,
                    self.lost,
                    self.recovery,
                    self.failures,
                    self.fallbacks,
                    self.checkpoints + n,
                )
            tf = next_fail
            self.count_failure()
            k = self.landed(tf, n)
            self.checkpoints += k
            target, read, own = self.restore(tf, k)
            # A negative target rewinds past the segment's start (peer memory lost).
            rewound = max(0, -target) * sc.interval_seconds
            self.lost += tf - self.stall_end(max(0, target)) + rewound
            rec = sc.restart_seconds + read
            next_fail = next(self.fails)
            while next_fail < tf + rec:  # struck again while recovering: start it over
                self.count_failure()
                self.lost += next_fail - tf
                self.recovery += next_fail - tf
                tf, rec = next_fail, sc.restart_seconds + own
                next_fail = next(self.fails)
            self.lost += rec
            self.recovery += rec
            self.progress += target * sc.interval_seconds
            if target > 0 or (target < 0 and self.progress > 0):
                self.base_bytes = sc.checkpoint_bytes
            elif target < 0:
                self.base_bytes = 0.0  # rewound to the run's start
            self.start = tf + rec
            self.first_write += k + 1  # write numbers only key the corruption draws


def simulate_run(
    sc: Scenario, strategy: StorageStrategy, *, seed: int = 0, run: int = 0
) -> RunResult:
    """Simulate one run; deterministic in ``(sc, strategy, seed, run)``.

    Raises :class:`ValueError` when the run needs more than
    :data:`MAX_FAILURES_PER_RUN` failures to finish.
    """
    return _Run(sc, strategy, _Draws(seed, run)).play()


def simulate(
    sc: Scenario, strategies: Sequence[StorageStrategy], *, seed: int = 0, runs: int = 1
) -> dict[str, StrategyResult]:
    """Average ``runs`` simulated runs per strategy (runs ``0..runs-1``, shared draws).

    Returns strategy name -> :class:`StrategyResult`, in the order given. Raises
    :class:`ValueError` for ``runs`` outside ``1..MAX_RUNS``.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
        raise ValueError(f"runs must be an integer in 1..{MAX_RUNS}, got {runs!r}")
    gpu_h = sc.gpus / _HOUR
    out: dict[str, StrategyResult] = {}
    for strategy in strategies:
        results = [simulate_run(sc, strategy, seed=seed, run=r) for r in range(runs)]
        wall = sum(r.wall_seconds for r in results) / runs
        lost = sum(r.lost_seconds for r in results) / runs
        out[strategy.name] = StrategyResult(
            strategy=strategy.name,
            runs=runs,
            cost_usd=(wall - sc.work_seconds) * gpu_h * sc.gpu_hour_usd,
            lost_gpu_hours=lost * gpu_h,
            overhead_gpu_hours=(wall - sc.work_seconds - lost) * gpu_h,
            goodput=sc.work_seconds / wall,
            failures=sum(r.failures for r in results) / runs,
            fallbacks=sum(r.fallbacks for r in results) / runs,
            wall_hours=wall / _HOUR,
            recovery_hours=sum(r.recovery_seconds for r in results) / runs / _HOUR,
        )
    return out


def sweep_intervals(
    sc: Scenario,
    strategies: Sequence[StorageStrategy],
    intervals_seconds: Sequence[float],
    *,
    seed: int = 0,
    runs: int = 1,
    on_point: Callable[[], None] | None = None,
) -> Mapping[str, list[StrategyResult]]:
    """:func:`simulate` at each interval: strategy name -> one result per interval, in order.

    ``on_point`` is called after each interval (for a progress bar).
    """
    curves: dict[str, list[StrategyResult]] = {p.name: [] for p in strategies}
    for interval in intervals_seconds:
        for name, result in simulate(
            sc.with_interval(interval), strategies, seed=seed, runs=runs
        ).items():
            curves[name].append(result)
        if on_point is not None:
            on_point()
    return curves

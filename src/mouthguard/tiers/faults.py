"""A tier decorator that injects faults: the misbehaving storage our checks must survive.

:class:`FaultyTier` wraps any tier and delegates every operation to it, except
that, at the rates of a :class:`FaultPlan` (drawn from a seeded
``random.Random``, so a run is reproducible), an operation misbehaves the way
real storage does:

``error``   any operation raises :class:`InjectedFaultError` (a ``TierError``)
            before reaching the inner tier: an I/O error, a dropped connection.
``enospc``  a ``put`` runs out of space part-way: the inner tier is handed a
            stream that raises :class:`InjectedNoSpaceError` after some bytes, so
            the inner tier's own all-or-nothing guarantee is what is exercised;
            nothing is published.
``torn``    a ``put`` is *acknowledged* but the object keeps only a prefix of the
            data, the rest zero-filled to the right size (a storage target lost
            while the file was being written: a sparse file of the right size).
``short``   a ``put`` is *acknowledged* with the full size, but only a prefix is
            stored (a lost tail, e.g. an unflushed cache).
``flip``    ``get``/``read_into`` return the data with one bit flipped (bad RAM,
            a bad cable); the stored object is intact, so a re-read succeeds.
``fsync``   a ``put`` reaches the inner tier, then :class:`InjectedDurabilityError`
            (a ``DurabilityError``) is raised, as after a failed ``fsync``. The
            object stays visible (as the page cache still shows it after a failed
            fsync), so the caller must treat the write as failed on its own.
``delay``   any operation sleeps ``delay_seconds`` first (a slow target).

``torn`` and ``short`` are silent corruption: only checksums can catch them. They
hold the put's data in memory to cut it (fault injection is for tests and chaos
runs, whose objects are small).

Every injected fault is counted by kind in :attr:`FaultyTier.injected` and logged
in :attr:`FaultyTier.events`. With ``confine_to`` set, a write (put, delete,
rename, annotation, hold) to a key outside that prefix is refused and recorded in
:attr:`FaultyTier.outside`, so a chaos run against a real store can never touch
anything but its own scratch run.

These names are also the fault-injection half of the testing kit,
:mod:`mouthguard.testing`; they live here, in the tiers, because the ``chaos``
job and command use them and tiers import nothing above them.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import random
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from typing_extensions import override

from mouthguard.clock import SYSTEM_CLOCK, Clock
from mouthguard.errors import DurabilityError, TierError
from mouthguard.tiers.base import (
    OPERATIONS,
    ObjectInfo,
    PutData,
    PutMode,
    StableChunks,
    Tier,
    iter_buffers,
)
from mouthguard.tiers.wrapper import WrappedTier

#: Fault kinds with a rate, in the order the spec string lists them.
KINDS = ("error", "enospc", "torn", "short", "flip", "fsync", "delay")

#: Tier operations that roll no dice of their own: ``delete_prefix`` runs as
#: ``list`` and one ``delete`` per key through this wrapper, so its faults come
#: from those (as a bulk delete on an object store stops part-way).
COMPOSED = frozenset({"delete_prefix"})

#: Operations a plan may be restricted to (``FaultPlan.ops``): every operation of
#: the tier interface (derived from ``Tier``, so a new one is included) except the
#: composed ones.
OPS = tuple(op for op in OPERATIONS if op not in COMPOSED)


class InjectedFaultError(TierError):
    """An I/O error injected by :class:`FaultyTier` (transient: a retry may succeed)."""


class InjectedNoSpaceError(InjectedFaultError):
    """``ENOSPC`` injected part-way through a ``put``."""


class InjectedDurabilityError(DurabilityError):
    """A failed ``fsync`` injected after the inner ``put`` returned."""


class ConfinementError(TierError):
    """A write outside the prefix a :class:`FaultyTier` is confined to was refused."""


@dataclass(frozen=True)
class FaultPlan:
    """How often each fault happens: a probability per operation, 0 to 1.

    ``FaultPlan()`` injects nothing: the wrapper is then transparent.

    Attributes:
        error: any operation fails before reaching the inner tier.
        enospc: a put runs out of space part-way (nothing published).
        torn: a put is acknowledged but its tail is zeros (right size).
        short: a put is acknowledged but its tail is missing.
        flip: a read returns one flipped bit.
        fsync: a put reaches storage, then fails as a failed fsync would.
        delay: any operation is slowed by ``delay_seconds``.
        delay_seconds: the length of one injected delay.
        ops: only these operations misbehave (empty: all of them); e.g.
            ``frozenset({"read_into"})`` flips bits in rank-file reads only.
        keys: only keys (or prefixes) containing this string misbehave (empty:
            all); e.g. ``"rank-"`` tears rank files but never a manifest.

    Raises:
        ValueError: a rate is not in [0, 1], the delay is negative, or an
            operation is unknown.
    """

    error: float = 0.0
    enospc: float = 0.0
    torn: float = 0.0
    short: float = 0.0
    flip: float = 0.0
    fsync: float = 0.0
    delay: float = 0.0
    delay_seconds: float = 0.001
    ops: frozenset[str] = frozenset()
    keys: str = ""

    def __post_init__(self) -> None:
        for kind in KINDS:
            rate = getattr(self, kind)
            if not (isinstance(rate, int | float) and math.isfinite(rate) and 0 <= rate <= 1):
                raise ValueError(f"fault rate {kind}={rate!r} must be a number in [0, 1]")
        if not (math.isfinite(self.delay_seconds) and self.delay_seconds >= 0):
            raise ValueError(f"delay seconds must be >= 0, got {self.delay_seconds!r}")
        object.__setattr__(self, "ops", frozenset(self.ops))
        unknown = sorted(self.ops - set(OPS))
        if unknown:
            raise ValueError(f"unknown operations {unknown}: choose from {', '.join(OPS)}")

    def applies_to(self, op: str, key: str) -> bool:
        """Whether faults are injected into ``op`` on ``key``."""
        return (not self.ops or op in self.ops) and self.keys in key

    @classmethod
    def parse(cls, spec: str) -> FaultPlan:
        """Parse ``"error=0.05,enospc=0.02,flip=0.01,torn=0.01,delay=0.1:0.005"``.

        Each item is ``kind=rate``; ``delay`` also takes ``rate:seconds``. Kinds
        not named have rate 0; an empty spec is ``FaultPlan()``. ``ops=get+put``
        restricts the faults to those operations, ``keys=rank-`` to keys
        containing ``rank-``.

        Raises:
            ValueError: an unknown kind, a repeated kind, or a bad number.
        """
        values: dict[str, float] = {}
        ops: frozenset[str] = frozenset()
        keys = ""
        for raw in spec.split(","):
            item = raw.strip()
            if not item:
                continue
            kind, sep, value = (part.strip() for part in item.partition("="))
            if kind == "ops" and sep:
                ops = frozenset(op.strip() for op in value.split("+") if op.strip())
                continue
            if kind == "keys" and sep:
                keys = value
                continue
            if not sep or kind not in KINDS:
                raise ValueError(
                    f"bad fault {item!r}: expected kind=rate with kind one of {', '.join(KINDS)}"
                )
            if kind in values:
                raise ValueError(f"fault {kind!r} is given twice")
            rate, colon, seconds = value.partition(":")
            if colon and kind != "delay":
                raise ValueError(f"only delay takes rate:seconds, got {item!r}")
            try:
                values[kind] = float(rate)
                if colon:
                    values["delay_seconds"] = float(seconds)
            except ValueError:
                raise ValueError(f"bad number in fault {item!r}") from None
        return cls(**values, ops=ops, keys=keys)

    def spec(self) -> str:
        """The plan as a string :meth:`parse` reads back (only the non-zero rates)."""
        items = [f"{kind}={getattr(self, kind):g}" for kind in KINDS if getattr(self, kind)]
        if self.delay:
            items[-1] += f":{self.delay_seconds:g}"
        if self.ops:
            items.append("ops=" + "+".join(op for op in OPS if op in self.ops))
        if self.keys:
            items.append(f"keys={self.keys}")
        return ",".join(items)

    @property
    def silent(self) -> bool:
        """Whether the plan includes acknowledged corruption (torn or short writes)."""
        return bool(self.torn or self.short)


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault: its kind, the operation and the key (or prefix) it hit."""

    kind: str
    op: str
    key: str


class FaultyTier(WrappedTier):
    """Wraps ``inner`` and injects the faults of ``plan`` (see the module docstring).

    The wrapper has the inner tier's name, domain, capabilities and locations
    (faults change behaviour, not declarations): :class:`WrappedTier` forwards
    those, and this class overrides only the operations a fault can hit. Safe to
    share between threads (one lock guards the generator and counters).

    Args:
        inner: the tier that stores the bytes.
        plan: the fault rates.
        seed: seed of the fault generator: the same seed and the same sequence
            of operations inject the same faults.
        confine_to: if set, writes to keys outside this prefix are refused
            (:class:`ConfinementError`) and recorded in :attr:`outside`.
        clock: what injected delays sleep on (the real clock by default).
        exempt: keys under this prefix get no faults and pass the confinement
            (chaos exempts the store's audit trail: its records are the truth
            about the acts of the run, not part of the experiment).

    Attributes:
        injected: how many faults of each kind were injected.
        events: every injected fault, in order.
        outside: keys of refused writes outside ``confine_to``.
        enabled: set False to pause injection (the wrapper is then transparent).
    """

    def __init__(
        self,
        inner: Tier,
        plan: FaultPlan,
        *,
        seed: int = 0,
        confine_to: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        exempt: str | None = None,
    ) -> None:
        super().__init__(inner)
        self.exempt = exempt
        self.plan = plan
        self.clock = clock
        self.confine_to = confine_to
        self.injected: Counter[str] = Counter()
        self.events: builtins.list[FaultEvent] = []
        self.outside: builtins.list[str] = []
        self.enabled = True
        self._rng = random.Random(seed)  # noqa: S311 - reproducible faults, not secrets
        self._lock = threading.Lock()

    # --- the dice ------------------------------------------------------------

    def _exempt(self, key: str) -> bool:
        return self.exempt is not None and key.startswith(self.exempt)

    def _hit(self, rate: float, op: str, key: str) -> bool:
        if not self.enabled or rate <= 0 or not self.plan.applies_to(op, key):
            return False
        if self._exempt(key):
            return False
        with self._lock:
            return self._rng.random() < rate

    def _randrange(self, stop: int) -> int:
        with self._lock:
            return self._rng.randrange(stop)

    def _record(self, kind: str, op: str, key: str) -> None:
        with self._lock:
            self.injected[kind] += 1
            self.events.append(FaultEvent(kind, op, key))

    def _before(self, op: str, key: str) -> None:
        """Delay and error injection common to every operation."""
        if self._hit(self.plan.delay, op, key):
            self._record("delay", op, key)
            self.clock.sleep(self.plan.delay_seconds)
        if self._hit(self.plan.error, op, key):
            self._record("error", op, key)
            raise InjectedFaultError(f"injected I/O error in {op} {key!r} on tier {self.name!r}")

    def _confine(self, op: str, *keys: str) -> None:
        if self.confine_to is None:
            return
        for key in keys:
            if not key.startswith(self.confine_to) and not self._exempt(key):
                with self._lock:
                    self.outside.append(key)
                raise ConfinementError(
                    f"{op} {key!r} on tier {self.name!r} refused: outside {self.confine_to!r}"
                )

    # --- writes: every fault kind can hit a put --------------------------------

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Store through the inner tier, maybe failing, tearing or cutting the write."""
        self._confine("put", key)
        self._before("put", key)
        if self._hit(self.plan.enospc, "put", key):
            return self.inner.put(key, self._out_of_space(key, data), mode=mode)
        torn = self._hit(self.plan.torn, "put", key)
        short = not torn and self._hit(self.plan.short, "put", key)
        if torn or short:
            return self._silently_corrupt(key, data, mode, "torn" if torn else "short")
        info = self.inner.put(key, data, mode=mode)
        if self._hit(self.plan.fsync, "put", key):
            self._record("fsync", "put", key)
            raise InjectedDurabilityError(
                f"injected fsync failure for {key!r} on tier {self.name!r}: the write is lost"
            )
        return info

    def _out_of_space(self, key: str, data: PutData) -> PutData:
        budget = self._randrange(1 << 16)

        def stream() -> Iterator[memoryview]:
            sent = 0
            for chunk in iter_buffers(data):
                if sent + chunk.nbytes > budget:
                    yield chunk[: budget - sent]
                    break
                sent += chunk.nbytes
                yield chunk
            # Out of space at the cut, or at the final flush of a smaller object.
            self._record("enospc", "put", key)
            raise InjectedNoSpaceError(
                f"injected [Errno 28] No space left on device writing {key!r} on tier {self.name!r}"
            )

        # Slices of stable chunks are stable: keep the inner tier's zero-copy path.
        return StableChunks(stream()) if isinstance(data, StableChunks) else stream()

    def _silently_corrupt(self, key: str, data: PutData, mode: PutMode, kind: str) -> ObjectInfo:
        whole = b"".join(bytes(chunk) for chunk in iter_buffers(data))
        if not whole:
            return self.inner.put(key, whole, mode=mode)  # nothing to lose
        cut = self._randrange(len(whole))
        stored = whole[:cut] + bytes(len(whole) - cut) if kind == "torn" else whole[:cut]
        info = self.inner.put(key, stored, mode=mode)
        if stored != whole:  # a tail that was zeros already tears nothing
            self._record(kind, "put", key)
        # Acknowledged with the size the caller sent: the storage does not know.
        return dataclasses.replace(info, size=len(whole))

    # --- reads: errors, delays and flipped bits ----------------------------------

    def _flip_at(self, op: str, key: str, nbytes: int) -> tuple[int, int] | None:
        """Where to flip a bit of a read of ``nbytes`` (byte index, bit mask), if at all."""
        if not nbytes or not self._hit(self.plan.flip, op, key):
            return None
        with self._lock:
            return self._rng.randrange(nbytes), 1 << self._rng.randrange(8)

    @override
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Read through the inner tier; maybe return one flipped bit."""
        self._before("get", key)
        data = self.inner.get(key, start, end)
        flip = self._flip_at("get", key, len(data))
        if flip is None:
            return data
        buf = bytearray(data)
        buf[flip[0]] ^= flip[1]
        self._record("flip", "get", key)
        return bytes(buf)

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Read through the inner tier's zero-copy path; maybe flip one bit of ``out``."""
        self._before("read_into", key)
        self.inner.read_into(key, offset, out)
        flip = self._flip_at("read_into", key, out.nbytes)
        if flip is not None:
            raw = out.cast("B") if out.format != "B" or out.ndim != 1 else out
            raw[flip[0]] ^= flip[1]
            self._record("flip", "read_into", key)

    # --- every other operation: an error or a delay first, then forwarded --------
    # (writes among them are confined first: a refused write never reaches the dice)

    @override
    def head(self, key: str) -> ObjectInfo:
        self._before("head", key)
        return super().head(key)

    @override
    def exists(self, key: str) -> bool:
        self._before("exists", key)
        return super().exists(key)

    @override
    def list(self, prefix: str = "") -> Iterator[str]:
        # An injected error is raised at the call, not at the first item.
        self._before("list", prefix)
        return super().list(prefix)

    @override
    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._before("list_info", prefix)
        return super().list_info(prefix)

    # ``builtins.list``: in the class body ``list`` names the method above.
    @override
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        self._before("list_dirs", prefix)
        return super().list_dirs(prefix)

    @override
    def delete(self, key: str) -> bool:
        self._confine("delete", key)
        self._before("delete", key)
        return super().delete(key)

    @override
    def delete_prefix(self, prefix: str) -> int:
        # Not forwarded: one ``delete`` per key through this wrapper, so a fault can
        # stop a bulk delete part-way, as on an object store.
        return Tier.delete_prefix(self, prefix)

    @override
    def rename_prefix(self, src: str, dst: str) -> None:
        # An injected error leaves both prefixes unchanged.
        self._confine("rename_prefix", src, dst)
        self._before("rename_prefix", src)
        super().rename_prefix(src, dst)

    @override
    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        self._confine("annotate", key)
        self._before("annotate", key)
        return super().annotate(key, tags)

    @override
    def set_legal_hold(self, key: str, on: bool) -> bool:
        self._confine("set_legal_hold", key)
        self._before("set_legal_hold", key)
        return super().set_legal_hold(key, on)

    @override
    def annotations(self, key: str) -> dict[str, str]:
        self._before("annotations", key)
        return super().annotations(key)

    @override
    def collect_incomplete(self, prefix: str, older_than_seconds: float) -> int:
        self._confine("collect_incomplete", prefix)
        self._before("collect_incomplete", prefix)
        return super().collect_incomplete(prefix, older_than_seconds)

    @override
    def __repr__(self) -> str:
        return f"FaultyTier({self.inner!r}, plan={self.plan.spec() or 'none'!r})"


def unwrap(tier: Tier) -> Tier:
    """The innermost tier below any stack of :class:`FaultyTier` wrappers."""
    while isinstance(tier, FaultyTier):
        tier = tier.inner
    return tier


__all__ = [
    "COMPOSED",
    "KINDS",
    "OPS",
    "ConfinementError",
    "FaultEvent",
    "FaultPlan",
    "FaultyTier",
    "InjectedDurabilityError",
    "InjectedFaultError",
    "InjectedNoSpaceError",
    "unwrap",
]

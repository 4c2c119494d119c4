"""Tier wrappers and helpers for the random-history test (tests/jobs/test_histories.py)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping
from enum import Enum

import torch

from mouthguard.errors import TierError
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier, TierCapabilities, iter_buffers
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.posix import TMP_PREFIX
from mouthguard.tiers.throttle import ThrottledTier

RUN = "r"


class UnsyncedLocalTier(LocalTier):
    """A real local directory tier that skips ``fsync`` but still declares itself durable.

    The policy counts replicas only on durable tiers, so the tiers of the history
    test must say they are durable; the fsyncs themselves would only make a
    thousand small puts per history slow on a CI disk and prove nothing here
    (no power is cut). Every other code path is the real one.
    """

    def __init__(self, root: str, name: str, domain: str) -> None:
        super().__init__(root, name, domain, durable=False)

    @property
    def capabilities(self) -> TierCapabilities:
        """The local tier's capabilities, durable."""
        return dataclasses.replace(super().capabilities, durable=True)


class SimulatedCrash(BaseException):
    """The process died: nothing after it runs (BaseException, so no handler swallows it)."""


class CrashKind(Enum):
    """How an injected failure behaves."""

    #: the put raises a TierError (the tier failed; the caller cleans up)
    ERROR = "error"
    #: the process is killed: the put leaves its temporary file behind and every
    #: later write through the wrapper dies too (no cleanup runs)
    KILL = "kill"


class CrashingTier(ThrottledTier):
    """Wraps a tier; put number ``put_index`` (0-based, counted from creation) fails
    after ``after_bytes`` bytes reached the inner tier.

    Reads and listings pass through unchanged.
    """

    def __init__(self, inner: Tier, *, put_index: int, after_bytes: int, kind: CrashKind) -> None:
        super().__init__(inner, write_bytes_per_second=1e15)
        self.put_index = put_index
        self.after_bytes = after_bytes
        self.kind = kind
        self.puts = 0
        self.fired = False
        self.dead = False

    def _check_alive(self) -> None:
        if self.dead:
            raise SimulatedCrash("the process is dead")

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Delegate, failing the chosen put part-way through its bytes."""
        self._check_alive()
        index = self.puts
        self.puts += 1
        if index != self.put_index:
            return self.inner.put(key, data, mode=mode)
        return self.inner.put(key, self._failing(key, data), mode=mode)

    def _failing(self, key: str, data: PutData) -> Iterator[memoryview]:
        sent = bytearray()
        for chunk in iter_buffers(data):
            room = self.after_bytes - len(sent)
            if chunk.nbytes > room:
                if room > 0:
                    sent += chunk[:room]
                    yield chunk[:room]
                self._fire(key, bytes(sent))
            sent += chunk
            yield chunk
        if len(sent) == self.after_bytes:  # the put was exactly that long: fail at its end
            self._fire(key, bytes(sent))

    def _fire(self, key: str, written: bytes) -> None:
        self.fired = True
        if self.kind is CrashKind.ERROR:
            raise TierError(f"injected: tier {self.name!r} failed after {len(written)} bytes")
        self.dead = True
        if isinstance(self.inner, LocalTier):
            # A killed writer leaves its temporary file; the real put would have removed
            # it on the way out of the exception, so put it back as a kill leaves it.
            parent = self.inner.path_of(key).parent
            parent.mkdir(parents=True, exist_ok=True)
            (parent / f"{TMP_PREFIX}{uuid.uuid4().hex}").write_bytes(written)
        raise SimulatedCrash(f"killed while writing {key!r} after {len(written)} bytes")

    def delete(self, key: str) -> bool:
        """Delegate unless the process is dead."""
        self._check_alive()
        return self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        """Delegate unless the process is dead."""
        self._check_alive()
        return self.inner.delete_prefix(prefix)

    def rename_prefix(self, src: str, dst: str) -> None:
        """Delegate unless the process is dead."""
        self._check_alive()
        self.inner.rename_prefix(src, dst)

    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        """Delegate unless the process is dead."""
        self._check_alive()
        return self.inner.annotate(key, tags)


def expected_state(step: int) -> dict[str, object]:
    """The training state saved as ``step``: every byte derives from the step."""
    base = torch.arange(8, dtype=torch.float32) + float(step)
    return {
        "model": {"w": base * 0.5, "b": torch.tensor([step % 251], dtype=torch.uint8)},
        "step": step,
        "tag": f"step-{step}",
    }

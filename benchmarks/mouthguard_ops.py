"""mouthguard's operations: sync save (with and without checksums), loads, async save,
and the save and load through client-side AES-256-GCM encryption."""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import time
from contextlib import closing
from pathlib import Path

import torch

import mouthguard
from benchmarks.harness import FIRST_NOTE, Harness, Result
from benchmarks.state import check_equal
from mouthguard.checkpoint import catalog
from mouthguard.format.checksum import checksums_disabled
from mouthguard.tiers.base import Tier
from mouthguard.tiers.encrypted import EncryptedTier
from mouthguard.tiers.local import LocalTier

RUN = "bench"
#: What a hasher inside ``checksums_disabled()`` records instead of a digest.
PLACEHOLDER = "xxh3-128:" + "0" * 32

SAVE = "mouthguard save"
SAVE_UNVERIFIED = "mouthguard save, checksums disabled"
SAVE_SHA256 = "mouthguard save with_sha256=True"
LOAD = "mouthguard load (verified)"
LOAD_INTO = "mouthguard load(into=...) (verified)"
ASYNC_STALL = "mouthguard save_async — stall (until it returns)"
ASYNC_FIRST_STALL = "mouthguard save_async — first-save stall"
ASYNC_TOTAL = "mouthguard save_async — total (until result())"
ENC_SAVE = "AES-GCM encrypted save (EncryptedTier over local)"
ENC_LOAD = "AES-GCM encrypted load (EncryptedTier over local)"
#: A fixed benchmark key (the bytes' secrecy is irrelevant here, only the work).
BENCH_KEY = bytes(range(32))


def checkpointer(
    d: Path, *, with_sha256: bool = False, encrypted: bool = False
) -> mouthguard.Checkpointer:
    """One local tier and no background replication: the save alone is measured.

    ``encrypted``: the tier wrapped in ``EncryptedTier`` (AES-256-GCM, 1 MiB chunks).
    No manifest key either way (``signing_key=b""`` would not do: keys need 16 bytes),
    so a ``MOUTHGUARD_MANIFEST_KEY`` in the environment is ignored.
    """
    tier: Tier = LocalTier(d, name="fast", domain="a")
    if encrypted:
        tier = EncryptedTier(tier, BENCH_KEY, key_id="bench")
    ckpt = mouthguard.Checkpointer(
        mouthguard.Store([tier]), RUN, with_sha256=with_sha256, background=False
    )
    ckpt.manifest_keys = None
    ckpt.with_sha256 = with_sha256
    return ckpt


def step_path(d: Path, step: int) -> Path:
    return d / catalog.checkpoint_prefix(RUN, step)


def has_save_async() -> bool:
    return callable(getattr(mouthguard.Checkpointer, "save_async", None))


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


class Mouthguard:
    def __init__(self, h: Harness, template: dict[str, torch.Tensor]) -> None:
        self.h = h
        self.state = h.state
        self.template = template

    # --- sync save, checksum cost, loads ---

    def save(self, d: Path) -> None:
        with closing(checkpointer(d)) as ckpt:
            ckpt.save(1, self.state)

    def save_unverified(self, d: Path) -> None:
        with checksums_disabled(), closing(checkpointer(d)) as ckpt:
            ckpt.save(1, self.state)

    def save_sha256(self, d: Path) -> None:
        with closing(checkpointer(d, with_sha256=True)) as ckpt:
            ckpt.save(1, self.state)

    def load(self, d: Path) -> object:
        with closing(checkpointer(d)) as ckpt:
            return ckpt.load().state

    def load_into(self, d: Path) -> object:
        with closing(checkpointer(d)) as ckpt:
            return ckpt.load(into=self.template).state

    def sync(self) -> None:
        """The durable save with and without checksums (interleaved), then the loads."""
        h = self.h
        h.ticker.stage("mouthguard save, with and without checksums")
        dirs = h.saves(
            [
                (SAVE, "committed and durable on return, xxh3-128 checksums"),
                (SAVE_UNVERIFIED, "benchmark only: `checksums_disabled()`"),
            ],
            [self.save, self.save_unverified],
        )
        manifest = step_path(dirs[SAVE_UNVERIFIED], 1) / "manifest.json"
        if PLACEHOLDER not in manifest.read_text():
            # The save no longer hashes through StreamHasher: the row would be a lie.
            row = next(r for r in h.results if r.name == SAVE_UNVERIFIED)
            row.unavailable = "checksums_disabled() had no effect on this save path"
        shutil.rmtree(dirs[SAVE_UNVERIFIED])
        h.ticker.stage("mouthguard load")
        h.loads(dirs[SAVE], [(LOAD, self.load), (LOAD_INTO, self.load_into)], remove=True)
        h.ticker.stage("mouthguard with_sha256")
        h.pair(SAVE_SHA256, self.save_sha256, [], save_note="xxh3-128 and sha256")

    # --- client-side encryption ---

    def save_encrypted(self, d: Path) -> None:
        with closing(checkpointer(d, encrypted=True)) as ckpt:
            ckpt.save(1, self.state)

    def load_encrypted(self, d: Path) -> object:
        with closing(checkpointer(d, encrypted=True)) as ckpt:
            return ckpt.load().state

    def encrypted(self) -> None:
        """Save and cold load through ``EncryptedTier`` over the same local tier.

        Encryption costs what AES-256-GCM costs on this CPU plus one more pass over
        the bytes; the tier loses O_DIRECT straight from the staging buffer (it hands
        the local tier ciphertext chunks) and its commit takes the object-store path.
        """
        h = self.h
        h.ticker.stage("mouthguard AES-GCM encrypted save/load")
        note = "AES-256-GCM, 1 MiB chunks, xxh3-128 on the plaintext; local tier below"
        h.pair(ENC_SAVE, self.save_encrypted, [(ENC_LOAD, self.load_encrypted)], save_note=note)

    # --- async save ---

    def async_save(self) -> None:
        """``save_async``: stall until it returns, total until ``result()``.

        One Checkpointer for every repeat. Its first save allocates the staging
        buffer, which later saves reuse, as in a training loop: that first stall is
        its own row (one measurement per run), the repeats time the later saves.
        Each repeat is a new step; the previous step's directory is removed.
        """
        h = self.h
        h.ticker.stage("mouthguard save_async")
        if not has_save_async():
            reason = "`Checkpointer.save_async` does not exist yet"
            for _ in range(h.repeats):
                h.ticker.tick()
            h.add(Result(ASYNC_FIRST_STALL, "first stall", unavailable=reason))
            h.add(Result(ASYNC_STALL, "stall", unavailable=reason))
            h.add(Result(ASYNC_TOTAL, "async", unavailable=reason))
            return
        d = h.fresh("mg-async")
        first_stall = Result(ASYNC_FIRST_STALL, "first stall", note=FIRST_NOTE)
        stall = Result(ASYNC_STALL, "stall")
        total = Result(ASYNC_TOTAL, "async")
        ckpt = checkpointer(d)
        reported: list[float] = []
        try:
            first, _, _ = self._async_once(ckpt, 0)
            first_stall.times.append(first)
            for r in range(h.repeats):
                s, t, rep = self._async_once(ckpt, r + 1)
                stall.times.append(s)
                total.times.append(t)
                reported.append(rep)
                shutil.rmtree(step_path(d, r), ignore_errors=True)
                h.ticker.tick()
            # Correctness spot-check (untimed): the last async save holds the state.
            check_equal(self.state, ckpt.load(h.repeats).state, "save_async")
        except Exception as exc:  # noqa: BLE001 - an API being built: report, do not crash
            reason = describe_error(exc)
            first_stall = Result(ASYNC_FIRST_STALL, "first stall", unavailable=reason)
            stall = Result(ASYNC_STALL, "stall", unavailable=reason)
            total = Result(ASYNC_TOTAL, "async", unavailable=reason)
        else:
            first_stall.note += " (allocating the staging buffer)"
            stall.note = f"`stall_seconds` says {statistics.median(reported):.3f} s"
        finally:
            ckpt.close()
            shutil.rmtree(d, ignore_errors=True)
        h.add(first_stall)
        h.add(stall)
        h.add(total)

    def _async_once(self, ckpt: mouthguard.Checkpointer, step: int) -> tuple[float, float, float]:
        os.sync()
        gc.collect()
        t0 = time.perf_counter()
        handle = ckpt.save_async(step, self.state, importance="routine")
        t1 = time.perf_counter()
        handle.result()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t0, float(handle.stall_seconds)

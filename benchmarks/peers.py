"""The peers: memcpy, torch.save, safetensors, DCP (sync and async), raw O_DIRECT I/O."""

from __future__ import annotations

import functools
import gc
import os
import shutil
import time
from concurrent.futures import Future
from pathlib import Path

import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp

from benchmarks.harness import FIRST_NOTE, Harness, Result, fsync_path
from benchmarks.rawio import RawIO

DCP_THREADS = 4
DCP_FIRST_STALL = "DCP async_save — first-save stall"


class Peers:
    """Every peer's save and load on one state; ``template`` receives in-place loads."""

    def __init__(self, h: Harness, template: dict[str, torch.Tensor]) -> None:
        self.h = h
        self.state = h.state
        self.template = template
        self.direct_ok: bool | None = None

    # --- memory copies: the references for an async save's stall ---

    def memcpy(self) -> None:
        """``copy_`` into a preallocated, already touched copy (what a reused staging
        buffer costs), and ``clone()`` (which also pays for fresh pages)."""
        h = self.h
        h.ticker.stage("memcpy")
        dst = {k: torch.empty_like(v) for k, v in self.state.items()}
        self._copy_into(dst)  # fault the pages in once, untimed

        h.repeat(
            "memcpy into a preallocated copy (copy_)",
            "copy",
            functools.partial(self._copy_into, dst),
            note="the stall reference",
        )
        del dst
        gc.collect()
        h.repeat(
            "clone every tensor (allocates)",
            "copy",
            lambda: {k: v.clone() for k, v in self.state.items()},
        )

    def _copy_into(self, dst: dict[str, torch.Tensor]) -> None:
        for k, v in self.state.items():
            dst[k].copy_(v)

    # --- the disk's limit ---

    def raw(self) -> None:
        h, raw = self.h, RawIO(self.state)
        h.ticker.stage("raw O_DIRECT write/read")
        h.pair("raw write + fsync", raw.write, [("raw read", raw.read)])
        self.direct_ok = raw.direct_ok
        for r in h.results:
            if r.name in ("raw write + fsync", "raw read"):
                r.name = f"{r.name} ({raw.describe()})"

    # --- single-file formats ---

    def torch_pair(self) -> None:
        self.h.ticker.stage("torch.save/load")
        self.h.pair("torch.save + fsync", self.torch_save, [("torch.load", self.torch_load)])

    def torch_save(self, d: Path) -> None:
        with open(d / "state.pt", "wb") as f:
            torch.save(self.state, f)
            f.flush()
            os.fsync(f.fileno())

    def torch_load(self, d: Path) -> object:
        return torch.load(d / "state.pt", weights_only=True)

    def safetensors_pair(self) -> None:
        self.h.ticker.stage("safetensors")
        self.h.pair(
            "safetensors save_file + fsync",
            self.st_save,
            [("safetensors load_file", self.st_load)],
        )

    def st_save(self, d: Path) -> None:
        path = d / "state.safetensors"
        safetensors.torch.save_file(self.state, str(path))
        fsync_path(path)

    def st_load(self, d: Path) -> object:
        return safetensors.torch.load_file(str(d / "state.safetensors"))

    # --- torch.distributed.checkpoint ---

    def _writer(self, d: Path) -> dcp.FileSystemWriter:
        return dcp.FileSystemWriter(str(d), thread_count=DCP_THREADS, sync_files=True)

    def dcp_pair(self) -> None:
        self.h.ticker.stage("DCP save/load")
        self.h.pair(
            f"DCP save (FileSystemWriter, {DCP_THREADS} threads)",
            self.dcp_save,
            [("DCP load (into preallocated)", self.dcp_load)],
        )

    def dcp_save(self, d: Path) -> None:
        dcp.save(self.state, storage_writer=self._writer(d))

    def dcp_load(self, d: Path) -> None:
        dcp.load(self.template, storage_reader=dcp.FileSystemReader(str(d)))

    def dcp_async(self) -> None:
        """``async_save``: the stall is until it returns, the total until its future's result.

        The first save (thread pool, planner caches) is its own row, one measurement
        per run; the repeats then time the saves a training loop makes after it.
        """
        h = self.h
        h.ticker.stage("DCP async_save")
        first, _ = self._dcp_async_once(h.fresh("dcp-async-warmup"))
        shutil.rmtree(h.root / "dcp-async-warmup")
        h.add(Result(DCP_FIRST_STALL, "first stall", times=[first], note=FIRST_NOTE))
        stall = Result("DCP async_save — stall (until it returns)", "stall")
        total = Result("DCP async_save — total (until the future's result)", "async")
        for r in range(h.repeats):
            d = h.fresh(f"dcp-async-{r}")
            s, t = self._dcp_async_once(d)
            stall.times.append(s)
            total.times.append(t)
            shutil.rmtree(d)
            h.ticker.tick()
        h.add(stall)
        h.add(total)

    def _dcp_async_once(self, d: Path) -> tuple[float, float]:
        os.sync()
        gc.collect()
        t0 = time.perf_counter()
        response = dcp.async_save(self.state, storage_writer=self._writer(d))
        t1 = time.perf_counter()
        # A Future, or (with some stagers) an AsyncSaveResponse holding one.
        future = response if isinstance(response, Future) else response.upload_completion
        future.result()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t0

"""One measurement in a fresh process: ``python -m benchmarks.data.child read CELL_JSON``.

Every reader runs in its own process, so that one library's imports, threads,
shared memory and caches never meet another's, and so that its DataLoader
workers (and only they) are what the open counter follows. The parent prepares
the cold state (page cache dropped, the loader's cache emptied) before starting
it. The child builds the loader (timed as *setup*), then iterates it for a cold
epoch and a warm one (the second epoch of the same loader: page cache and the
loader's own cache populated), and prints its :class:`~benchmarks.data.config.CellResult`
as the last line of stdout, after :data:`MARK`.

``write`` and ``upload`` write a reader's copy of the dataset, ``delete`` removes
a copy from the bucket (see :mod:`benchmarks.data.writers`); each prints the
seconds it took.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

from benchmarks.data import cpu, s3
from benchmarks.data.config import Cell, CellResult, Epoch, Site
from benchmarks.data.opens import OpenCounter

MARK = "@@result "
STATES = ("cold", "warm")


def run_epoch(cell: Cell, loader: object, state: str) -> Epoch:
    """Iterate ``loader`` once; stall mode sleeps ``cell.step_s`` after every batch."""
    log = Path(cell.site.log) if cell.site is not None else None
    offset = s3.log_size(log) if log is not None else 0
    counter = OpenCounter(Path(cell.root)) if cell.count_opens else None
    stall = cell.mode == "stall"
    keys: list[str] = []
    waits: list[float] = []
    nbytes = 0
    gc.collect()
    load_before = os.getloadavg()[0]
    server_dir = str(Path(cell.site.log).parents[1]) if cell.site is not None else None
    with counter if counter is not None else contextlib.nullcontext():
        cpu_before = cpu.mark(server_dir)
        start = time.perf_counter()
        batches = iter(loader)  # type: ignore[call-overload]
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            if stall:
                waits.append(time.perf_counter() - asked)
            names, tensor = batch
            keys.extend(names)
            nbytes += tensor.numel()
            del batch, tensor
            if stall:
                time.sleep(cell.step_s)
        seconds = time.perf_counter() - start
        used = cpu.spent(cpu_before, cpu.mark(server_dir))
    epoch = Epoch(
        state=state,
        seconds=seconds,
        samples=len(keys),
        unique=len(set(keys)),
        payload_bytes=nbytes,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        waits=waits,
        cpu_loader_s=used.loader,
        cpu_server_s=used.server,
        cpu_machine_s=used.machine,
        cpus=os.cpu_count(),
    )
    if counter is not None:
        epoch.opens_all, epoch.opens_data = counter.all, counter.data
    if log is not None:
        requests = s3.requests_since(log, offset)
        epoch.gets, epoch.requests = requests["GET"], sum(requests.values())
    return epoch


def run_cell(cell: Cell) -> CellResult:
    """Build ``cell``'s loader and run its epochs; a failure becomes ``unavailable``."""
    # Only a read needs the readers (and torch with them, about 2 s to import): the
    # write, upload and delete children start without them.
    from benchmarks.data import readers  # noqa: PLC0415

    result = CellResult(cell.reader, cell.source, cell.workers, cell.mode)
    try:
        start = time.perf_counter()
        loader = readers.build(cell)
        result.setup_s = time.perf_counter() - start
        for state in STATES[: cell.epochs]:
            result.epochs.append(run_epoch(cell, loader, state))
    except Exception as exc:  # noqa: BLE001 - any failure of a peer is a row saying why
        traceback.print_exc()
        result.unavailable = f"{type(exc).__name__}: {_first_line(exc)}"
    notes = [
        f"{e.state} epoch delivered {e.samples} samples ({e.unique} distinct) of {cell.samples}"
        for e in result.epochs
        if e.samples != cell.samples or e.unique != cell.samples
    ]
    result.note = "; ".join(notes)
    return result


def _first_line(exc: BaseException) -> str:
    """The exception's first line; for one re-raised from a DataLoader worker, also its last."""
    text = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not text:
        return repr(exc)
    if len(text) > 1 and "Original Traceback" in str(exc):
        return f"{text[0]} {text[-1].strip()}"[:500]
    return text[0][:300]


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    command, *args = argv
    if command == "read":
        result = run_cell(Cell.from_json(args[0]))
        print(MARK + result.to_json(), flush=True)
        return 0
    from benchmarks.data import writers  # noqa: PLC0415 - the write side only

    start = time.perf_counter()
    if command == "write":
        reader, root, count, size, shard = args
        writers.write(reader, Path(root), int(count), int(size), int(shard))
    elif command == "upload":
        reader, root, site, shard = args
        writers.upload(reader, Path(root), Site(**json.loads(site)), int(shard))
    elif command == "delete":
        site, prefix = args
        writers.delete_prefix(Site(**json.loads(site)), prefix)
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(f"{MARK}{time.perf_counter() - start}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Inference cold start: model weights from disk into memory (or a GPU), against every peer.

``python -m benchmarks.weights`` writes one synthetic model (Llama-shaped fp16
matrices) as a Hugging Face directory (``--shards`` safetensors files and their
index), as a mouthguard checkpoint, and in each peer's own format where it has
one, then times cold loads of it, interleaved and rotated (so the disk's drift
hits every loader alike), page cache dropped before each:

* the disk's limit: the same bytes read with O_DIRECT, 32 MiB blocks, 4 in flight;
* ``safetensors.torch.load_file`` on every shard (``device=`` the target);
* ``mouthguard.weights.load`` of the HF directory (no checksums exist there) and
  of the checkpoint (every byte verified against its xxh3-128);
* fastsafetensors (``SafeTensorsFileLoader``, GDS off unless ``--device cuda``
  and it can), Run:ai Model Streamer (``SafetensorsStreamer``) and CoreWeave
  tensorizer (``TensorDeserializer`` of a ``.tensors`` file written from the same
  state), each where it installs and runs; otherwise its row says why not.

A load is timed from the call until every returned tensor's bytes are in memory
(one byte per 4 KiB page touched for host tensors: safetensors maps files lazily)
or on the device (``torch.cuda.synchronize``). Every loader's result is compared
with the state once, untimed. ``--device cuda`` is the GPU mode (run it on a GPU
machine). Writes ``docs/benchmarks-weights.md`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file, save_file

import mouthguard
from benchmarks.harness import CacheDrop, paged_in, progress_bar
from benchmarks.rawio import RawIO
from benchmarks.report import load_line, machine_line
from benchmarks.state import REPO, parse_size
from mouthguard import weights

DEFAULT_OUT = REPO / "docs" / "benchmarks-weights.md"
RUN = "model"
#: The targets: against the raw read, and against the best peer, of the same run.
TARGET_RAW = 0.9
console = Console(stderr=True)

RAW = "raw O_DIRECT read of the same bytes (the disk's limit)"
SAFETENSORS = "safetensors load_file, every shard"
MG_HF = "mouthguard weights.load, HF directory (no checksums to verify)"
MG_CKPT = "mouthguard weights.load, checkpoint (xxh3-128 verified)"
FASTST = "fastsafetensors SafeTensorsFileLoader"
RUNAI = "Run:ai Model Streamer SafetensorsStreamer"
TENSORIZER = "tensorizer TensorDeserializer (its own .tensors file)"
PEERS = (SAFETENSORS, FASTST, RUNAI, TENSORIZER)
MOUTHGUARD = (MG_HF, MG_CKPT)


def build_model(nbytes: int) -> dict[str, torch.Tensor]:
    """Llama-shaped fp16 layers (q, k, v, o, gate, up, down, norms) summing to ~``nbytes``."""
    hidden = 1024
    gen = torch.Generator().manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    shapes = {
        "self_attn.q_proj.weight": (hidden, hidden),
        "self_attn.k_proj.weight": (hidden // 4, hidden),
        "self_attn.v_proj.weight": (hidden // 4, hidden),
        "self_attn.o_proj.weight": (hidden, hidden),
        "mlp.gate_proj.weight": (hidden * 3, hidden),
        "mlp.up_proj.weight": (hidden * 3, hidden),
        "mlp.down_proj.weight": (hidden, hidden * 3),
        "input_layernorm.weight": (hidden,),
    }
    per_layer = sum(torch.Size(s).numel() * 2 for s in shapes.values())
    for layer in range(max(1, nbytes // per_layer)):
        for name, shape in shapes.items():
            t = torch.empty(shape, dtype=torch.float16)
            state[f"model.layers.{layer}.{name}"] = t.uniform_(-1, 1, generator=gen)
    return state


def write_hf(directory: Path, state: dict[str, torch.Tensor], shards: int) -> list[Path]:
    """``state`` as ``shards`` safetensors files (contiguous runs of layers) and the index."""
    directory.mkdir(parents=True)
    names = list(state)
    per = -(-len(names) // shards)
    files, weight_map = [], {}
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        if not part:
            break
        file = directory / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, str(file), metadata={"format": "pt"})
        files.append(file)
        weight_map.update(dict.fromkeys(part, file.name))
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return files


@dataclass
class Row:
    """One loader's cold loads."""

    name: str
    load: Callable[[], object] | None
    times: list[float] = field(default_factory=list)
    unavailable: str = ""


def _unavailable(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:200]


class Loaders:
    """Every loader of the module docstring over one model on one disk."""

    def __init__(self, state: dict[str, torch.Tensor], root: Path, device: str, shards: int):
        self.state, self.root, self.device = state, root, torch.device(device)
        self.hf = root / "hf"
        self.files = write_hf(self.hf, state, shards)
        store = root / "store"
        with mouthguard.Checkpointer(store, RUN, background=False) as ckpt:
            ckpt.save(1, state)
        self.store = store
        self.raw = RawIO(state)
        (root / "raw").mkdir()
        self.raw.write(root / "raw")
        self.tensorizer_file = root / "model.tensors"
        self.rows = [
            Row(RAW, lambda: self.raw.read(root / "raw")),
            Row(SAFETENSORS, self.safetensors),
            Row(MG_HF, lambda: weights.load(self.hf, self.device).tensors),
            Row(MG_CKPT, lambda: weights.load(store, self.device, run=RUN).tensors),
            Row(FASTST, self.fastsafetensors),
            Row(RUNAI, self.runai),
            Row(TENSORIZER, self.tensorizer),
        ]
        self._prepare_tensorizer()

    def safetensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for file in self.files:
            out.update(load_file(str(file), device=str(self.device)))
        return out

    def fastsafetensors(self) -> dict[str, torch.Tensor]:
        from fastsafetensors import SafeTensorsFileLoader  # noqa: PLC0415 - optional peer

        device = self.device
        if device.type == "cuda" and device.index is None:
            # fastsafetensors refuses a bare "cuda" ("Expected a torch.device with a
            # specified index"): name the current device, as an engine would.
            device = torch.device("cuda", torch.cuda.current_device())
        loader = SafeTensorsFileLoader(None, str(device), nogds=device.type != "cuda")
        try:
            loader.add_filenames({0: [str(f) for f in self.files]})
            buffers = loader.copy_files_to_device()
            # The tensors are views of the loader's device buffers, which close() frees
            # on a GPU: clone them (a device-to-device copy, counted in the time).
            keep = device.type == "cuda"
            out = {
                name: buffers.get_tensor(name).clone() if keep else buffers.get_tensor(name)
                for name in self.state
            }
            buffers.close()
        finally:
            loader.close()
        return out

    def runai(self) -> dict[str, torch.Tensor]:
        from runai_model_streamer import SafetensorsStreamer  # noqa: PLC0415 - optional peer

        with SafetensorsStreamer() as streamer:
            streamer.stream_files([str(f) for f in self.files], device=str(self.device))
            return dict(streamer.get_tensors())

    def _prepare_tensorizer(self) -> None:
        try:
            from tensorizer import TensorSerializer  # noqa: PLC0415 - optional peer

            serializer = TensorSerializer(str(self.tensorizer_file))
            serializer.write_state_dict(self.state)
            serializer.close()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run: its row says why
            self.row(TENSORIZER).unavailable = _unavailable(exc)

    def tensorizer(self) -> dict[str, torch.Tensor]:
        from tensorizer import TensorDeserializer  # noqa: PLC0415 - optional peer

        with TensorDeserializer(
            str(self.tensorizer_file), device=str(self.device), lazy_load=False
        ) as loaded:
            return dict(loaded.items())

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def check(self) -> None:
        """Each loader once, untimed: its result must be the state (else its row says so)."""
        for row in self.rows[1:]:
            if row.unavailable or row.load is None:
                continue
            try:
                got = row.load()
                assert isinstance(got, dict)
                for name, tensor in self.state.items():
                    if not torch.equal(got[name].cpu(), tensor):
                        raise AssertionError(f"{name} differs")  # noqa: TRY301
            except Exception as exc:  # noqa: BLE001 - report the peer, keep measuring the rest
                row.unavailable = _unavailable(exc)
            gc.collect()

    def once(self, rotation: int, cache: CacheDrop) -> None:
        """One cold load of every available loader, in an order rotated by ``rotation``."""
        live = [r for r in self.rows if not r.unavailable and r.load is not None]
        order = live[rotation % len(live) :] + live[: rotation % len(live)]
        for row in order:
            cache.drop(self.root)
            gc.collect()
            assert row.load is not None
            row.times.append(self._timed(row.load))

    def _timed(self, load: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        out = paged_in(load())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        del out
        return elapsed


def report(loaders: Loaders, nbytes: int, machine: str, command: str, cache: str) -> str:
    rows = loaders.rows
    raw = loaders.row(RAW)
    st = loaders.row(SAFETENSORS)
    lines = [
        "# Model weights into memory: mouthguard against the peers and the disk",
        "",
        "Generated by `benchmarks/weights.py`; do not edit by hand.",
        "",
        machine,
        "",
        "```bash",
        command,
        "```",
        "",
        f"Model: {nbytes / 2**30:.2f} GiB of fp16 Llama-shaped matrices, {len(loaders.state)} "
        f"tensors, {len(loaders.files)} safetensors shards; target device `{loaders.device}`.",
        f"Page cache before each load: {cache}. Loads are interleaved and rotated; each is",
        "timed until every returned tensor's bytes are in memory (or on the device).",
        "*GiB/s* counts the model's tensor bytes over the median time (file headers and",
        "the index are read but not counted); ratios are of throughputs in this run.",
        "",
        "| loader | median s | min-max s | GiB/s | x raw read | x safetensors |",
        "|---|---|---|---|---|---|",
    ]
    gib = nbytes / 2**30

    def speed(row: Row) -> float:
        return gib / statistics.median(row.times)

    for row in rows:
        if row.unavailable or not row.times:
            lines.append(f"| {row.name} | not available: {row.unavailable} | | | | |")
            continue
        lines.append(
            f"| {row.name} | {statistics.median(row.times):.3f} | "
            f"{min(row.times):.3f}-{max(row.times):.3f} | {speed(row):.2f} | "
            f"{speed(row) / speed(raw):.2f}x | "
            + (f"{speed(row) / speed(st):.2f}x |" if st.times else "|")
        )
    peers = [r for r in rows if r.name in PEERS and r.times and not r.unavailable]
    best = max(peers, key=speed) if peers else None
    hf = loaders.row(MG_HF)
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    if hf.times:
        ratio = speed(hf) / speed(raw)
        verdict = "**met**" if ratio >= TARGET_RAW else "**not met**"
        lines.append(f"| weights load >= {TARGET_RAW}x the raw read | {ratio:.2f}x | {verdict} |")
        if best is not None:
            vs = speed(hf) / speed(best)
            verdict = "**met**" if vs >= 1.0 else "**not met**"
            lines.append(f"| weights load >= the best peer ({best.name}) | {vs:.2f}x | {verdict} |")
    lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights", description=__doc__)
    parser.add_argument("--size", default="1G", help="model size (default 1G)")
    parser.add_argument("--shards", type=int, default=4, help="safetensors files (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="cold loads per loader (3)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: the GPU mode")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown report")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.shards < 1:
        parser.error("need at least one repeat and one shard")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nbytes = parse_size(args.size)
    base = Path(tempfile.gettempdir()) if args.dir is None else args.dir
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".mouthguard-weights-", dir=base))
    options = ["--size", args.size, "--shards", str(args.shards), "--repeats"]
    options += [str(args.repeats), "--device", args.device]
    command = shlex.join([".venv/bin/python", "-m", "benchmarks.weights", *options])
    cache = CacheDrop()
    try:
        machine = machine_line(root)
        load_before = os.getloadavg()
        state = build_model(nbytes)
        model_bytes = sum(t.numel() * t.element_size() for t in state.values())
        with progress_bar(console) as progress:
            task = progress.add_task("writing the model in every format", total=args.repeats + 1)
            loaders = Loaders(state, root, args.device, args.shards)
            progress.update(task, description="checking every loader's result (untimed)")
            loaders.check()
            progress.advance(task)
            for r in range(args.repeats):
                progress.update(task, description=f"cold loads, round {r + 1}")
                loaders.once(r, cache)
                progress.advance(task)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    machine = f"{machine}\n\n{load_line(load_before, os.getloadavg())}"
    text = report(loaders, model_bytes, machine, command, cache.describe())
    table = Table("loader", "median s", "GiB/s")
    for row in loaders.rows:
        median = statistics.median(row.times) if row.times else float("nan")
        speed = row.unavailable or f"{model_bytes / 2**30 / median:.2f}"
        table.add_row(row.name, f"{median:.3f}", speed)
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    console.print(f"wrote {args.out}")
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Valid inputs for the fuzz harness, produced by real saves.

Every mutation starts from something mouthguard itself wrote: manifests of a
``Checkpointer`` save (tied weights, a shared-storage view, typed values, several
dtypes; one with sha256), a 3-rank manifest, a DCP save's manifest (with its
``dcp`` metadata), every kind of sidecar, and the rank files.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mouthguard
from mouthguard.checkpoint import sidecars
from mouthguard.checkpoint.catalog import checkpoint_prefix, manifest_key
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.format.manifest import FileRecord, TensorRecord, parse_manifest
from mouthguard.policy.importance import Importance
from mouthguard.tiers.memory import MemoryTier


@dataclass(frozen=True)
class Seed:
    """One committed checkpoint: its run, step, manifest bytes and data files."""

    name: str
    run: str
    step: int
    manifest: bytes
    files: dict[str, bytes]

    @property
    def body(self) -> dict[str, Any]:
        """The manifest body as plain JSON (without its checksum member)."""
        parsed: dict[str, Any] = json.loads(self.manifest)
        parsed.pop("manifest_checksum", None)
        return parsed


@dataclass(frozen=True)
class Seeds:
    """Everything the mutators start from."""

    checkpoints: dict[str, Seed]
    #: sidecar kind -> (file name, sealed bytes), written for checkpoint ``single``.
    sidecars: dict[str, tuple[str, bytes]]


def _state() -> dict[str, Any]:
    qkv = torch.arange(24, dtype=torch.float32).view(6, 4)
    shared = torch.linspace(-1, 1, 12).view(3, 4)
    return {
        "model": {
            "fc": {"weight": shared, "bias": torch.zeros(3, dtype=torch.float16)},
            "tied": shared,
            "q": qkv[0:2],
            "k": qkv[2:4],
            "emb": torch.randn(5, 3, generator=torch.Generator().manual_seed(1)).bfloat16(),
        },
        "optim": OrderedDict(
            step=12,
            lr=0.5,
            betas=(0.9, 0.999),
            nan=math.nan,
            raw=b"\x00\xffbytes",
            by_int={0: "a", 7: [1, 2]},
            np=np.float32(0.25),
            size=torch.Size([3, 4]),
        ),
        "counts": torch.tensor([1, 2, 3], dtype=torch.int64),
        "empty": torch.empty(0, 7, dtype=torch.int32),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.arange(256, dtype=torch.uint8)[:17],
        "meta": {"name": "ünïcode ✓", "tags": ["a", "b"], "none": None},
    }


def _read(root: Path, run: str, step: int) -> tuple[bytes, dict[str, bytes]]:
    directory = root / "fast" / run / f"{step:012d}"
    manifest = (directory / "manifest.json").read_bytes()
    files = {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.name != "manifest.json" and not p.name.startswith("sidecar.")
    }
    return manifest, files


def _multi_rank(seed: Seed, world: int) -> Seed:
    """A ``world``-rank checkpoint built from a 1-rank one (every rank the same file)."""
    parsed = parse_manifest(seed.manifest)
    (first,) = parsed.files
    data = seed.files[first.name]
    files: list[FileRecord] = []
    tensors: list[TensorRecord] = []
    out: dict[str, bytes] = {}
    for rank in range(world):
        name = f"rank-{rank:05d}.safetensors"
        files.append(dataclasses.replace(first, name=name, rank=rank))
        tensors.extend(dataclasses.replace(t, file=name) for t in parsed.tensors)
        out[name] = data
    multi = dataclasses.replace(
        parsed,
        world_size=world,
        files=tuple(files),
        tensors=tuple(tensors),
        states=parsed.states * world,
    )
    return Seed(f"{seed.name}-x{world}", seed.run, seed.step, multi.to_bytes(), out)


def _dcp_save(store: mouthguard.Store) -> None:
    from torch.distributed.checkpoint.state_dict_saver import save  # noqa: PLC0415 - heavy

    from mouthguard.dcp.writer import Writer  # noqa: PLC0415

    state = {
        "model": {"w": torch.arange(12.0).view(3, 4), "b": torch.ones(2, dtype=torch.bfloat16)},
        "step": 5,
        "extra": {"note": "x"},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(state, storage_writer=Writer(store, run="d", step=3, background=False))


def _sidecars(seed: Seed) -> dict[str, tuple[str, bytes]]:
    tier = MemoryTier("seed", "ram")
    tier.put(manifest_key(seed.run, seed.step), seed.manifest)
    ref = CopyRef(tier, seed.run, seed.step)
    when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    sidecars.write_receipt(ref, seed.manifest, when)
    sidecars.write_importance(ref, Importance.MILESTONE, "promoted by the fuzz seed", when)
    sidecars.place_hold(ref, "legal", "keep for the audit", when)
    sidecars.mark_trashed(ref, "retention", when)
    sidecars.report_damage(ref, "checksum mismatch in rank-00000.safetensors", when)
    sidecars.write_receipt(ref, seed.manifest, when)  # report_damage removed the first
    sidecars.mark_legal_hold(ref, when)
    prefix = checkpoint_prefix(seed.run, seed.step)
    kinds = {
        "receipt": sidecars.RECEIPT,
        "importance": sidecars.IMPORTANCE,
        "hold": "sidecar.hold.legal.json",
        "trash": sidecars.TRASH,
        "damage": sidecars.DAMAGE,
        "legal_hold": sidecars.LEGAL_HOLD,
    }
    return {kind: (name, tier.get(prefix + name)) for kind, name in kinds.items()}


def build_seeds(workdir: Path) -> Seeds:
    """Save real checkpoints under ``workdir`` and collect their bytes."""
    root = workdir / "seed-store"
    store = mouthguard.open_store(root)
    state = _state()
    mouthguard.Checkpointer(store, run="r", background=False).save(
        1, state, importance="milestone", reference={"loss": 2.5, "tokens": 10**12}
    )
    mouthguard.Checkpointer(store, run="s", with_sha256=True, background=False).save(
        2, {"w": torch.arange(8, dtype=torch.float64), "step": 2}
    )
    _dcp_save(store)
    checkpoints: dict[str, Seed] = {}
    for name, run, step in [("single", "r", 1), ("sha", "s", 2), ("dcp", "d", 3)]:
        manifest, files = _read(root, run, step)
        checkpoints[name] = Seed(name, run, step, manifest, files)
    multi = _multi_rank(checkpoints["single"], 3)
    checkpoints["multi"] = dataclasses.replace(multi, name="multi")
    return Seeds(checkpoints, _sidecars(checkpoints["single"]))


def save_seeds(seeds: Seeds, path: Path) -> None:
    """Write ``seeds`` as JSON (bytes in base64), so every worker fuzzes the same inputs."""
    doc = {
        "checkpoints": {
            name: {
                "run": s.run,
                "step": s.step,
                "manifest": base64.b64encode(s.manifest).decode(),
                "files": {n: base64.b64encode(d).decode() for n, d in s.files.items()},
            }
            for name, s in seeds.checkpoints.items()
        },
        "sidecars": {
            kind: [name, base64.b64encode(raw).decode()]
            for kind, (name, raw) in seeds.sidecars.items()
        },
    }
    path.write_text(json.dumps(doc))


def load_seeds(path: Path) -> Seeds:
    """Read seeds written by :func:`save_seeds`."""
    doc = json.loads(path.read_text())
    checkpoints = {
        name: Seed(
            name,
            c["run"],
            int(c["step"]),
            base64.b64decode(c["manifest"]),
            {n: base64.b64decode(d) for n, d in c["files"].items()},
        )
        for name, c in doc["checkpoints"].items()
    }
    side = {kind: (str(v[0]), base64.b64decode(v[1])) for kind, v in doc["sidecars"].items()}
    return Seeds(checkpoints, side)

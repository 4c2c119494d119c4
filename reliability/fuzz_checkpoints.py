"""Damaged whole checkpoints (manifest and rank files) and the oracle for a load that succeeded.

Shared by the ``reader`` target (:mod:`reliability.fuzz_targets`) and the
end-to-end targets (:mod:`reliability.fuzz_e2e`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from typing import Any

from mouthguard.format.checksum import xxh3_digest
from mouthguard.format.manifest import parse_manifest
from reliability import fuzz_mutate as mut
from reliability.fuzz_case import (
    ACCEPTED_CORRUPT,
    Case,
    bytes_mutated,
    json_mutated,
    random_bytes,
    resealed,
)
from reliability.fuzz_oracle import compare, independent_tensors
from reliability.fuzz_seeds import Seed, Seeds


def manifest_focus(rng: random.Random, seed: Seed) -> tuple[str | int, ...]:
    """The part of a manifest a JSON mutation aims at (``()``: anywhere)."""
    options: list[tuple[str | int, ...]] = [
        (),
        ("files",),
        ("tensors",),
        ("states",),
        ("reference",),
        ("framework",),
        ("world_size",),
    ]
    if seed.name == "dcp":
        options += [("dcp",)] * 4
    return rng.choice(options)


def _with_files(body: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """``body`` with size and checksums of every file recomputed from ``files``."""
    for record in body.get("files", []):
        data = files.get(record.get("name"))
        if data is None:
            continue
        record["size"] = len(data)
        record["checksum"] = xxh3_digest(data)
        if "sha256" in record:
            record["sha256"] = "sha256:" + hashlib.sha256(data).hexdigest()
    return body


def mutate_rank_file(rng: random.Random, data: bytes) -> bytes:
    """A structure-aware or byte-level mutation of a safetensors rank file."""
    (length,) = struct.unpack("<Q", data[:8])
    header, payload = data[8 : 8 + length], data[8 + length :]
    roll = rng.random()
    if roll < 0.35:  # bytes, anywhere in the header (or in the data)
        cut = 8 + length if rng.random() < 0.8 else len(data)
        return bytes_mutated(rng, data[:cut]) + data[cut:]
    if roll < 0.45:  # the length field itself
        value = rng.choice(
            [0, 1, length - 1, length + 1, len(data), 2**63, 2**64 - 1, 100_000_001, 8]
        )
        return struct.pack("<Q", value % 2**64) + data[8:]
    doc = json.loads(header)
    text = mut.dumps(json_mutated(rng, doc), indent=0).replace("\n", "")
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.7:  # keep the 4 KiB alignment mouthguard writes
        raw += b" " * (-(8 + len(raw)) % 4096)
    tail = payload
    if rng.random() < 0.2:
        tail = payload[: rng.randrange(len(payload) + 1)] + b"\0" * rng.choice([0, 1, 8])
    return struct.pack("<Q", len(raw)) + raw + tail


def inflate(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """A consistent manifest (tensors still tile their file) claiming a huge tensor.

    The last tensor of a file grows to ``2**k`` bytes and the file's size with it, so
    every manifest check passes and only the real object's size can tell.
    """
    tensors = [t for t in body["tensors"] if t["shape"] and math.prod(t["shape"]) > 0]
    if not tensors:
        return body
    record = max(tensors, key=lambda t: (t["file"], t["offset"]))
    record = max(
        (t for t in body["tensors"] if t["file"] == record["file"]), key=lambda t: t["offset"]
    )
    if not record["shape"] or math.prod(record["shape"]) == 0:
        return body
    item = record["length"] // math.prod(record["shape"])
    target = 2 ** rng.choice([31, 33, 36, 40, 44, 48])
    record["shape"] = [target // item]
    grown = record["shape"][0] * item
    file = next(f for f in body["files"] if f["name"] == record["file"])
    file["size"] += grown - record["length"]
    record["length"] = grown
    return body


def make_checkpoint(rng: random.Random, seeds: Seeds, target: str, index: int) -> Case:
    """A damaged or hostile checkpoint: manifest and rank files, and how it was made."""
    seed = seeds.checkpoints[rng.choice(sorted(seeds.checkpoints))]
    files = dict(seed.files)
    mode = rng.choice(
        [
            "manifest_json",
            "manifest_json",
            "manifest_json",
            "manifest_bytes",
            "manifest_bytes_resealed",
            "rank_bytes",
            "rank_resealed",
            "rank_resealed",
            "manifest_inflate",
            "random",
        ]
    )
    manifest = seed.manifest
    if mode == "manifest_json":
        body = json_mutated(rng, seed.body, manifest_focus(rng, seed))
        manifest = mut.seal_text(mut.dumps(body))
    elif mode == "manifest_bytes":
        manifest = bytes_mutated(rng, manifest)
    elif mode == "manifest_bytes_resealed":
        manifest = resealed(rng, manifest)
    elif mode == "random":
        manifest = random_bytes(rng)
    elif mode == "manifest_inflate":
        manifest = mut.seal_text(mut.dumps(inflate(rng, seed.body)))
    else:
        name = rng.choice(sorted(files))
        files[name] = mutate_rank_file(rng, files[name])
        if mode == "rank_resealed":
            manifest = mut.seal_text(mut.dumps(_with_files(seed.body, files)))
    parts = {"manifest.json": manifest, **files}
    return Case(target, index, mode, parts, {"seed": seed.name, "run": seed.run, "step": seed.step})


def changed_without_seal(case: Case, seeds: Seeds, only: str | None = None) -> bool:
    """Whether the case damaged bytes that a checksum must catch (no re-seal).

    ``only``: consider just this data file (a load of one rank reads only its file).
    """
    seed = seeds.checkpoints[case.meta["seed"]]
    if case.mode == "manifest_bytes":
        return case.parts["manifest.json"] != seed.manifest
    if case.mode == "rank_bytes":
        return any(case.parts.get(n, d) != d for n, d in seed.files.items() if only in (None, n))
    return False


def judge_load(
    case: Case, seeds: Seeds, manifest_bytes: bytes, rank: int, loaded: object
) -> str | None:
    """The oracle for a load of ``rank`` that succeeded."""
    manifest = parse_manifest(manifest_bytes)
    record = next(f for f in manifest.files if f.rank == rank)
    if changed_without_seal(case, seeds, record.name):
        return ACCEPTED_CORRUPT + f"{case.mode}: a damaged checkpoint loaded without error"
    seed = seeds.checkpoints[case.meta["seed"]]
    data = case.parts.get(record.name, seed.files.get(record.name))
    if data is None:
        return ACCEPTED_CORRUPT + f"loaded {record.name}, which the case does not have"
    try:
        stored = independent_tensors(data)
    except Exception as exc:
        return ACCEPTED_CORRUPT + f"accepted a rank file safetensors rejects: {exc}"
    problem = compare(manifest.states[rank], loaded, stored, "state")
    return None if problem is None else ACCEPTED_CORRUPT + problem

"""Fuzz targets: how each parser's hostile inputs are made, and what each must do with them.

A target has a ``make(rng, seeds) -> Case`` and a ``check(case, ctx) -> str | None``.
``check`` catches exactly the errors the parser documents; any other exception
escapes and is counted as a crash by the runner. A returned string is a broken
invariant (prefixed ``accepted_corrupt:`` when a damaged input was accepted).
The case, the context and the generic mutations are in :mod:`reliability.fuzz_case`;
damaged whole checkpoints and their load oracle in :mod:`reliability.fuzz_checkpoints`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Callable
from typing import Any

import torch

from mouthguard.checkpoint import sidecars
from mouthguard.checkpoint.catalog import checkpoint_prefix, manifest_key
from mouthguard.checkpoint.reader import load_copy, read_manifest, verify_copy
from mouthguard.dcp.metadata_json import decode_metadata
from mouthguard.errors import (
    FormatError,
    InvalidKeyError,
    ManifestError,
    ObjectNotFoundError,
    RankFileError,
)
from mouthguard.format import typed_json
from mouthguard.format.manifest import parse_manifest
from mouthguard.format.rank_file import parse_header, read_header_length
from mouthguard.format.sealed import unseal
from mouthguard.format.state_tree import tensor_references, unflatten_state
from mouthguard.tiers.memory import MemoryTier
from mouthguard.tiers.object_keys import validate_key, validate_prefix, validate_segment
from reliability import fuzz_mutate as mut
from reliability.fuzz_case import (
    ACCEPTED_CORRUPT,
    Case,
    Context,
    bytes_mutated,
    json_mutated,
    random_bytes,
    resealed,
)
from reliability.fuzz_checkpoints import (
    changed_without_seal,
    judge_load,
    make_checkpoint,
    manifest_focus,
    mutate_rank_file,
)
from reliability.fuzz_oracle import independent_tensors
from reliability.fuzz_seeds import Seeds

# --- targets -----------------------------------------------------------------------


def make_manifest(rng: random.Random, seeds: Seeds, index: int) -> Case:
    seed = seeds.checkpoints[rng.choice(sorted(seeds.checkpoints))]
    mode = rng.choice(["json", "json", "json", "bytes", "resealed", "random"])
    if mode == "json":
        raw = mut.seal_text(mut.dumps(json_mutated(rng, seed.body, manifest_focus(rng, seed))))
    elif mode == "bytes":
        raw = bytes_mutated(rng, seed.manifest)
    elif mode == "resealed":
        raw = resealed(rng, seed.manifest)
    else:
        raw = random_bytes(rng)
    return Case("manifest", index, mode, {"manifest.json": raw}, {"seed": seed.name})


def check_manifest(case: Case, ctx: Context) -> str | None:
    raw = case.parts["manifest.json"]
    try:
        manifest = parse_manifest(raw)
    except ManifestError:
        return None
    seed = ctx.seeds.checkpoints[case.meta["seed"]]
    if case.mode == "bytes" and raw != seed.manifest:
        return ACCEPTED_CORRUPT + "a manifest with damaged bytes passed its checksum"
    for record in manifest.files:  # accepted: names must be safe single segments
        validate_segment(record.name)
    manifest.to_bytes()  # an accepted manifest must serialise again
    return None


def make_unseal(rng: random.Random, seeds: Seeds, index: int) -> Case:
    docs = [s.manifest for s in seeds.checkpoints.values()] + [
        raw for _, raw in seeds.sidecars.values()
    ]
    mode = rng.choice(["bytes", "resealed", "random"])
    raw = rng.choice(docs)
    if mode == "bytes":
        raw = bytes_mutated(rng, raw)
    elif mode == "resealed":
        raw = resealed(rng, raw)
    else:
        raw = random_bytes(rng)
    return Case("unseal", index, mode, {"doc.json": raw})


def check_unseal(case: Case, _ctx: Context) -> str | None:
    try:
        body: object = unseal(case.parts["doc.json"])
    except FormatError:
        return None
    if not isinstance(body, dict):
        return "unseal returned a non-object"
    return None


def make_sidecar(rng: random.Random, seeds: Seeds, index: int) -> Case:
    kind = rng.choice(sorted(seeds.sidecars))
    name, raw = seeds.sidecars[kind]
    mode = rng.choice(["json", "json", "bytes", "resealed", "random"])
    if mode == "json":
        body = json.loads(raw)
        body.pop("manifest_checksum", None)
        raw = mut.seal_text(mut.dumps(json_mutated(rng, body)))
    elif mode == "bytes":
        raw = bytes_mutated(rng, raw)
    elif mode == "resealed":
        raw = resealed(rng, raw)
    else:
        raw = random_bytes(rng)
    return Case("sidecar", index, mode, {name: raw}, {"kind": kind})


def check_sidecar(case: Case, ctx: Context) -> str | None:
    seed = ctx.seeds.checkpoints["single"]
    tier = MemoryTier("fuzz", "ram")
    tier.put(manifest_key(seed.run, seed.step), seed.manifest)
    ref = sidecars.CopyRef(tier, seed.run, seed.step)
    ((name, raw),) = case.parts.items()
    tier.put(checkpoint_prefix(seed.run, seed.step) + name, raw)
    try:
        sidecars._read(tier, ref.key(name))
        intact = True
    except FormatError:
        intact = False
    facts = sidecars.read_sidecars(ref)  # documented: never raises for damaged facts
    sidecars.check_sidecars(ref)
    kind = case.meta["kind"]
    if kind == "hold" and len(facts.holds) != 1:
        return "a damaged hold sidecar no longer holds"
    if kind == "trash" and facts.trashed_at is None:
        return "a trash mark was lost (a damaged mark must restart the delay)"
    if kind == "damage" and (not facts.damage or facts.verified_at is not None):
        return "a damage report was lost"
    if kind == "receipt" and not intact and facts.verified_at is not None:
        return ACCEPTED_CORRUPT + "a damaged receipt still vouches for the copy"
    if kind == "importance" and not intact and facts.importance is not None:
        return ACCEPTED_CORRUPT + "a damaged importance sidecar was believed"
    for when in (facts.verified_at, facts.importance_changed_at, facts.trashed_at):
        if when is not None and when.tzinfo is None:
            return f"a {kind} sidecar yields a naive datetime {when.isoformat()}"
    for hold in facts.holds:
        if hold.placed_at is not None and hold.placed_at.tzinfo is None:
            return f"a hold sidecar yields a naive datetime {hold.placed_at.isoformat()}"
    return None


def make_rank_header(rng: random.Random, seeds: Seeds, index: int) -> Case:
    seed = seeds.checkpoints[rng.choice(sorted(seeds.checkpoints))]
    data = seed.files[rng.choice(sorted(seed.files))]
    mode = rng.choice(["structured", "structured", "structured", "random"])
    data = random_bytes(rng) if mode == "random" else mutate_rank_file(rng, data)
    size = len(data) if rng.random() < 0.8 else rng.choice([0, 8, len(data) - 1, 2**64, 2**50])
    return Case("rank_header", index, mode, {"rank.safetensors": data}, {"file_size": size})


def check_rank_header(case: Case, _ctx: Context) -> str | None:
    data, size = case.parts["rank.safetensors"], int(case.meta["file_size"])
    try:
        offset = read_header_length(data[:8], size)
        entries, _ = parse_header(data[:offset], size)
    except RankFileError:
        return None
    if size != len(data) or sum(e.length for e in entries) != size - offset:
        return None  # a header that fits a different file size; nothing to compare
    try:  # differential: a file we accept must be one the safetensors library accepts
        theirs = independent_tensors(data)
    except Exception as exc:
        return f"parse_header accepted a file safetensors rejects: {type(exc).__name__}: {exc}"
    ours = {e.name: (e.dtype, e.shape) for e in entries}
    if set(ours) != set(theirs):
        return "parse_header and safetensors disagree on the tensor names"
    return None


def _typed_seeds(seeds: Seeds) -> list[Any]:
    out: list[Any] = []
    for seed in seeds.checkpoints.values():
        body = seed.body
        out.extend([body["states"], body.get("reference")])
        if isinstance(body.get("dcp"), dict):
            out.append(body["dcp"].get("planner_data"))
    return out


def make_typed_json(rng: random.Random, seeds: Seeds, index: int) -> Case:
    value = rng.choice(_typed_seeds(seeds))
    mode = rng.choice(["json", "json", "json", "bytes", "random"])
    if mode == "json":
        text = mut.dumps(json_mutated(rng, value)).encode("utf-8", "surrogatepass")
    elif mode == "bytes":
        text = bytes_mutated(rng, mut.dumps(value).encode())
    else:
        text = random_bytes(rng)
    return Case("typed_json", index, mode, {"value.json": text})


def check_typed_json(case: Case, ctx: Context) -> str | None:
    try:
        value = typed_json.loads_strict(case.parts["value.json"])
    except FormatError:
        return None
    stored = independent_tensors(ctx.seeds.checkpoints["single"].files["rank-00000.safetensors"])

    def lookup(name: str, path: str) -> torch.Tensor:
        if name not in stored:
            raise FormatError(f"{path}: no tensor {name!r}")
        return stored[name]

    with contextlib.suppress(FormatError):
        typed_json.decode(value)
    with contextlib.suppress(FormatError):
        tensor_references(value)
    with contextlib.suppress(FormatError):
        unflatten_state(value, lookup)
    return None


def make_dcp(rng: random.Random, seeds: Seeds, index: int) -> Case:
    seed = seeds.checkpoints["dcp"]
    body = json_mutated(rng, seed.body, ("dcp",))
    return Case("dcp_metadata", index, "json", {"manifest.json": mut.seal_text(mut.dumps(body))})


def check_dcp(case: Case, _ctx: Context) -> str | None:
    try:
        manifest = parse_manifest(case.parts["manifest.json"])
        if manifest.dcp is not None:
            decode_metadata(manifest.dcp, manifest)
    except ManifestError:
        return None
    return None


_KEYS = [
    "r/000000000001/manifest.json",
    "r/000000000001/rank-00000.safetensors",
    "r/000000000001/sidecar.hold.legal.json",
    "r/000000000001.partial-0123abcd/rank-00000.safetensors",
    "run_a.b=c+d-e/x",
]


def make_key(rng: random.Random, _seeds: Seeds, index: int) -> Case:
    key = rng.choice(_KEYS)
    for _ in range(rng.randrange(1, 4)):
        pos = rng.randrange(len(key) + 1)
        piece = rng.choice(
            [
                "..",
                "/",
                "./",
                "../",
                "\x00",
                "\\",
                "\n",
                ".",
                "~",
                "\u2215",  # division slash
                "\uff0e\uff0e",  # fullwidth dots
                "%2e",
                rng.choice(mut.HOSTILE_STRINGS)[:40],
            ]
        )
        key = key[:pos] + piece + key[pos:] if rng.random() < 0.7 else piece + key
    raw = key.encode("utf-8", "surrogatepass")
    return Case("keys", index, "string", {"key.txt": raw})


def check_key(case: Case, ctx: Context) -> str | None:
    key = case.parts["key.txt"].decode("utf-8", "surrogatepass")
    tier = ctx.tier_for_keys()
    root = str(tier.root)
    for validate in (validate_key, validate_prefix, validate_segment):
        try:
            validate(key)
        except InvalidKeyError:
            continue
        parts = key.rstrip("/").split("/")
        if any(p in ("", ".", "..") or p.startswith(".") for p in parts) or "\x00" in key:
            return f"{validate.__name__} accepted the unsafe key {key!r}"
    try:
        path = tier.path_of(key)
    except InvalidKeyError:
        return None
    if not os.path.normpath(path).startswith(root + os.sep):
        return f"key {key!r} maps outside the tier root: {path}"
    return None


def make_reader(rng: random.Random, seeds: Seeds, index: int) -> Case:
    return make_checkpoint(rng, seeds, "reader", index)


def check_reader(case: Case, ctx: Context) -> str | None:
    """The whole read path on a memory tier: manifest, verify, load of every rank."""
    run, step = str(case.meta["run"]), int(case.meta["step"])
    tier = MemoryTier("fuzz", "ram")
    prefix = checkpoint_prefix(run, step)
    for name, data in case.parts.items():
        tier.put(prefix + name, data)
    try:
        manifest = read_manifest(tier, run, step)
    except ManifestError:
        return None
    try:
        verify_copy(tier, prefix, manifest)
        verified = True
    except (FormatError, ObjectNotFoundError):
        verified = False
    if verified and changed_without_seal(case, ctx.seeds):
        return ACCEPTED_CORRUPT + f"{case.mode}: verify_copy accepted damaged bytes"
    if manifest.dcp is not None:
        with contextlib.suppress(ManifestError):
            decode_metadata(manifest.dcp, manifest)
    raw = case.parts["manifest.json"]
    for rank in range(min(manifest.world_size, 4)):
        try:
            loaded = load_copy(tier, prefix, manifest, rank=rank)
        except (FormatError, ObjectNotFoundError):
            continue
        problem = judge_load(case, ctx.seeds, raw, rank, loaded)
        if problem:
            return problem
    return None


Maker = Callable[[random.Random, Seeds, int], Case]
Checker = Callable[[Case, Context], "str | None"]

TARGETS: dict[str, tuple[Maker, Checker]] = {
    "manifest": (make_manifest, check_manifest),
    "unseal": (make_unseal, check_unseal),
    "sidecar": (make_sidecar, check_sidecar),
    "rank_header": (make_rank_header, check_rank_header),
    "typed_json": (make_typed_json, check_typed_json),
    "dcp_metadata": (make_dcp, check_dcp),
    "keys": (make_key, check_key),
    "reader": (make_reader, check_reader),
}

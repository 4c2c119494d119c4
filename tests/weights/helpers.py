"""Model directories as Hugging Face writes them, made with the real safetensors library."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

#: The hub repository and revision :func:`make_hub_cache` files a model under.
REPO = "org/tiny"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A small transformer-shaped state in mixed dtypes (names as in Llama checkpoints)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=gen).to(torch.bfloat16)
    }
    for layer in range(3):
        p = f"model.layers.{layer}"
        state[f"{p}.self_attn.q_proj.weight"] = torch.randn(32, 32, generator=gen)
        state[f"{p}.self_attn.o_proj.weight"] = torch.randn(32, 48, generator=gen)
        state[f"{p}.mlp.down_proj.weight"] = torch.randn(16, 8, 6, generator=gen).half()
        state[f"{p}.input_layernorm.weight"] = torch.ones(32)
        state[f"{p}.step"] = torch.tensor(layer, dtype=torch.int64)
    state["model.norm.weight"] = torch.rand(32, generator=gen)
    state["lm_head.empty"] = torch.empty(0, 4)
    return state


def write_sharded(directory: Path, state: dict[str, torch.Tensor], shards: int = 3) -> Path:
    """``state`` as ``model-0000i-of-0000n.safetensors`` files and their index."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(state)
    weight_map = {}
    for index in range(shards):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n].contiguous() for n in names[index::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))
    return directory


def write_single(directory: Path, state: dict[str, torch.Tensor]) -> Path:
    """``state`` as one ``model.safetensors``."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in state.items()}, str(directory / "model.safetensors"))
    return directory


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Same names, and bitwise the same dtype, shape and bytes."""
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(got[name].cpu(), tensor), name


def read_with_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """What the safetensors library itself reads from every ``*.safetensors`` in ``directory``."""
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def make_hub_cache(cache: Path, model: Path, revision: str = REVISION) -> Path:
    """``model``'s files as the hub cache holds them; returns the snapshot folder."""
    folder = cache / ("models--" + REPO.replace("/", "--"))
    snapshot = folder / "snapshots" / revision
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for path in sorted(model.iterdir()):
        data = path.read_bytes()
        # The hub names an LFS file's blob by its sha256 (others by their git hash).
        blob = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / blob).write_bytes(data)
        (snapshot / path.name).symlink_to(f"../../blobs/{blob}")
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    return snapshot

"""Block keys: stable, versioned, prefix-chained hashes over token blocks.

A KV block is named by what produced it: the model (and everything else that
changes the bytes of its attention state) and *every* token before and inside
it. Block ``i``'s key is::

    key[-1] = blake2b-128(person="mg-kv-ns", VERSION || canonical namespace JSON)
    key[i]  = blake2b-128(person="mg-kv-blk", key[i-1] || tokens of block i as <u8)

Invariants:

* **Stable.** The encoding is canonical (sorted-key ASCII JSON for the namespace,
  little-endian unsigned 64-bit integers for tokens) and the hash is blake2b from
  ``hashlib``, so a key is identical in every process, on every platform and
  Python version. The builtin ``hash`` (salted per process by ``PYTHONHASHSEED``)
  is never used.
* **Chained.** Two requests share block ``i``'s key only if they share all tokens
  of blocks ``0..i``: a key found in the store always stands for a whole prefix,
  so a longest-prefix lookup is a walk over keys until the first miss.
* **Namespaced.** Model id, dtype, layout, tensor-parallel rank and block size
  are hashed into the root; blocks of another model, precision or rank can never
  be returned for the same tokens.
* **Versioned.** :data:`KEY_VERSION` is hashed into the root: a change to this
  encoding changes every key, so old blocks simply stop matching.

blake2b rather than xxh3: keys come from untrusted prompts, and a cryptographic
hash keeps one tenant from crafting a prefix that collides with another's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mouthguard.errors import KVCacheError

#: Hashed into every root key; bump on any change to the encoding below.
KEY_VERSION = "mouthguard-kv-key/1"
#: Bytes of a key (blake2b-128).
KEY_BYTES = 16
_MAX_TOKEN = 2**64 - 1


@dataclass(frozen=True)
class KVNamespace:
    """What, besides the tokens, determines a block's bytes.

    Attributes:
        model_id: the model (name and revision, e.g. ``meta-llama/Llama-3-8B@main``).
        dtype: the KV dtype (``bfloat16``, ``fp8_e4m3``, ...); empty if not stated.
        layout: the block layout (e.g. ``[layers,2,kv_heads,tokens,head_dim]``).
        tp_rank: tensor-parallel rank whose heads the blocks hold.
        tp_size: tensor-parallel world size.
    """

    model_id: str
    dtype: str = ""
    layout: str = ""
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise KVCacheError("a KV namespace needs a non-empty model id")
        if not 0 <= self.tp_rank < self.tp_size:
            raise KVCacheError(f"tp_rank {self.tp_rank} outside tp_size {self.tp_size}")

    def canonical(self, block_tokens: int) -> bytes:
        """The namespace's canonical bytes (with the key version and block size)."""
        fields = {
            "version": KEY_VERSION,
            "model_id": self.model_id,
            "dtype": self.dtype,
            "layout": self.layout,
            "tp_rank": self.tp_rank,
            "tp_size": self.tp_size,
            "block_tokens": block_tokens,
        }
        return json.dumps(fields, sort_keys=True, ensure_ascii=True, separators=(",", ":")).encode()


def as_namespace(namespace: str | KVNamespace) -> KVNamespace:
    """A :class:`KVNamespace` from a plain model id, or the namespace itself."""
    return namespace if isinstance(namespace, KVNamespace) else KVNamespace(model_id=namespace)


def root_key(namespace: KVNamespace, block_tokens: int) -> bytes:
    """The chain's seed: the namespace's key (see the module docstring)."""
    digest = hashlib.blake2b(digest_size=KEY_BYTES, person=b"mg-kv-ns")
    digest.update(namespace.canonical(block_tokens))
    return digest.digest()


def token_array(token_ids: Sequence[int] | npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Token ids as a 1-D ``<u8`` array (the canonical encoding).

    Raises:
        KVCacheError: not a 1-D sequence of integers in ``[0, 2**64)``.
    """
    try:
        raw = np.asarray(token_ids)
    except (TypeError, ValueError) as exc:
        raise KVCacheError(f"token ids must be a sequence of integers: {exc}") from exc
    if raw.ndim != 1:
        raise KVCacheError(f"token ids must be one-dimensional, got shape {raw.shape}")
    if raw.size == 0:
        return np.zeros(0, dtype="<u8")
    if raw.dtype.kind not in "iu":
        if raw.dtype == object and all(isinstance(t, int) for t in raw.tolist()):
            ints = raw.tolist()
            if min(ints) < 0 or max(ints) > _MAX_TOKEN:
                raise KVCacheError("token ids must lie in [0, 2**64)")
            return np.asarray(ints, dtype="<u8")
        raise KVCacheError(f"token ids must be integers, got {raw.dtype}")
    if raw.dtype.kind == "i" and int(raw.min()) < 0:
        raise KVCacheError(f"token ids must be non-negative, got {int(raw.min())}")
    return raw.astype("<u8", copy=False)


def chain_keys(root: bytes, tokens: npt.NDArray[Any], block_tokens: int) -> list[bytes]:
    """Keys of every *full* block of ``tokens`` (a trailing partial block has none)."""
    keys: list[bytes] = []
    previous = root
    for start in range(0, tokens.size - block_tokens + 1, block_tokens):
        digest = hashlib.blake2b(digest_size=KEY_BYTES, person=b"mg-kv-blk")
        digest.update(previous)
        digest.update(tokens[start : start + block_tokens].tobytes())
        previous = digest.digest()
        keys.append(previous)
    return keys


class KeyChain:
    """Computes block keys for one namespace and block size.

    Args:
        namespace: the model id or a full :class:`KVNamespace`.
        block_tokens: tokens per block (positive).
    """

    def __init__(self, namespace: str | KVNamespace, block_tokens: int) -> None:
        if not isinstance(block_tokens, int) or block_tokens <= 0:
            raise KVCacheError(f"block_tokens must be a positive integer, got {block_tokens!r}")
        self.namespace = as_namespace(namespace)
        self.block_tokens = block_tokens
        self.root = root_key(self.namespace, block_tokens)

    def keys(self, token_ids: Sequence[int] | npt.NDArray[Any]) -> list[bytes]:
        """The keys of every full block of ``token_ids``, in order."""
        return chain_keys(self.root, token_array(token_ids), self.block_tokens)

import os
import subprocess
import sys

import numpy as np
import pytest

from mouthguard.errors import KVCacheError
from mouthguard.kvcache.keys import KEY_VERSION, KeyChain, KVNamespace

SCRIPT = """
from mouthguard.kvcache.keys import KeyChain, KVNamespace
ns = KVNamespace("llama-3-8b", dtype="bfloat16", layout="L2HTD", tp_rank=1, tp_size=2)
chain = KeyChain(ns, 16)
print(",".join(k.hex() for k in chain.keys(list(range(100)))))
"""


def test_block_keys_chain_over_every_earlier_token() -> None:
    chain = KeyChain("m", 4)
    base = list(range(12))
    keys = chain.keys(base)
    assert len(keys) == 3
    changed = chain.keys([99, *base[1:]])  # first token differs: every key differs
    assert all(a != b for a, b in zip(keys, changed, strict=True))
    tail = chain.keys([*base[:8], 7, 7, 7, 7])  # only block 2 differs
    assert tail[:2] == keys[:2]
    assert tail[2] != keys[2]
    assert chain.keys([*base, 1, 2]) == keys  # a trailing partial block has no key


def test_namespace_separates_models_dtypes_layouts_and_ranks() -> None:
    tokens = list(range(16))
    variants = [
        KVNamespace("a"),
        KVNamespace("b"),
        KVNamespace("a", dtype="bfloat16"),
        KVNamespace("a", layout="x"),
        KVNamespace("a", tp_rank=1, tp_size=2),
    ]
    first = {KeyChain(ns, 4).keys(tokens)[0] for ns in variants}
    assert len(first) == len(variants)
    assert KeyChain("a", 4).keys(tokens)[0] != KeyChain("a", 8).keys(tokens)[0]


def test_keys_are_identical_in_another_process_with_another_hash_seed() -> None:
    here = {}
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        here[seed] = out.stdout.strip()
    chain = KeyChain(KVNamespace("llama-3-8b", "bfloat16", "L2HTD", 1, 2), 16)
    mine = ",".join(k.hex() for k in chain.keys(list(range(100))))
    assert here["0"] == here["12345"] == mine


def test_keys_are_pinned_by_a_golden_value() -> None:
    # A change to the encoding must bump KEY_VERSION (which changes every key anyway).
    assert KEY_VERSION == "mouthguard-kv-key/1"
    key = KeyChain("golden", 4).keys([1, 2, 3, 4])[0]
    assert key.hex() == GOLDEN


GOLDEN = "60caee4883f375fee8a8ee308b9f6da7"


def test_token_encodings_agree() -> None:
    chain = KeyChain("m", 4)
    as_list = chain.keys([1, 2, 3, 4])
    assert chain.keys(np.array([1, 2, 3, 4], dtype=np.int32)) == as_list
    assert chain.keys(np.array([1, 2, 3, 4], dtype=np.uint64)) == as_list


@pytest.mark.parametrize(
    "bad", [[-1, 2, 3, 4], [[1, 2], [3, 4]], [1.5, 2.0, 3.0, 4.0], ["a", "b", "c", "d"]]
)
def test_bad_tokens_are_refused(bad: object) -> None:
    with pytest.raises(KVCacheError):
        KeyChain("m", 4).keys(bad)  # type: ignore[arg-type]


def test_bad_namespaces_are_refused() -> None:
    with pytest.raises(KVCacheError):
        KVNamespace("")
    with pytest.raises(KVCacheError):
        KVNamespace("m", tp_rank=2, tp_size=2)
    with pytest.raises(KVCacheError):
        KeyChain("m", 0)

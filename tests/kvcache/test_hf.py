"""The Hugging Face client: identical greedy tokens, fewer prefill tokens, across processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mouthguard.errors import KVCacheError
from mouthguard.kvcache.hf import PrefixReuse
from tests.kvcache.hf_model import BLOCK_TOKENS, open_store, prompts, tiny_llama

REPO = Path(__file__).parents[2]
NEW_TOKENS = 12


def test_reference_run_matches_transformers_generate(tmp_path: Path) -> None:
    model = tiny_llama()
    first, _ = prompts()
    with open_store(tmp_path / "kv", model) as store:
        mine = PrefixReuse(model, store).generate(first, NEW_TOKENS, reuse=False)
        assert store.longest_prefix(first) == 0  # the reference run leaves the store alone
    with torch.no_grad():
        theirs = model.generate(
            torch.tensor([first]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )
    assert mine.tokens == theirs[0, len(first) :].tolist()
    assert mine.prefill_computed == len(first)


def test_a_shared_prefix_is_reused_with_identical_tokens(tmp_path: Path) -> None:
    model = tiny_llama()
    first, second = prompts()
    with open_store(tmp_path / "kv", model) as store:
        client = PrefixReuse(model, store)
        want_first = client.generate(first, NEW_TOKENS, reuse=False)
        want_second = client.generate(second, NEW_TOKENS, reuse=False)

        got_first = client.generate(first, NEW_TOKENS)
        assert got_first.tokens == want_first.tokens
        assert got_first.prefill_reused == 0
        assert got_first.blocks_stored == len(first) // BLOCK_TOKENS

        got_second = client.generate(second, NEW_TOKENS)
        assert got_second.tokens == want_second.tokens
        assert got_second.prefill_reused == 96
        assert got_second.prefill_computed == len(second) - 96
        assert got_second.prefill_computed < want_second.prefill_computed

        again = client.generate(second, NEW_TOKENS)  # the whole prompt is covered now
        assert again.tokens == want_second.tokens
        assert again.prefill_computed == len(second) - again.prefill_reused >= 1


@pytest.mark.slow
def test_a_new_process_reuses_the_prefix_from_disk(tmp_path: Path) -> None:
    model = tiny_llama()
    first, second = prompts()
    directory = tmp_path / "kv"
    with open_store(directory, model) as store:
        client = PrefixReuse(model, store)
        want = client.generate(second, NEW_TOKENS, reuse=False)
        client.generate(first, NEW_TOKENS)  # only the first request was served here
    out = subprocess.run(
        [sys.executable, "-m", "tests.kvcache.hf_model", str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tokens"] == want.tokens
    assert result["prefill_reused"] == 96
    assert result["prefill_computed"] == len(second) - 96


def test_blocks_of_another_layout_are_refused(tmp_path: Path) -> None:
    model = tiny_llama()
    first, _ = prompts()
    with open_store(tmp_path / "kv", model) as store:
        store.put(first[:16], [torch.zeros(3, 3)])
        with pytest.raises(KVCacheError, match="layout"):
            PrefixReuse(model, store).generate(first, 2)
        with pytest.raises(KVCacheError):
            PrefixReuse(model, store).generate([], 2)

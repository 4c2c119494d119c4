"""One engine-test run for the ``mouthguard`` load format (run by test_vllm_loader.py).

Usage: ``python loader_e2e.py WORKDIR`` with the vLLM environment's interpreter.
Saves the tiny model, copies its weights into a mouthguard checkpoint store (run
``tiny``, step 3) and files it in a Hugging Face hub cache layout (every file of
``snapshots/<rev>/`` a link into ``blobs/``), then starts three engines one after
another -- vLLM's own ``safetensors`` loader, ``load_format="mouthguard"`` on the
hub snapshot, and on the checkpoint, with a model directory that holds only
``config.json`` (so no other loader could have found weights) -- and writes, for
each, the generated tokens, the top-5 log-probabilities of every prompt and
generated position, and the seconds from ``LLM(...)`` to the first request's end,
to ``WORKDIR/result.json``. These three run in this process (``in_process``): what
they compare is the weights each loader gives, not where the loader runs. A fourth
start, on a copy of the checkpoint with one byte flipped, must fail: its error and
the engine's log are written too; it has the layout a user's engine has (a core
process and a worker process), so the error is checked where a user would meet it.
A fifth engine runs the checkpoint with tensor parallelism 2 (two worker processes,
each loading its own slices, which find the load format through mouthguard's vLLM
plugin entry point) and the mouthguard KV connector on disk, and sends the prompts
twice with vLLM's prefix cache reset in between, so that the second pass's full
blocks come from the connector's per-rank stores.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(Path(__file__).parents[3]))  # the repository: tests.weights
from common import close_engine, make_model, prompt, quiet_engine, start_engine, write_result

PROMPTS = [prompt(10, 300), prompt(11, 77)]


def logprob_rows(rows: Any) -> list[dict[str, float]]:
    """Each position's top log-probabilities as {token: value} (None rows skipped)."""
    return [{str(t): float(p.logprob) for t, p in row.items()} for row in rows or [] if row]


def run_engine(model: Path, load_format: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    from vllm import SamplingParams  # noqa: PLC0415

    started = time.perf_counter()
    llm = start_engine(
        model, in_process=True, load_format=load_format, model_loader_extra_config=extra or {}
    )
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=5, prompt_logprobs=5)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    result = {
        "seconds_to_first_output": seconds,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "prompt_logprobs": [logprob_rows(o.prompt_logprobs) for o in outputs],
        "logprobs": [logprob_rows(o.outputs[0].logprobs) for o in outputs],
    }
    close_engine(llm)
    return result


def failed_start(model: Path, extra: dict[str, Any], log: Path) -> dict[str, Any]:
    """Start an engine that must fail to load; what it raised and logged.

    The engine's worker process logs the loader's error (vLLM's logger writes to
    standard output, tracebacks go to standard error), so both descriptors, which
    the engine's processes inherit, are sent to ``log`` for the start.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with log.open("w") as sink:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            try:
                llm = start_engine(model, load_format="mouthguard", model_loader_extra_config=extra)
            except Exception as exc:  # vLLM re-raises the engine's failure as its own
                raised = f"{type(exc).__name__}: {exc}"
            else:
                close_engine(llm)
                raised = ""
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
    return {"raised": raised, "log": log.read_text(errors="replace")[-20000:]}


def cpu_bind(ranks: int) -> str | None:
    """vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers, one CPU each.

    vLLM binds each CPU worker's threads to a NUMA node and refuses more workers
    than nodes; one CPU per worker, named explicitly, is what it asks for instead.
    None when this process may run on fewer CPUs than ``ranks``.
    """
    cpus = sorted(os.sched_getaffinity(0))
    return "|".join(str(c) for c in cpus[:ranks]) if len(cpus) >= ranks else None


def run_tensor_parallel(model: Path, store: Path, kv_dir: Path) -> dict[str, Any]:
    """The checkpoint at tensor parallelism 2 with the KV connector; see the module docstring."""
    bind = cpu_bind(2)
    if bind is None:
        return {"skipped": "fewer than 2 CPUs for 2 tensor-parallel workers"}
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    from vllm import SamplingParams  # noqa: PLC0415
    from vllm.config import KVTransferConfig  # noqa: PLC0415

    kv = KVTransferConfig(
        kv_connector="MouthguardConnector",
        kv_connector_module_path="mouthguard.integrations.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={
            "disk_dir": str(kv_dir),
            "memory_bytes": 1 << 20,
            "disk_bytes": 1 << 28,
        },
    )
    llm = start_engine(
        model,
        load_format="mouthguard",
        model_loader_extra_config={"source": str(store), "run": "tiny", "step": 3},
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        kv_transfer_config=kv,
    )
    params = SamplingParams(max_tokens=8, temperature=0.0)
    requests = [{"prompt_token_ids": p} for p in PROMPTS]
    first = llm.generate(requests, params, use_tqdm=False)
    llm.reset_prefix_cache()
    second = llm.generate(requests, params, use_tqdm=False)
    close_engine(llm)
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in first],
        "tokens_again": [list(o.outputs[0].token_ids) for o in second],
        "cached_again": [o.num_cached_tokens for o in second],
        "rank_dirs": sorted(d.name for d in kv_dir.iterdir() if any(d.rglob("*"))),
    }


def main() -> None:
    quiet_engine()
    work = Path(sys.argv[1])
    model = make_model(work / "model")
    from safetensors.torch import load_file  # noqa: PLC0415

    import mouthguard  # noqa: PLC0415
    from tests.weights.helpers import make_hub_cache  # noqa: PLC0415 - torch-heavy

    state = load_file(str(model / "model.safetensors"))
    store = work / "store"
    mouthguard.Checkpointer(store, run="tiny", background=False).save(3, state)
    config_only = work / "config-only"
    config_only.mkdir(exist_ok=True)
    shutil.copy(model / "config.json", config_only / "config.json")
    hub = work / "hub"
    snapshot = next(hub.glob("models--*/snapshots/*"), None) or make_hub_cache(hub, model)
    damaged = work / "damaged-store"
    if not damaged.exists():
        shutil.copytree(store, damaged)
        rank_file = next(damaged.glob("**/tiny/*/rank-00000.safetensors"))
        data = bytearray(rank_file.read_bytes())
        data[-3] ^= 0xFF  # in the last tensor's data
        rank_file.write_bytes(bytes(data))
    result = {
        "safetensors": run_engine(model, "safetensors", None),
        # No engine on the plain directory: the snapshot is one with links, which is the
        # same loader path plus the link rule (the plain folder is tests/weights' job),
        # and every engine start costs a minute or more on a small machine (in its own
        # processes; the three here run in this one).
        "mouthguard_hub": run_engine(snapshot, "mouthguard", None),
        "mouthguard_checkpoint": run_engine(
            config_only, "mouthguard", {"source": str(store), "run": "tiny", "step": 3}
        ),
        # The same checkpoint with one byte flipped: the engine must not start.
        "mouthguard_damaged": failed_start(
            config_only, {"source": str(damaged), "run": "tiny", "step": 3}, work / "damaged.log"
        ),
        # Last: it sets the CPU binding in this process's environment for its workers.
        "tensor_parallel": run_tensor_parallel(config_only, store, work / "kv"),
    }
    write_result(work / "result.json", result)


if __name__ == "__main__":
    main()

"""Engine start to first token with one vLLM ``load_format``, cold and warm page cache.

Run with the vLLM environment's interpreter (``benchmarks.vllm.load`` does)::

    .venv-vllm/bin/python benchmarks/vllm/load_engine.py --format mouthguard --work /tmp/w
    .venv-vllm/bin/python benchmarks/vllm/load_engine.py --prepare --work /tmp/w

``--prepare`` saves the random Llama (``save_pretrained``: one safetensors file)
and serializes it for tensorizer (vLLM's own ``tensorize_vllm_model``), untimed.
A run starts one engine per cache state in ``--cache`` (``cold``: the weights'
files evicted from the page cache first, see ``benchmarks.harness.CacheDrop``;
``warm``: right after the cold run read them), times ``LLM(...)`` to the end of a
one-token request (start to first token; importing vLLM in this process is
before the clock), then generates 8 tokens untimed (compared across formats).
The engine's model runner's ``load_model`` (building the model and filling its
weights, as vLLM does it for every format), and within it the format's loader's
``load_weights`` (reading the files and the model's copies into its parameters),
are timed inside the engine process by wrappers this module installs in every
process the engine spawns. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository and the engine helpers
    sys.path.insert(0, str(Path(__file__).parents[2]))
    sys.path.insert(0, str(Path(__file__).parents[2] / "tests/integrations/vllm_scripts"))
from common import close_engine, make_model, prompt, start_engine

#: The model: a random Llama of 0.92 GB in float32 (229 M parameters), big enough
#: that reading it is a visible part of an engine's start on this machine.
MODEL = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
FORMATS = ["safetensors", "mouthguard", "runai_streamer", "fastsafetensors", "tensorizer"]
TIMES_ENV = "MG_BENCH_LOAD_TIMES"  # the file each engine process appends its load time to
TENSORIZED = "model.tensors"


def _time_model_loads() -> None:
    """Wrap the CPU model runner's ``load_model`` to log its seconds.

    Runs at import, so in every process the engine spawns (spawn re-runs this
    module as ``__mp_main__``): the model is loaded in the engine's own process.
    """
    log = os.environ.get(TIMES_ENV)
    if not log:
        return
    from vllm.model_executor import model_loader  # noqa: PLC0415
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner  # noqa: PLC0415

    def record(key: str, seconds: float) -> None:
        with open(log, "a") as handle:
            handle.write(json.dumps({key: seconds}) + "\n")

    original = CPUModelRunner.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        original(self, *args, **kwargs)
        record("load_s", time.perf_counter() - started)

    CPUModelRunner.load_model = load_model
    # The loader's own load_weights (reading the files and the model's copies into its
    # parameters), on the loader object vLLM builds for the format, whatever its class.
    make_loader = model_loader.get_model_loader

    def get_model_loader(load_config: Any) -> Any:
        loader = make_loader(load_config)
        weights = loader.load_weights

        def load_weights(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            out = weights(*args, **kwargs)
            record("weights_s", time.perf_counter() - started)
            return out

        loader.load_weights = load_weights
        return loader

    model_loader.get_model_loader = get_model_loader


def model_dir(work: Path) -> Path:
    return work / "model"


def weight_bytes(work: Path) -> int:
    """The tensor bytes of the safetensors file (its size less the header).

    Not the loaded model's parameters: vLLM's CPU backend repacks the linear
    layers after loading and leaves their parameters empty.
    """
    path = model_dir(work) / "model.safetensors"
    with path.open("rb") as handle:
        header = int.from_bytes(handle.read(8), "little")
    return path.stat().st_size - 8 - header


def prepare(work: Path) -> None:
    """The model directory and its tensorizer file (both kept for later runs).

    The tensorizer file holds the same state dict as the safetensors file,
    written with tensorizer's own ``TensorSerializer``: vLLM then streams it to
    the CPU and hands it to the model's ``load_weights``, as for every other
    format. (vLLM's ``tensorize_vllm_model`` is no use on a CPU: it serializes the
    model after the CPU backend repacked its linear layers, which it writes as
    empty tensors, and then fetches the model's other files from the Hugging
    Face hub by name, which fails for a local directory.)
    """
    model = make_model(model_dir(work), **MODEL)
    tensorized = work / "tensorizer" / TENSORIZED
    if tensorized.exists():
        return
    tensorized.parent.mkdir(exist_ok=True)
    from safetensors.torch import load_file  # noqa: PLC0415
    from tensorizer import TensorSerializer  # noqa: PLC0415

    partial = tensorized.with_suffix(".partial")
    serializer = TensorSerializer(str(partial))
    serializer.write_state_dict(load_file(str(model / "model.safetensors")))
    serializer.close()
    partial.rename(tensorized)


def load_options(fmt: str, work: Path) -> dict[str, Any]:
    if fmt == "tensorizer":
        uri = str(work / "tensorizer" / TENSORIZED)
        return {"load_format": fmt, "model_loader_extra_config": {"tensorizer_uri": uri}}
    return {"load_format": fmt}


def weight_files(fmt: str, work: Path) -> Path:
    """The directory whose files this format reads (evicted for a cold start)."""
    return work / "tensorizer" if fmt == "tensorizer" else model_dir(work)


def start_once(fmt: str, work: Path, cold: bool) -> dict[str, Any]:
    from vllm import SamplingParams  # noqa: PLC0415

    from benchmarks.harness import CacheDrop  # noqa: PLC0415 - torch and rich: vLLM has both

    if cold:
        CacheDrop().drop(weight_files(fmt, work))
    log = Path(os.environ[TIMES_ENV])
    log.write_text("")
    request = [{"prompt_token_ids": prompt(0, 128)}]
    started = time.perf_counter()
    llm = start_engine(model_dir(work), **load_options(fmt, work))
    llm.generate(request, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    first_token = time.perf_counter() - started
    out = llm.generate(request, SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
    close_engine(llm)
    times = [json.loads(line) for line in log.read_text().splitlines() if line]
    loads = [t["load_s"] for t in times if "load_s" in t]
    weights = [t["weights_s"] for t in times if "weights_s" in t]
    return {
        "start_to_first_token_s": first_token,
        "load_s": loads[-1] if loads else None,
        "weights_s": weights[-1] if weights else None,
        "tokens": list(out[0].outputs[0].token_ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("--format", choices=FORMATS)
    parser.add_argument("--cache", default="cold,warm")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.work)
        print(json.dumps({"weight_bytes": weight_bytes(args.work)}), flush=True)
        return
    os.environ.setdefault(TIMES_ENV, str(args.work / f"load-times-{os.getpid()}.jsonl"))
    result: dict[str, Any] = {"format": args.format}
    for state in args.cache.split(","):
        result[state] = start_once(args.format, args.work, cold=state == "cold")
    print(json.dumps(result), flush=True)


os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
_time_model_loads()

if __name__ == "__main__":
    main()

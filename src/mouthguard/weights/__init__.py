"""Inference cold start: model weights from storage into device memory at the disk's speed.

::

    from mouthguard import weights
    loaded = weights.load("/models/llama-3-8b", device="cuda")        # HF safetensors dir
    loaded = weights.load("s3://models/llama-3-8b", device="cuda", cache_dir="/nvme/cache")
    loaded = weights.load("./store", run="sft", device="cuda:0")       # newest checkpoint
    tp = weights.TensorParallel(rank, 2, (("*.q_proj.weight", 0), ("*.o_proj.weight", 1)))
    loaded = weights.load("/models/llama-3-8b", device=f"cuda:{rank}", tensor_parallel=tp)
    stream = weights.iter_tensors("/models/llama-3-8b")   # one tensor at a time, no copy
    model.load_weights(stream)                            # a checksum error raises in here

See :func:`mouthguard.weights.loader.load` for the contract,
and :mod:`mouthguard.weights.stream` for the streaming one.
"""

from mouthguard.weights.loader import LoadedWeights, load
from mouthguard.weights.sharding import Split, TensorParallel, parse_rules
from mouthguard.weights.stream import StreamStats, TensorStream, iter_tensors

__all__ = [
    "LoadedWeights",
    "Split",
    "StreamStats",
    "TensorParallel",
    "TensorStream",
    "iter_tensors",
    "load",
    "parse_rules",
]

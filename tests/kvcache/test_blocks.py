import numpy as np
import pytest
import torch

from mouthguard.errors import FormatError, KVCacheError
from mouthguard.kvcache.blocks import BlockDesc, block_checksum, decode, encode, parse_desc

KEY = bytes(16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int8])
def test_torch_blocks_round_trip_with_dtype_and_shape(dtype: torch.dtype) -> None:
    block = (torch.randn(2, 3, 5) * 10).to(dtype)
    payload = encode(KEY, block)
    again = decode(payload.data.copy(), payload.desc)
    assert again.dtype == dtype
    assert again.shape == block.shape
    assert torch.equal(again, block)


def test_numpy_blocks_round_trip_and_the_copy_is_private() -> None:
    block = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    payload = encode(KEY, block)
    block[:] = 0  # the caller reuses its buffer
    again = decode(payload.data.copy(), payload.desc)
    assert again.dtype == np.float16
    assert np.array_equal(again, np.arange(24, dtype=np.float16).reshape(2, 3, 4))


def test_decode_fills_caller_buffers_and_devices() -> None:
    block = torch.randn(4, 8)
    payload = encode(KEY, block)
    out = torch.empty(4, 8)
    assert decode(payload.data.copy(), payload.desc, out=out) is out
    assert torch.equal(out, block)
    on_cpu = decode(payload.data.copy(), payload.desc, device="cpu")
    assert torch.equal(on_cpu, block)
    np_out = np.empty(32, dtype=np.float32)
    decode(payload.data.copy(), payload.desc, out=np_out)
    assert np.array_equal(np_out, block.numpy().reshape(-1))
    with pytest.raises(KVCacheError):
        decode(payload.data.copy(), payload.desc, out=torch.empty(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_blocks_come_to_host_and_go_back() -> None:
    block = torch.randn(4, 8, device="cuda", dtype=torch.bfloat16)
    payload = encode(KEY, block)
    again = decode(payload.data.copy(), payload.desc, device="cuda")
    assert again.device.type == "cuda"
    assert torch.equal(again, block)


def test_checksum_binds_the_key() -> None:
    data = np.arange(16, dtype=np.uint8)
    assert block_checksum(KEY, data) != block_checksum(b"\x01" * 16, data)
    assert encode(KEY, data).checksum == block_checksum(KEY, data)


def test_unsupported_blocks_are_refused() -> None:
    with pytest.raises(KVCacheError):
        encode(KEY, [1, 2, 3])
    with pytest.raises(KVCacheError):
        encode(KEY, np.array(["a"], dtype=object))
    with pytest.raises(KVCacheError):
        encode(KEY, torch.zeros(2, dtype=torch.complex64))


def test_descriptions_are_parsed_as_hostile_input() -> None:
    desc = BlockDesc("torch", "bfloat16", (2, 3))
    assert parse_desc(desc.encode(), 12) == desc
    with pytest.raises(FormatError):
        parse_desc(desc.encode(), 13)  # shape does not match the payload
    with pytest.raises(FormatError):
        parse_desc(desc.encode()[:-1], 12)
    with pytest.raises(FormatError):
        parse_desc(BlockDesc("torch", "nonsense", (2,)).encode(), 4)
    with pytest.raises(FormatError):
        parse_desc(BlockDesc("numpy", "|O", (1,)).encode(), 8)
    with pytest.raises(FormatError):
        parse_desc(b"\x07" + desc.encode()[1:], 12)

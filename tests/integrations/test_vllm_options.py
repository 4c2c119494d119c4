"""The vLLM plug-ins' plain-Python parts: options, and importing without vLLM."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from mouthguard.errors import KVCacheError
from mouthguard.integrations.vllm.options import (
    DEFAULTS,
    open_remote,
    parse_options,
    rank_disk_dir,
)
from mouthguard.tiers.local import LocalTier


def test_extra_config_uses_kvstores_own_names() -> None:
    options = parse_options(
        {"disk_dir": "/kv", "disk_bytes": 1 << 30, "policy": "s3fifo", "remote": "s3://b/kv"}
    )
    assert options.store == {
        **DEFAULTS,
        "disk_dir": "/kv",
        "disk_bytes": 1 << 30,
        "policy": "s3fifo",
    }
    assert options.remote == "s3://b/kv"
    assert options.model_id is None
    assert parse_options(None).store == DEFAULTS


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"disk_byte": 1}, "unknown mouthguard connector option"),
        ({"memory_bytes": "1GiB"}, "must be int"),
        ({"memory_bytes": True}, "must be int"),
        ({"direct_io": 1}, "must be bool"),
    ],
)
def test_a_misspelt_or_mistyped_option_is_refused(extra: dict[str, object], message: str) -> None:
    with pytest.raises(KVCacheError, match=message):
        parse_options(extra)


def test_each_tensor_parallel_rank_gets_its_own_directory() -> None:
    assert rank_disk_dir("/kv", 0, 1) == "/kv"
    assert rank_disk_dir("/kv", 1, 2) == str(Path("/kv") / "tp001-of-002")


def test_a_directory_remote_is_a_local_tier(tmp_path: Path) -> None:
    tier = open_remote(str(tmp_path / "remote"))
    assert isinstance(tier, LocalTier)
    assert (tmp_path / "remote").is_dir()


def test_the_package_imports_without_vllm_and_says_what_is_missing() -> None:
    # run where vLLM is absent (the project's environment): the plain parts import,
    # the connector's name raises the ImportError of vLLM itself
    code = (
        "import sys, mouthguard.integrations.vllm as v\n"
        "assert 'vllm' not in sys.modules\n"
        "try:\n    v.MouthguardConnector\nexcept ImportError as e:\n    print('missing', e.name)\n"
        "else:\n    print('present')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    expected = "present" if importlib.util.find_spec("vllm") else "missing vllm"
    assert out == expected
    with pytest.raises(AttributeError):
        _ = importlib.import_module("mouthguard.integrations.vllm").NoSuchThing

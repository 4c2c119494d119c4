"""The vLLM plug-ins' plain-Python parts: options, and importing without vLLM."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from mouthguard.config import load_config
from mouthguard.errors import ConfigError, KVCacheError
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
        ({"async_load": "yes"}, "must be bool"),
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


def _toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_options_come_from_a_named_mouthguard_toml(tmp_path: Path) -> None:
    config = _toml(
        tmp_path / "mouthguard.toml",
        '[kvcache]\ndisk_dir = "kv"\ndisk_bytes = 1073741824\npolicy = "s3fifo"\n'
        'remote = "shared-remote"\n',
    )
    options = parse_options({"config": str(config)}, environ={})
    assert options.store == {
        **DEFAULTS,
        "disk_dir": str(tmp_path / "kv"),  # relative to the file, as tier paths are
        "disk_bytes": 1 << 30,
        "policy": "s3fifo",
    }
    assert options.remote == str(tmp_path / "shared-remote")
    assert options.config_file == str(config)


def test_explicit_extra_config_keys_win_over_the_file(tmp_path: Path) -> None:
    config = _toml(
        tmp_path / "mouthguard.toml",
        '[kvcache]\ndisk_dir = "/kv"\nmemory_bytes = 1024\nremote = "s3://b/kv"\n',
    )
    options = parse_options({"config": str(config), "memory_bytes": 2048}, environ={})
    assert options.store["memory_bytes"] == 2048
    assert options.store["disk_dir"] == "/kv"
    assert options.remote == "s3://b/kv"  # a URL is kept as written


def test_async_load_is_off_unless_asked_for_in_the_file_or_the_extra_config(
    tmp_path: Path,
) -> None:
    assert parse_options(None).async_load is False
    assert parse_options({"async_load": True}).async_load is True
    config = _toml(tmp_path / "mouthguard.toml", "[kvcache]\nasync_load = true\n")
    options = parse_options({"config": str(config)}, environ={})
    assert options.async_load is True
    assert "async_load" not in options.store  # the connector's option, not KVStore's
    assert parse_options({"config": str(config), "async_load": False}).async_load is False


def test_without_a_config_key_mouthguard_config_names_the_file(tmp_path: Path) -> None:
    config = _toml(tmp_path / "fleet.toml", "[kvcache]\nblock_tokens = 32\n")
    options = parse_options({}, environ={"MOUTHGUARD_CONFIG": str(config)})
    assert options.store["block_tokens"] == 32
    assert options.config_file == str(config)
    # nothing named and no variable: KVStore's defaults, no file looked for
    assert parse_options({}, environ={}).config_file is None


def test_the_store_sections_of_the_same_file_still_load(tmp_path: Path) -> None:
    # one mouthguard.toml can describe the checkpoint store and the KV connector
    config = _toml(
        tmp_path / "mouthguard.toml",
        '[[tiers]]\nname = "fast"\nkind = "local"\npath = "fast"\n\n[kvcache]\ndisk_dir = "kv"\n',
    )
    assert [t.name for t in load_config(config).tiers] == ["fast"]
    assert parse_options({"config": str(config)}, environ={}).store["disk_dir"] == str(
        tmp_path / "kv"
    )


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("[kvcache]\ndisk_byte = 1\n", KVCacheError, r"disk_byte.*in \[kvcache\] of"),
        ('[kvcache]\nmemory_bytes = "1GiB"\n', KVCacheError, r"\[kvcache\] of .* must be int"),
        ('kvcache = "kv"\n', ConfigError, r"\[kvcache\] must be a table"),
        ("[kvcache\n", ConfigError, "cannot read store configuration"),
    ],
)
def test_a_bad_file_is_refused_naming_it(
    tmp_path: Path, text: str, error: type[Exception], message: str
) -> None:
    config = _toml(tmp_path / "mouthguard.toml", text)
    with pytest.raises(error, match=message):
        parse_options({"config": str(config)}, environ={})


def test_a_missing_or_empty_config_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        parse_options({"config": str(tmp_path / "absent.toml")}, environ={})
    with pytest.raises(KVCacheError, match="must name a file"):
        parse_options({"config": ""}, environ={})

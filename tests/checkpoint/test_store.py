"""open_store: the embedded default directory and mouthguard.toml configurations."""

from __future__ import annotations

from pathlib import Path

import pytest

import mouthguard
from mouthguard.errors import ConfigError
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier


def test_directory_is_created_with_fast_and_durable_local_tiers(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "new" / "store")
    assert (tmp_path / "new" / "store").is_dir()
    assert [t.name for t in store.tiers] == ["fast", "durable"]
    assert all(isinstance(t, LocalTier) for t in store.tiers)
    assert len({t.domain for t in store.tiers}) == 2  # RF2 can be met out of the box
    assert store.fast.location().startswith(str((tmp_path / "new" / "store").resolve()))


def test_create_false_refuses_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no store"):
        mouthguard.open_store(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


def test_toml_with_relative_paths_and_domains(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "mouthguard.toml"
    config.parent.mkdir()
    config.write_text(
        '[[tiers]]\nname = "fast"\nkind = "local"\npath = "nvme"\ndomain = "node-a"\n\n'
        '[[tiers]]\nname = "ram"\nkind = "memory"\ndomain = "node-a-ram"\n'
    )
    store = mouthguard.open_store(config)
    assert [(t.name, t.domain) for t in store.tiers] == [("fast", "node-a"), ("ram", "node-a-ram")]
    assert isinstance(store.tiers[1], MemoryTier)
    assert Path(store.fast.location()).resolve() == (tmp_path / "conf" / "nvme").resolve()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not toml ===", "cannot read"),
        ("x = 1\n", "at least one"),
        ('[[tiers]]\nkind = "local"\npath = "a"\n', "'name' is required"),
        ('[[tiers]]\nname = "a"\nkind = "tape"\n', "unknown kind 'tape'"),
        ('[[tiers]]\nname = "a"\nkind = "local"\n', "needs 'path'"),
        ('[[tiers]]\nname = "../a"\nkind = "memory"\n', "invalid tier name"),
        ('[[tiers]]\nname = "a"\nkind = "memory"\nspeed = 3\n', "unknown keys"),
        (
            '[[tiers]]\nname = "a"\nkind = "memory"\n[[tiers]]\nname = "a"\nkind = "memory"\n',
            "unique",
        ),
    ],
)
def test_bad_configurations_are_clear(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "mouthguard.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        mouthguard.open_store(config)


def test_missing_toml_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        mouthguard.open_store(tmp_path / "mouthguard.toml")
    assert not (tmp_path / "mouthguard.toml").exists()


def test_a_file_that_is_not_a_store(tmp_path: Path) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("hello")
    with pytest.raises(ConfigError):
        mouthguard.open_store(plain)


def test_policy_section_reaches_the_store(tmp_path: Path) -> None:
    config = tmp_path / "mouthguard.toml"
    config.write_text(
        '[[tiers]]\nname = "fast"\nkind = "memory"\n\n'
        "[policy]\ntrash_delay_seconds = 60\n[policy.routine]\nkeep_last = 7\n"
    )
    store = mouthguard.open_store(config)
    assert store.policy.trash_delay_seconds == 60
    assert store.policy.levels[mouthguard.Importance.ROUTINE].keep_last == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[tiers]]\nname = "s"\nkind = "s3"\n', "needs url"),
        ('[[tiers]]\nname = "s"\nkind = "s3"\nurl = "http://x"\n', "needs url"),
        ('[[tiers]]\nname = "s"\nkind = "s3"\nurl = "s3://b"\npath = "x"\n', "unknown keys"),
        ('[[tiers]]\nname = "s"\nkind = "s3"\nurl = "s3://b"\nendpoint = 3\n', "'endpoint'"),
        ('[[tiers]]\nname = "a"\nkind = "memory"\n[policy]\nfrobs = 1\n', "frobs"),
        ('[[tiers]]\nname = "a"\nkind = "memory"\n[storage]\nx = 1\n', "top-level"),
    ],
)
def test_bad_s3_and_policy_configuration(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "mouthguard.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        mouthguard.open_store(config)


def test_create_false_refuses_a_directory_that_is_no_store(tmp_path: Path) -> None:
    """Opening to read (``mouthguard ls``) never turns a directory into a store."""
    with pytest.raises(ConfigError, match="no store at"):
        mouthguard.open_store(tmp_path, create=False)
    assert list(tmp_path.iterdir()) == []
    mouthguard.open_store(tmp_path)  # creating it is what writing commands do
    assert [t.name for t in mouthguard.open_store(tmp_path, create=False).tiers] == [
        "fast",
        "durable",
    ]

"""EncryptedTier: the conformance suite over memory and local tiers, plus tamper tests."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.config import load_config
from mouthguard.errors import (
    AuthenticationError,
    CheckpointFallbackWarning,
    ConfigError,
    EncryptionKeyError,
    NoValidCheckpointError,
    UnsupportedOperationError,
    is_data_damage,
)
from mouthguard.jobs.replicator import Replicator
from mouthguard.testing.conformance import MiB, TierConformance, payload
from mouthguard.tiers.base import Tier
from mouthguard.tiers.encrypted import (
    CHUNK_BYTES,
    HEADER_BYTES,
    TAG_BYTES,
    EncryptedTier,
    ciphertext_size,
    plaintext_size,
)
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
SMALL = 64  # a small chunk size, so tamper tests span many chunks cheaply


class TestEncryptedMemoryTier(TierConformance):
    @pytest.fixture
    def make_tier(self) -> Callable[[], Tier]:
        return lambda: EncryptedTier(MemoryTier(), KEY, key_id="k1")


class TestEncryptedLocalTier(TierConformance):
    @pytest.fixture
    def make_tier(self, tmp_path: Path) -> Callable[[], Tier]:
        return lambda: EncryptedTier(LocalTier(tmp_path / "root"), KEY, key_id="k1")


class TestEncryptedSmallChunks(TierConformance):
    """Chunk boundaries everywhere: every conformance range crosses several."""

    @pytest.fixture
    def make_tier(self) -> Callable[[], Tier]:
        return lambda: EncryptedTier(MemoryTier(), KEY, key_id="k1", chunk_size=7)


def tier(inner: Tier | None = None, **kwargs: object) -> EncryptedTier:
    options: dict[str, object] = {"key_id": "k1", "chunk_size": SMALL, **kwargs}
    return EncryptedTier(inner or MemoryTier(), KEY, **options)  # type: ignore[arg-type]


# --- format ------------------------------------------------------------------------


@pytest.mark.parametrize("plain", [0, 1, SMALL - 1, SMALL, SMALL + 1, 5 * SMALL, 5 * SMALL + 3])
def test_sizes_roundtrip_and_head_reports_plaintext(plain: int) -> None:
    stored = ciphertext_size(plain, SMALL)
    assert stored == HEADER_BYTES + plain + TAG_BYTES * (plain // SMALL + 1)
    assert plaintext_size(stored, SMALL) == plain
    t = tier()
    info = t.put("o", payload(plain))
    assert info.size == plain == t.head("o").size
    assert t.inner.head("o").size == stored


def test_impossible_sizes_are_rejected() -> None:
    valid = {ciphertext_size(p, SMALL) for p in range(0, 10 * SMALL)}
    for stored in range(0, max(valid)):
        assert (plaintext_size(stored, SMALL) is not None) == (stored in valid)


def test_ciphertext_hides_the_plaintext_and_differs_per_put() -> None:
    t = tier()
    secret = b"the weights of the model " * 40
    t.put("a", secret)
    first = t.inner.get("a")
    t.put("a", secret)
    assert t.inner.get("a") != first  # fresh salt and nonces on every put
    assert b"weights" not in first
    assert KEY not in first
    assert "k1" in repr(t)
    assert KEY.hex() not in repr(t)


def test_rename_is_not_offered() -> None:
    t = EncryptedTier(MemoryTier(), KEY, key_id="k")
    assert t.inner.capabilities.atomic_rename
    assert not t.capabilities.atomic_rename
    t.put("s/a", b"1")
    with pytest.raises(UnsupportedOperationError):
        t.rename_prefix("s", "t")


def test_ranged_reads_only_touch_the_chunks_they_need() -> None:
    class Counting(MemoryTier):
        read = 0

        def read_into(self, key: str, offset: int, out: memoryview) -> None:
            Counting.read += out.nbytes
            super().read_into(key, offset, out)

    t = EncryptedTier(Counting(), KEY, key_id="k1")
    data = payload(8 * MiB + 5)
    t.put("big", data)
    Counting.read = 0
    assert t.get("big", 5 * MiB + 10, 5 * MiB + 20) == data[5 * MiB + 10 : 5 * MiB + 20]
    assert Counting.read == CHUNK_BYTES + TAG_BYTES  # one chunk (the header is a small get)


# --- tampering ---------------------------------------------------------------------


def flip(t: EncryptedTier, key: str, offset: int) -> None:
    raw = bytearray(t.inner.get(key))
    raw[offset] ^= 0x01
    t.inner.put(key, bytes(raw))


def chunk_at(index: int) -> int:
    return HEADER_BYTES + index * (SMALL + TAG_BYTES)


@pytest.mark.parametrize(
    "offset", [0, 7, 9, 41, 50, 70, HEADER_BYTES - 5, HEADER_BYTES, chunk_at(2) + 3, chunk_at(4)]
)
def test_any_flipped_byte_is_detected(offset: int) -> None:
    t = tier()
    t.put("o", payload(4 * SMALL + 9))
    flip(t, "o", offset)
    with pytest.raises((AuthenticationError, EncryptionKeyError)) as excinfo:
        t.get("o")
    # Header fields a reader cannot use (magic, version, chunk size, key id, key
    # check) are "cannot read"; everything else is proven damage.
    assert isinstance(excinfo.value, AuthenticationError | EncryptionKeyError)


def test_flipped_chunk_is_damage_that_load_falls_back_from() -> None:
    t = tier()
    t.put("o", payload(4 * SMALL))
    flip(t, "o", chunk_at(1) + 5)
    with pytest.raises(AuthenticationError, match="chunk 1 fails authentication") as excinfo:
        t.get("o")
    assert is_data_damage(excinfo.value)
    # Ranges that avoid the damaged chunk still read (only the chunks needed are checked).
    assert t.get("o", 0, SMALL) == payload(4 * SMALL)[:SMALL]


def test_reordered_chunks_are_detected() -> None:
    t = tier()
    t.put("o", payload(4 * SMALL))
    raw = bytearray(t.inner.get("o"))
    one, two = slice(chunk_at(0), chunk_at(1)), slice(chunk_at(1), chunk_at(2))
    raw[one], raw[two] = raw[two], raw[one]
    t.inner.put("o", bytes(raw))
    with pytest.raises(AuthenticationError):
        t.get("o")


def test_chunks_swapped_between_objects_are_detected() -> None:
    t = tier()
    t.put("a", payload(3 * SMALL, seed=1))
    t.put("b", payload(3 * SMALL, seed=2))
    a, b = bytearray(t.inner.get("a")), t.inner.get("b")
    a[chunk_at(1) : chunk_at(2)] = b[chunk_at(1) : chunk_at(2)]
    t.inner.put("a", bytes(a))
    with pytest.raises(AuthenticationError):
        t.get("a")


def test_objects_swapped_between_names_are_detected() -> None:
    t = tier()
    t.put("run/1/rank", payload(100, seed=1))
    t.put("run/2/rank", payload(100, seed=2))
    t.inner.put("run/1/rank", t.inner.get("run/2/rank"))  # a whole, valid object, wrong name
    with pytest.raises(AuthenticationError):
        t.get("run/1/rank")


@pytest.mark.parametrize("cut", [1, TAG_BYTES, SMALL + TAG_BYTES])
def test_truncation_and_extension_are_detected(cut: int) -> None:
    t = tier()
    t.put("o", payload(4 * SMALL + 9))
    raw = t.inner.get("o")
    for forged in (raw[:-cut], raw + bytes(cut)):
        t.inner.put("o", forged)
        with pytest.raises(AuthenticationError):
            t.get("o")


def test_dropping_whole_trailing_chunks_is_detected() -> None:
    t = tier()
    t.put("o", payload(4 * SMALL + 9))
    t.inner.put("o", t.inner.get("o")[: chunk_at(2)] + t.inner.get("o")[chunk_at(4) :])
    with pytest.raises(AuthenticationError):
        t.get("o")


# --- keys --------------------------------------------------------------------------


def test_wrong_key_is_a_key_error_not_damage() -> None:
    inner = MemoryTier()
    tier(inner).put("o", b"secret")
    wrong = EncryptedTier(inner, OTHER, key_id="k1", chunk_size=SMALL)
    with pytest.raises(EncryptionKeyError, match="not the key it was encrypted with") as excinfo:
        wrong.get("o")
    assert not is_data_damage(excinfo.value)
    stranger = EncryptedTier(inner, OTHER, key_id="k2", chunk_size=SMALL)
    with pytest.raises(EncryptionKeyError, match="key id 'k1', which is not configured"):
        stranger.get("o")


def test_rotation_reads_old_objects_and_writes_with_the_new_key() -> None:
    inner = MemoryTier()
    tier(inner).put("old", b"written with k1")
    rotated = EncryptedTier(inner, OTHER, key_id="k2", old_keys={"k1": KEY}, chunk_size=SMALL)
    assert rotated.get("old") == b"written with k1"
    rotated.put("new", b"written with k2")
    assert b"k2" in inner.get("new")[:HEADER_BYTES]
    with pytest.raises(EncryptionKeyError):
        tier(inner).get("new")


def test_plaintext_objects_are_not_read_as_damage() -> None:
    inner = MemoryTier()
    inner.put("plain", b"x" * 200)  # written before the tier was encrypted
    with pytest.raises(EncryptionKeyError, match="bad magic"):
        tier(inner).get("plain")


def test_bad_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        EncryptedTier(MemoryTier(), b"short", key_id="k")
    with pytest.raises(ConfigError):
        EncryptedTier(MemoryTier(), KEY, key_id="bad id!")


# --- configuration and checkpoints -------------------------------------------------


def encrypted_config(tmp_path: Path, variable: str = "MG_TEST_TIER_KEY") -> Path:
    config = tmp_path / "mouthguard.toml"
    config.write_text(
        "[[tiers]]\nname = 'fast'\nkind = 'local'\npath = 'fast'\ndomain = 'a'\n\n"
        "[[tiers]]\nname = 'remote'\nkind = 'local'\npath = 'remote'\ndomain = 'b'\n"
        f"encryption_key_env = '{variable}'\n"
    )
    return config


def test_config_wraps_the_tier_and_keeps_the_key_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = encrypted_config(tmp_path)
    assert load_config(config).tiers[1].encryption_key_env == "MG_TEST_TIER_KEY"
    monkeypatch.delenv("MG_TEST_TIER_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$MG_TEST_TIER_KEY, which is not set"):
        mouthguard.open_store(config)
    monkeypatch.setenv("MG_TEST_TIER_KEY", "zz" * 32)
    with pytest.raises(ConfigError) as excinfo:
        mouthguard.open_store(config)
    assert "zz" not in str(excinfo.value)
    monkeypatch.setenv("MG_TEST_TIER_KEY", "old=hex:" + OTHER.hex())
    monkeypatch.setenv("MG_TEST_TIER_KEY", "new=" + KEY.hex() + ",old=" + OTHER.hex())
    store = mouthguard.open_store(config)
    remote = store.tier("remote")
    assert isinstance(remote, EncryptedTier)
    assert (remote.key_id, remote.name, remote.domain) == ("new", "remote", "b")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tiers]]\nname = 'x'\nkind = 'memory'\nencryption_key_env = 'not a name'\n")
    with pytest.raises(ConfigError, match="encryption_key_env"):
        load_config(bad)


def test_checkpoints_replicate_to_an_encrypted_tier_and_load_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MG_TEST_TIER_KEY", "base64:" + base64.b64encode(KEY).decode())
    store = mouthguard.open_store(encrypted_config(tmp_path))
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    state = {"w": torch.randn(300, 301), "step": 3}
    ckpt.save(3, state)
    report = Replicator(store).replicate("r", 3)
    assert [c.destination for c in report.copies] == ["remote"], report
    remote = store.tier("remote")
    assert isinstance(remote, EncryptedTier)
    raw = remote.inner.get("r/000000000003/rank-00000.safetensors")
    assert state["w"].numpy().tobytes()[:4096] not in raw
    only_remote = mouthguard.Checkpointer(mouthguard.Store([remote]), "r", background=False)
    loaded = only_remote.load(3)
    assert torch.equal(loaded.state["w"], state["w"])
    # A chunk flipped on the remote copy: rejected as damage (not loaded).
    key = "r/000000000003/rank-00000.safetensors"
    raw = bytearray(remote.inner.get(key))
    raw[len(raw) // 2] ^= 0x40
    remote.inner.put(key, bytes(raw))
    with pytest.warns(CheckpointFallbackWarning, match="fails authentication"):
        with pytest.raises(NoValidCheckpointError):
            only_remote.load()
    assert ckpt.load(3).tier == "fast"  # the store as configured still has an intact copy
    assert os.environ["MG_TEST_TIER_KEY"] not in (tmp_path / "mouthguard.toml").read_text()

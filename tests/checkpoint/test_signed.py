"""Signed manifests: tampering (not only corruption) is caught by readers that hold the key."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import xxhash

import mouthguard
from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.errors import (
    CheckpointFallbackWarning,
    ConfigError,
    CorruptCheckpointError,
    SignatureError,
    is_data_damage,
)
from mouthguard.format.manifest import Manifest, parse_manifest
from mouthguard.format.sealed import SIGNATURE_KEY, seal, signed_part, unseal
from mouthguard.format.signing import ENV_KEY, SignFunction, keys_from_env, manifest_keys
from mouthguard.jobs.replicator import Replicator
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.key_material import Keyring, key_fingerprint, parse_keyring
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier
from tests.checkpoint.helpers import assert_same

RUN = "r"
KEY = bytes(range(32))
OTHER = bytes(range(100, 132))
RANK = "rank-00000.safetensors"


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_KEY, raising=False)


def state_of(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 65, generator=g), "b": torch.arange(5.0), "step": seed}


def checkpointer(tier: Tier, key: object = None) -> mouthguard.Checkpointer:
    store = mouthguard.Store([tier])
    return mouthguard.Checkpointer(store, RUN, background=False, signing_key=key)  # type: ignore[arg-type]


def manifest_key(step: int) -> str:
    return catalog.manifest_key(RUN, step)


def file_key(step: int, name: str = RANK) -> str:
    return catalog.checkpoint_prefix(RUN, step) + name


def tamper_and_reseal(tier: Tier, step: int, *, keep_signature: bool) -> None:
    """What an attacker with write access but no key does: change a tensor byte, then
    recompute the file's xxh3 and sha256 into the manifest and re-seal it."""
    raw = bytearray(tier.get(file_key(step)))
    raw[-1] ^= 0x01
    tier.put(file_key(step), bytes(raw))
    body = unseal(tier.get(manifest_key(step)), "manifest")
    old_signature = body.pop(SIGNATURE_KEY, None)
    files = body["files"]
    assert isinstance(files, list) and isinstance(files[0], dict)
    files[0]["checksum"] = "xxh3-128:" + xxhash.xxh3_128_hexdigest(bytes(raw))
    if "sha256" in files[0]:
        files[0]["sha256"] = "sha256:" + hashlib.sha256(bytes(raw)).hexdigest()
    sign: Callable[[bytes], str] | None = None
    if keep_signature and isinstance(old_signature, str):
        sign = lambda _signed: old_signature  # noqa: E731 - replay the old signature
    tier.put(manifest_key(step), seal(body, sign), mode=PutMode.OVERWRITE)


# --- the format ------------------------------------------------------------------------


def test_signed_manifest_format_and_unsigned_bytes_unchanged() -> None:
    tier = MemoryTier()
    checkpointer(tier, KEY).save(1, state_of(1))
    raw = tier.get(manifest_key(1))
    manifest = parse_manifest(raw)  # readers without a key accept it, ignoring the signature
    assert all(f.sha256 is not None for f in manifest.files)  # a key implies sha256
    kid = key_fingerprint(KEY)
    assert f'"{SIGNATURE_KEY}": "hmac-sha256:{kid}:'.encode() in raw
    part = signed_part(raw)
    assert part is not None
    unsigned = manifest.to_bytes()
    # The signature covers exactly the unsigned manifest's bytes before its checksum.
    assert unsigned.startswith(part[0])
    assert unsigned[len(part[0]) :].startswith(b',\n "manifest_checksum": "xxh3-128:')
    assert signed_part(unsigned) is None
    assert manifest.to_bytes(Keyring.single(KEY)) == raw
    assert parse_manifest(raw, Keyring.single(KEY)) == manifest


def test_corrupting_the_signature_is_corruption_for_everyone() -> None:
    tier = MemoryTier()
    checkpointer(tier, KEY).save(1, state_of(1))
    raw = tier.get(manifest_key(1))
    cut = raw.index(b"hmac-sha256:") + 30
    forged = raw[:cut] + (b"0" if raw[cut : cut + 1] != b"0" else b"1") + raw[cut + 1 :]
    with pytest.raises(mouthguard.errors.ManifestError, match="checksum mismatch"):
        parse_manifest(forged)


# --- tampering -------------------------------------------------------------------------


@pytest.mark.parametrize("keep_signature", [False, True])
def test_tampered_rank_file_with_resealed_manifest_caught_only_with_the_key(
    keep_signature: bool,
) -> None:
    tier = MemoryTier()
    writer = checkpointer(tier, KEY)
    writer.save(1, state_of(1))
    writer.save(2, state_of(2))
    tamper_and_reseal(tier, 2, keep_signature=keep_signature)

    # Without the key: checksums all match, the forgery is accepted (corruption only).
    keyless = checkpointer(tier).load(2).state
    assert isinstance(keyless, dict)
    assert not torch.equal(keyless["b"], state_of(2)["b"])  # type: ignore[arg-type]

    # With the key: rejected; an explicit step fails, a resume falls back past it.
    reason = "does not verify" if keep_signature else "not signed"
    with pytest.warns(CheckpointFallbackWarning, match=f"signature.*{reason}|{reason}.*signature"):
        with pytest.raises(CorruptCheckpointError, match="signature"):
            checkpointer(tier, KEY).load(2)
    with pytest.warns(CheckpointFallbackWarning, match="signature"):
        loaded = checkpointer(tier, KEY).load()
    assert loaded.step == 1
    assert_same(loaded.state, state_of(1))
    # A signature failure is rejected, never reported as data damage to repair.
    assert not tier.exists(catalog.checkpoint_prefix(RUN, 2) + "sidecar.damage.json")


def test_a_crafted_xxh3_collision_under_a_valid_signature_is_caught_by_sha256() -> None:
    """Bytes replaced; the manifest, signed with the real key, has xxh3 of the new bytes
    (what a crafted xxh3 collision gives an attacker) and sha256 of the old ones."""
    tier = MemoryTier()
    writer = checkpointer(tier, KEY)
    writer.save(1, state_of(1))
    writer.save(2, state_of(2))
    raw = bytearray(tier.get(file_key(2)))
    raw[-1] ^= 0x01
    tier.put(file_key(2), bytes(raw))
    body = unseal(tier.get(manifest_key(2)), "manifest")
    del body[SIGNATURE_KEY]
    files = body["files"]
    assert isinstance(files, list) and isinstance(files[0], dict)
    files[0]["checksum"] = "xxh3-128:" + xxhash.xxh3_128_hexdigest(bytes(raw))
    tier.put(manifest_key(2), seal(body, SignFunction(Keyring.single(KEY))), mode=PutMode.OVERWRITE)
    assert read_manifest(tier, RUN, 2, Keyring.single(KEY)).step == 2  # the signature holds

    with pytest.warns(CheckpointFallbackWarning, match="sha256 mismatch"):
        with pytest.raises(CorruptCheckpointError, match="sha256 mismatch"):
            checkpointer(tier, KEY).load(2)
    with pytest.warns(CheckpointFallbackWarning, match="sha256 mismatch"):
        assert checkpointer(tier, KEY).load().step == 1
    verdict = verify_and_record(CopyRef(tier, RUN, 2))
    assert verdict.damaged and "sha256 mismatch" in verdict.reason


def test_tampered_rank_file_without_reseal_is_caught_by_everyone() -> None:
    tier = MemoryTier()
    checkpointer(tier, KEY).save(1, state_of(1))
    raw = bytearray(tier.get(file_key(1)))
    raw[-3] ^= 0x10
    tier.put(file_key(1), bytes(raw))
    for key in (None, KEY):
        with pytest.warns(CheckpointFallbackWarning, match="mismatch"):
            with pytest.raises(CorruptCheckpointError):
                checkpointer(tier, key).load(1)


def test_rank_files_swapped_between_checkpoints_are_caught() -> None:
    tier = MemoryTier()
    writer = checkpointer(tier, KEY)
    writer.save(1, state_of(1))
    writer.save(2, state_of(2))
    tier.put(file_key(2), tier.get(file_key(1)))
    with pytest.warns(CheckpointFallbackWarning, match="sha256 mismatch|checksum mismatch"):
        with pytest.raises(CorruptCheckpointError):
            checkpointer(tier, KEY).load(2)


def test_signed_checkpoint_moved_to_another_step_is_caught() -> None:
    tier = MemoryTier()
    checkpointer(tier, KEY).save(1, state_of(1))
    for name in (RANK, "manifest.json"):
        tier.put(file_key(7, name), tier.get(file_key(1, name)))
    with pytest.warns(CheckpointFallbackWarning, match="moved or forged"):
        with pytest.raises(CorruptCheckpointError):
            checkpointer(tier, KEY).load(7)


def test_unsigned_checkpoint_is_refused_when_a_key_is_required() -> None:
    tier = MemoryTier()
    checkpointer(tier).save(1, state_of(1))
    with pytest.warns(CheckpointFallbackWarning, match="not signed"):
        with pytest.raises(CorruptCheckpointError, match="signature required"):
            checkpointer(tier, KEY).load(1)


def test_signed_manifest_without_sha256_is_refused() -> None:
    tier = MemoryTier()
    checkpointer(tier).save(1, state_of(1))
    manifest = read_manifest(tier, RUN, 1)
    signed = manifest.to_bytes(Keyring.single(KEY))  # a signature over xxh3 only
    with pytest.raises(SignatureError, match="no sha256"):
        parse_manifest(signed, Keyring.single(KEY))


def test_wrong_key_is_refused_without_leaking_either_key() -> None:
    tier = MemoryTier()
    checkpointer(tier, "main=" + KEY.hex()).save(1, state_of(1))
    with pytest.warns(CheckpointFallbackWarning) as caught:
        with pytest.raises(CorruptCheckpointError) as excinfo:
            checkpointer(tier, "main=" + OTHER.hex()).load(1)
    text = str(excinfo.value) + " ".join(str(w.message) for w in caught)
    assert "does not verify with key 'main'" in text
    for secret in (KEY, OTHER):
        assert secret.hex() not in text
        assert base64.b64encode(secret).decode() not in text
    assert not is_data_damage(SignatureError("x"))


def test_key_rotation_by_key_id() -> None:
    tier = MemoryTier()
    checkpointer(tier, "k1=" + KEY.hex()).save(1, state_of(1))
    rotated = checkpointer(tier, "k2=" + OTHER.hex() + ",k1=" + KEY.hex())
    rotated.save(2, state_of(2))
    assert b"hmac-sha256:k2:" in tier.get(manifest_key(2))
    assert b"hmac-sha256:k1:" in tier.get(manifest_key(1))
    assert_same(rotated.load(1).state, state_of(1))
    assert_same(rotated.load(2).state, state_of(2))
    retired = checkpointer(tier, "k2=" + OTHER.hex())
    assert retired.load().step == 2
    with pytest.warns(CheckpointFallbackWarning, match="key id 'k1', which is not configured"):
        with pytest.raises(CorruptCheckpointError):
            retired.load(1)


def test_replication_keeps_the_signature(tmp_path: Path) -> None:
    fast = LocalTier(tmp_path / "fast", name="fast", domain="a")
    durable = LocalTier(tmp_path / "durable", name="durable", domain="b")
    store = mouthguard.Store([fast, durable])
    writer = mouthguard.Checkpointer(store, RUN, background=False, signing_key=KEY)
    writer.save(1, state_of(1))
    report = Replicator(store).replicate(RUN, 1)
    assert [c.destination for c in report.copies] == ["durable"]
    assert durable.get(manifest_key(1)) == fast.get(manifest_key(1))
    only_durable = checkpointer(durable, KEY)
    loaded = only_durable.load(1)
    assert (loaded.tier, loaded.step) == ("durable", 1)
    assert_same(loaded.state, state_of(1))


# --- keys from the environment -----------------------------------------------------------


def test_env_key_is_used_by_checkpointer_and_open_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_KEY, "base64:" + base64.b64encode(KEY).decode())
    tier = MemoryTier()
    ckpt = checkpointer(tier)
    assert ckpt.with_sha256
    assert ckpt.manifest_keys is not None
    assert ckpt.manifest_keys.current == key_fingerprint(KEY)
    ckpt.save(1, state_of(1))
    monkeypatch.delenv(ENV_KEY)
    with pytest.warns(CheckpointFallbackWarning, match="not configured"):
        with pytest.raises(CorruptCheckpointError):
            checkpointer(tier, OTHER).load(1)
    assert_same(checkpointer(tier, KEY).load(1).state, state_of(1))
    monkeypatch.setenv(ENV_KEY, KEY.hex())
    store = mouthguard.open_store(tmp_path)
    assert store.manifest_keys is not None
    assert KEY.hex() not in repr(store.manifest_keys)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        (KEY.hex(), [key_fingerprint(KEY)]),
        ("hex:" + KEY.hex(), [key_fingerprint(KEY)]),
        (base64.b64encode(KEY).decode(), [key_fingerprint(KEY)]),
        ("a=" + base64.b64encode(KEY[:16]).decode(), ["a"]),
        (" new=hex:" + OTHER.hex() + " , old=" + KEY.hex(), ["new", "old"]),
    ],
)
def test_key_syntax(text: str, ids: list[str]) -> None:
    ring = parse_keyring(text, "$X")
    assert list(ring.keys) == ids
    assert ring.current == ids[0]
    assert manifest_keys(text) == ring
    assert keys_from_env({ENV_KEY: text}) == ring


@pytest.mark.parametrize(
    "text",
    [
        "",
        "#a" * 20,
        "hex:" + "ab" * 8 + "f",
        "short=" + "ab" * 8,
        "a=" + KEY.hex() + ",a=" + KEY.hex(),
    ],
)
def test_bad_keys_are_refused_without_echoing_them(text: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_keyring(text, "$MOUTHGUARD_MANIFEST_KEY", min_bytes=16)
    if len(text) > 8:
        assert text.rsplit("=", maxsplit=1)[-1][:16] not in str(excinfo.value)


def test_manifest_module_round_trip_with_keys() -> None:
    tier = MemoryTier()
    checkpointer(tier, KEY).save(1, state_of(1))
    manifest = Manifest.from_bytes(tier.get(manifest_key(1)))
    assert manifest.step == 1

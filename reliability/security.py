"""Tamper attempts against signed manifests and encrypted tiers: every one must be detected.

The attacker can write the storage but holds no key. Each case saves two
checkpoints (steps 1 and 2), tampers with step 2 (or plants a step), then loads
it explicitly with the reader's keys. A case *survives* when that load is
refused and a resume (``load()``) falls back to step 1 with its exact bytes; a
load that returns the tampered step is *accepted corrupt*.

Kinds against a signed store (``signing_key``; checksums alone would accept
most of them, since the attacker recomputes them):

* ``flip-reseal``: a byte of the rank file flipped, its xxh3 and sha256
  recomputed into the manifest, the manifest re-sealed without a signature;
* ``flip-reseal-replay``: the same, replaying the old signature;
* ``manifest-edit``: a value of the manifest changed, checksum recomputed,
  old signature replayed;
* ``forged-signature``: the manifest re-signed with the attacker's own key under
  the victim's key id;
* ``strip-sha256``: every sha256 and the signature removed, re-sealed;
* ``swap-rank-files``: step 1's rank file put in place of step 2's;
* ``moved-checkpoint``: step 1 copied whole to step 3, then step 3 loaded;
* ``unsigned-plant``: a consistent, unsigned checkpoint written as step 2;
* ``xxh3-collision``: what a crafted xxh3-128 collision amounts to -- a byte of
  the rank file changed while the *validly signed* manifest's xxh3 matches the
  new bytes and its sha256 is still the old bytes' (the test re-signs with the
  victim's key, standing in for the collision no one can compute here): only
  the sha256 comparison catches it.

Kinds against an :class:`~mouthguard.tiers.encrypted.EncryptedTier` (no
manifest key: encryption alone must catch them):

* ``enc-flip``: one byte of the stored rank file flipped;
* ``enc-chunk-reorder``: two chunks of the rank file exchanged;
* ``enc-chunk-transplant``: a chunk of step 1's rank file put into step 2's;
* ``enc-object-swap``: step 1's whole (valid) encrypted rank file stored as step 2's;
* ``enc-truncate``: trailing chunks or bytes cut;
* ``enc-manifest-flip``: one byte of the encrypted manifest flipped.

``python -m reliability.run --only security --level ci``
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import xxhash

import mouthguard
from mouthguard.checkpoint import catalog
from mouthguard.errors import MouthguardError
from mouthguard.format.sealed import SIGNATURE_KEY, seal, unseal
from mouthguard.format.signing import SignFunction
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.encrypted import HEADER_BYTES, TAG_BYTES, EncryptedTier
from mouthguard.tiers.key_material import Keyring
from mouthguard.tiers.memory import MemoryTier
from reliability.record import HarnessResult, Level

RUN = "sec"
RANK = "rank-00000.safetensors"
MANIFEST = "manifest.json"
SIGNING = Keyring("victim", {"victim": bytes(range(32))})
TIER_KEY = bytes(range(64, 96))
CHUNK = 4096
CASES_PER_KIND: dict[Level, int] = {"ci": 20, "soak": 500}

Attack = Callable[[Tier, random.Random], int]  # tampers; returns the step to load


@dataclass
class Outcome:
    """What one case showed."""

    detected: bool
    accepted: bool
    fallback_ok: bool
    note: str = ""
    #: Whether a reader *without* the manifest key accepted it (the attack is real).
    keyless_accepted: bool = False


def state_of(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(48, 50, generator=g), "b": torch.randn(50, generator=g)},
        "step": step,
    }


def key(step: int, name: str) -> str:
    return catalog.checkpoint_prefix(RUN, step) + name


def flip(tier: Tier, obj: str, rng: random.Random, lo: int = 0) -> bytes:
    raw = bytearray(tier.get(obj))
    raw[rng.randrange(lo, len(raw))] ^= 1 << rng.randrange(8)
    tier.put(obj, bytes(raw))
    return bytes(raw)


def reseal(
    tier: Tier, step: int, edit: Callable[[dict[str, JsonValue]], None], sign: bool | Keyring
) -> None:
    """Re-seal step's manifest after ``edit``; replay its signature (True), re-sign, or drop it."""
    body = unseal(tier.get(key(step, MANIFEST)), "manifest")
    old = body.pop(SIGNATURE_KEY, None)
    edit(body)
    signer: Callable[[bytes], str] | None = None
    if isinstance(sign, Keyring):
        signer = SignFunction(sign)
    elif sign and isinstance(old, str):
        signer = lambda _signed: old  # noqa: E731 - replay the old signature
    tier.put(key(step, MANIFEST), seal(body, signer), mode=PutMode.OVERWRITE)


def rehash(data: bytes) -> Callable[[dict[str, JsonValue]], None]:
    def edit(body: dict[str, JsonValue]) -> None:
        files = body["files"]
        assert isinstance(files, list)
        assert isinstance(files[0], dict)
        files[0]["checksum"] = "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)
        if "sha256" in files[0]:
            files[0]["sha256"] = "sha256:" + hashlib.sha256(data).hexdigest()

    return edit


# --- attacks on a signed store ------------------------------------------------------------


def flip_reseal(tier: Tier, rng: random.Random) -> int:
    reseal(tier, 2, rehash(flip(tier, key(2, RANK), rng)), sign=False)
    return 2


def flip_reseal_replay(tier: Tier, rng: random.Random) -> int:
    reseal(tier, 2, rehash(flip(tier, key(2, RANK), rng)), sign=True)
    return 2


def manifest_edit(tier: Tier, rng: random.Random) -> int:
    def edit(body: dict[str, JsonValue]) -> None:
        choice = rng.randrange(3)
        if choice == 0:
            body["reference"] = {"loss": rng.random()}
        elif choice == 1:
            body["importance"] = "transient"
        else:
            states = body["states"]
            assert isinstance(states, list)
            assert isinstance(states[0], dict)
            states[0]["step"] = rng.randrange(1000)

    reseal(tier, 2, edit, sign=True)
    return 2


def forged_signature(tier: Tier, rng: random.Random) -> int:
    attacker = Keyring("victim", {"victim": rng.randbytes(32)})
    reseal(tier, 2, rehash(flip(tier, key(2, RANK), rng)), sign=attacker)
    return 2


def strip_sha256(tier: Tier, rng: random.Random) -> int:
    data = flip(tier, key(2, RANK), rng)

    def edit(body: dict[str, JsonValue]) -> None:
        rehash(data)(body)
        files = body["files"]
        assert isinstance(files, list)
        for f in files:
            assert isinstance(f, dict)
            f.pop("sha256", None)

    reseal(tier, 2, edit, sign=False)
    return 2


def xxh3_collision(tier: Tier, rng: random.Random) -> int:
    data = flip(tier, key(2, RANK), rng)

    def edit(body: dict[str, JsonValue]) -> None:
        files = body["files"]
        assert isinstance(files, list)
        assert isinstance(files[0], dict)
        files[0]["checksum"] = "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)  # sha256 kept

    reseal(tier, 2, edit, sign=SIGNING)
    return 2


def swap_rank_files(tier: Tier, rng: random.Random) -> int:
    del rng
    tier.put(key(2, RANK), tier.get(key(1, RANK)))
    return 2


def moved_checkpoint(tier: Tier, rng: random.Random) -> int:
    del rng
    for name in (RANK, MANIFEST):
        tier.put(key(3, name), tier.get(key(1, name)))
    return 3


def unsigned_plant(tier: Tier, rng: random.Random) -> int:
    for name in (RANK, MANIFEST):
        tier.delete(key(2, name))
    evil = {"model": {"w": torch.full((48, 50), rng.random()), "b": torch.zeros(50)}, "step": 2}
    mouthguard.Checkpointer(mouthguard.Store([tier]), RUN, background=False).save(2, evil)
    return 2


# --- attacks on an encrypted tier -----------------------------------------------------------


def _inner(tier: Tier) -> Tier:
    assert isinstance(tier, EncryptedTier)
    return tier.inner


def _chunks(raw: bytes) -> list[slice]:
    step = CHUNK + TAG_BYTES
    return [slice(s, min(s + step, len(raw))) for s in range(HEADER_BYTES, len(raw), step)]


def enc_flip(tier: Tier, rng: random.Random) -> int:
    flip(_inner(tier), key(2, RANK), rng)
    return 2


def enc_chunk_reorder(tier: Tier, rng: random.Random) -> int:
    inner = _inner(tier)
    raw = bytearray(inner.get(key(2, RANK)))
    full = _chunks(bytes(raw))[:-1]  # equal-sized chunks
    a, b = rng.sample(full, 2)
    raw[a], raw[b] = raw[b], raw[a]
    inner.put(key(2, RANK), bytes(raw))
    return 2


def enc_chunk_transplant(tier: Tier, rng: random.Random) -> int:
    inner = _inner(tier)
    donor, raw = inner.get(key(1, RANK)), bytearray(inner.get(key(2, RANK)))
    spot = rng.choice(_chunks(bytes(raw))[:-1])
    raw[spot] = donor[spot]
    inner.put(key(2, RANK), bytes(raw))
    return 2


def enc_object_swap(tier: Tier, rng: random.Random) -> int:
    del rng
    inner = _inner(tier)
    inner.put(key(2, RANK), inner.get(key(1, RANK)))
    return 2


def enc_truncate(tier: Tier, rng: random.Random) -> int:
    inner = _inner(tier)
    raw = inner.get(key(2, RANK))
    chunks = _chunks(raw)
    cut = chunks[rng.randrange(1, len(chunks))].start if rng.random() < 0.5 else len(raw) - 1
    inner.put(key(2, RANK), raw[: max(cut - rng.randrange(2) * rng.randrange(1, 40), 1)])
    return 2


def enc_manifest_flip(tier: Tier, rng: random.Random) -> int:
    flip(_inner(tier), key(2, MANIFEST), rng, lo=HEADER_BYTES)
    return 2


SIGNED: dict[str, Attack] = {
    "flip-reseal": flip_reseal,
    "flip-reseal-replay": flip_reseal_replay,
    "manifest-edit": manifest_edit,
    "forged-signature": forged_signature,
    "strip-sha256": strip_sha256,
    "swap-rank-files": swap_rank_files,
    "moved-checkpoint": moved_checkpoint,
    "unsigned-plant": unsigned_plant,
    "xxh3-collision": xxh3_collision,
}
ENCRYPTED: dict[str, Attack] = {
    "enc-flip": enc_flip,
    "enc-chunk-reorder": enc_chunk_reorder,
    "enc-chunk-transplant": enc_chunk_transplant,
    "enc-object-swap": enc_object_swap,
    "enc-truncate": enc_truncate,
    "enc-manifest-flip": enc_manifest_flip,
}


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def run_case(attack: Attack, *, encrypted: bool, rng: random.Random) -> Outcome:
    """Save steps 1 and 2, tamper, then load as a reader holding the keys."""
    tier: Tier = MemoryTier()
    if encrypted:
        tier = EncryptedTier(tier, TIER_KEY, key_id="tier", chunk_size=CHUNK)
    keys = None if encrypted else SIGNING
    store = mouthguard.Store([tier])
    writer = mouthguard.Checkpointer(store, RUN, background=False, signing_key=keys)
    for step in (1, 2):
        writer.save(step, state_of(step))
    target = attack(tier, rng)
    reader = mouthguard.Checkpointer(store, RUN, background=False, signing_key=keys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            loaded = reader.load(target)
        except MouthguardError as exc:
            detected, accepted, note = True, False, f"{type(exc).__name__}"
        else:
            detected, note = False, f"step {target} loaded"
            accepted = not _same(loaded.state, state_of(target))
            accepted = accepted or target == 3  # a planted step is never genuine
        try:
            resumed = reader.load() if target == 2 else reader.load(1)
            fallback_ok = resumed.step == 1 and _same(resumed.state, state_of(1))
        except MouthguardError:
            fallback_ok = False
        keyless = False
        if keys is not None:
            try:
                keyless_reader = mouthguard.Checkpointer(store, RUN, background=False)
                keyless_reader.manifest_keys = None  # ignore any key in the environment
                keyless_reader.load(target)
                keyless = True
            except MouthguardError:
                keyless = False
    return Outcome(detected, accepted or not detected, fallback_ok, note, keyless)


def run(level: Level = "ci", *, seed: int = 0) -> HarnessResult:
    """Every attack kind, ``CASES_PER_KIND[level]`` seeded cases each."""
    started = time.monotonic()
    logging.getLogger("mouthguard").setLevel(logging.CRITICAL)  # rejections are expected
    rng = random.Random(seed)
    per_kind: dict[str, dict[str, int]] = {}
    failures: list[str] = []
    cases = survived = accepted = 0
    kinds = [(n, a, False) for n, a in SIGNED.items()] + [
        (n, a, True) for n, a in ENCRYPTED.items()
    ]
    for name, attack, encrypted in kinds:
        counts = per_kind.setdefault(
            name, {"cases": 0, "detected": 0, "accepted": 0, "accepted_without_key": 0}
        )
        for i in range(CASES_PER_KIND[level]):
            outcome = run_case(attack, encrypted=encrypted, rng=random.Random(rng.random()))
            cases += 1
            counts["cases"] += 1
            counts["detected"] += outcome.detected
            counts["accepted"] += outcome.accepted
            counts["accepted_without_key"] += outcome.keyless_accepted
            accepted += outcome.accepted
            if outcome.detected and outcome.fallback_ok and not outcome.accepted:
                survived += 1
            elif len(failures) < 20:
                failures.append(f"{name} #{i}: {outcome}")
    return HarnessResult(
        harness="security",
        what=(
            "tamper attempts by someone who can write the storage but holds no key: "
            "byte flips with re-sealed manifests (signature dropped, replayed or forged "
            "with another key), manifest edits, stripped sha256, rank files swapped "
            "between checkpoints, moved and planted unsigned checkpoints, and a "
            "validly signed manifest whose xxh3 matches replaced bytes (a crafted "
            "collision) while its sha256 does not, against a signed store; flipped, "
            "reordered, transplanted and truncated chunks and swapped objects on an "
            "AES-GCM encrypted tier; survived = refused and the resume fell back to "
            "the intact older checkpoint"
        ),
        cases=cases,
        survived=survived,
        accepted_corrupt=accepted,
        cases_by_kind={kind: counts["cases"] for kind, counts in per_kind.items()},
        # Tampering with stored bytes: no save is at stake, nothing is written outside.
        not_measured=["lost_acknowledged", "writes_outside"],
        command=f"python -m reliability.run --only security --level {level}",
        seconds=round(time.monotonic() - started, 1),
        details={
            "level": level,
            "seed": seed,
            "kinds": per_kind,
            "failures": failures,
            "note": (
                "accepted_without_key counts the same tampered checkpoints loaded by a "
                "reader without the manifest key: checksums alone accept them"
            ),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m reliability.security")
    parser.add_argument("--level", choices=["ci", "soak"], default="ci")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = run(args.level, seed=args.seed)
    print(result.to_json())


if __name__ == "__main__":
    main()

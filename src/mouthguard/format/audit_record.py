"""One audit record: its bytes, its place in a hash chain, its keyed signature.

An audit trail is a sequence of records numbered from 0. Each record is one
small JSON document (canonical: sorted keys, no spaces) that carries

* ``seq`` -- its number, which is also its object's name, so a record moved to
  another number (reordered) no longer matches its name;
* ``prev`` -- the BLAKE2b-256 of the previous record's exact bytes (64 zeros
  for record 0), so a record edited, replaced or removed breaks the link of the
  one after it;
* ``mac`` (when the store has a manifest key) -- ``blake2b:<key id>:<hex>``, a
  keyed BLAKE2b-256 over every other member, so nobody without the key can
  write a record the chain accepts: neither forge a new one nor re-link the
  chain around an edit.

Without a key, the chain finds accidents and clumsy edits only: anyone who can
write the storage can recompute every hash. With one, it finds every edit,
removal and reordering *inside* the trail; removing the newest records (cutting
the tail) leaves a shorter valid chain, which only a copy kept elsewhere (another
tier's trail, an export) can reveal -- see ``docs/compliance.md``.

Pure: bytes in, bytes out; the trail on tiers is ``mouthguard.checkpoint.audit``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field

from mouthguard.errors import FormatError
from mouthguard.tiers.key_material import Keyring

VERSION = 1
GENESIS = "0" * 64
#: The largest record accepted (a reason is a sentence, not a file).
MAX_RECORD_BYTES = 16 * 1024
MAX_REASON_CHARS = 2000
_MAC = re.compile(r"blake2b:([A-Za-z0-9._-]{1,32}):([0-9a-f]{64})")
_DOMAIN = b"mouthguard.audit.v1\x00"
_PHASES = ("intent", "outcome")


class AuditRecordError(FormatError):
    """An audit record does not parse, or is not what a record must be."""


@dataclass(frozen=True)
class AuditRecord:
    """What one record says (its chain members, ``seq`` and ``prev``, are added on write).

    Attributes:
        id: a random id, the same on every tier's copy of the record.
        phase: ``intent`` (written before the act) or ``outcome`` (after it).
        act: what was done (``commit``, ``hold``, ``purge``, ...).
        time: when, ISO 8601 UTC.
        actor: who (``user@host`` by default, or what the API was given).
        run: the run; step: the checkpoint (``None`` for an act on a whole run).
        tiers: the tiers the act touches.
        reason: why, in words.
        of: for an outcome, the id of its intent.
        result: for an outcome, ``done``, ``failed`` or ``not needed``.
        detail: for an outcome, what went wrong or what was found.
        extra: further facts of the act, as strings (the source of a copy, ...).
    """

    id: str
    phase: str
    act: str
    time: str
    actor: str
    run: str
    step: int | None
    tiers: tuple[str, ...]
    reason: str = ""
    of: str = ""
    result: str = ""
    detail: str = ""
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.phase not in _PHASES:
            raise ValueError(f"audit phase must be one of {_PHASES}, got {self.phase!r}")
        if len(self.reason) > MAX_REASON_CHARS or len(self.detail) > MAX_REASON_CHARS:
            raise ValueError(f"audit reason and detail are limited to {MAX_REASON_CHARS} chars")


@dataclass(frozen=True)
class StoredRecord:
    """A record as found in a trail: what it says, its number, its link and its bytes."""

    record: AuditRecord
    seq: int
    prev: str
    mac: str | None
    raw: bytes

    @property
    def digest(self) -> str:
        """What the next record's ``prev`` must be."""
        return record_digest(self.raw)


def record_digest(raw: bytes) -> str:
    """BLAKE2b-256 of a record's exact bytes (the chain link)."""
    return hashlib.blake2b(raw, digest_size=32).hexdigest()


def _canonical(body: dict[str, object]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, key_id: str, signed: bytes) -> str:
    mac = hashlib.blake2b(_DOMAIN + key_id.encode() + b"\x00" + signed, key=key, digest_size=32)
    return mac.hexdigest()


def encode(record: AuditRecord, seq: int, prev: str, keys: Keyring | None = None) -> bytes:
    """The bytes of ``record`` as number ``seq`` after a record whose digest is ``prev``.

    BLAKE2b takes keys of at most 64 bytes; a longer manifest key is hashed to 64 first.
    """
    body: dict[str, object] = {
        "v": VERSION,
        "seq": seq,
        "prev": prev,
        "id": record.id,
        "phase": record.phase,
        "act": record.act,
        "time": record.time,
        "actor": record.actor,
        "run": record.run,
        "step": record.step,
        "tiers": list(record.tiers),
        "reason": record.reason,
    }
    if record.phase == "outcome":
        body.update(of=record.of, result=record.result, detail=record.detail)
    if record.extra:
        body["extra"] = dict(record.extra)
    if keys is not None:
        kid = keys.current
        body["mac"] = f"blake2b:{kid}:{_mac(_blake_key(keys.current_key), kid, _canonical(body))}"
    raw = _canonical(body)
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError(f"audit record of {len(raw)} bytes exceeds {MAX_RECORD_BYTES}")
    return raw


def _blake_key(key: bytes) -> bytes:
    return key if len(key) <= 64 else hashlib.blake2b(key, digest_size=64).digest()


def decode(raw: bytes) -> StoredRecord:
    """Parse a record's bytes (the signature is checked by :func:`check_mac`).

    Raises:
        AuditRecordError: not a record: too large, not canonical JSON, a member
            missing or of the wrong type.
    """
    if len(raw) > MAX_RECORD_BYTES:
        raise AuditRecordError(f"{len(raw)} bytes: larger than any record")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AuditRecordError(f"not JSON ({exc})") from None
    if not isinstance(body, dict) or _canonical(body) != raw:
        raise AuditRecordError("not a canonical record (edited by hand?)")
    try:
        tiers = body["tiers"]
        step = body["step"]
        extra = body.get("extra", {})
        if (
            body["v"] != VERSION
            or not isinstance(body["seq"], int)
            or not isinstance(tiers, list)
            or not (step is None or isinstance(step, int))
            or not isinstance(extra, dict)
        ):
            raise AuditRecordError("wrong version or member types")
        record = AuditRecord(
            id=_text(body, "id"),
            phase=_text(body, "phase"),
            act=_text(body, "act"),
            time=_text(body, "time"),
            actor=_text(body, "actor"),
            run=_text(body, "run"),
            step=step,
            tiers=tuple(str(t) for t in tiers),
            reason=_text(body, "reason"),
            of=str(body.get("of", "")),
            result=str(body.get("result", "")),
            detail=str(body.get("detail", "")),
            extra=tuple(sorted((str(k), str(v)) for k, v in extra.items())),
        )
        mac = body.get("mac")
        return StoredRecord(record, body["seq"], _text(body, "prev"), _opt(mac), raw)
    except KeyError as exc:
        raise AuditRecordError(f"member {exc} missing") from None
    except ValueError as exc:
        raise AuditRecordError(str(exc)) from None


def _text(body: dict[str, object], key: str) -> str:
    value = body[key]
    if not isinstance(value, str):
        raise AuditRecordError(f"member {key!r} is not a string")
    return value


def _opt(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise AuditRecordError("member 'mac' is not a string")
    return value


def check_mac(stored: StoredRecord, keys: Keyring) -> str | None:
    """Why the record's signature does not hold under ``keys``; None when it does."""
    if stored.mac is None:
        return "unsigned, but the store has a manifest key"
    match = _MAC.fullmatch(stored.mac)
    if match is None:
        return "malformed signature"
    kid, given = match.groups()
    key = keys.keys.get(kid)
    if key is None:
        return f"signed with key id {kid!r}, which is not in the keyring"
    body = json.loads(stored.raw)
    del body["mac"]
    if not hmac.compare_digest(_mac(_blake_key(key), kid, _canonical(body)), given):
        return "signature does not match (edited)"
    return None


__all__ = [
    "GENESIS",
    "MAX_RECORD_BYTES",
    "AuditRecord",
    "AuditRecordError",
    "StoredRecord",
    "check_mac",
    "decode",
    "encode",
    "record_digest",
]

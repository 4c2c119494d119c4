"""The checkpoint manifest: the commit record, written last, checksummed over its own bytes.

A checkpoint exists on a tier exactly when its ``manifest.json`` does. The
manifest lists every file (size, xxh3-128, optional sha256), every tensor
(file, dtype, shape, absolute offset, length) and the non-tensor state of each
rank as typed JSON. It ends with its own checksum::

    { ...body...,
     "manifest_checksum": "xxh3-128:<hex of every byte before the comma>"
    }

The checksum covers the raw bytes, not a re-serialisation, so *any* changed byte
is detected, including whitespace. Parsing treats the input as hostile: size,
depth, types, names, offsets and overlaps are all validated before anything is
read on the strength of it, and file names are single safe path segments so a
manifest can never point outside its checkpoint directory.

A checkpoint written through ``torch.distributed.checkpoint`` (``mouthguard.dcp``)
carries DCP's own metadata as explicit JSON in the optional ``dcp`` member. The
member is written only when present, so every other manifest (and its checksum)
is byte-for-byte what it was before the member existed. Here it is only checked
to be a JSON object; ``mouthguard.dcp`` validates its content.

A ``Checkpointer`` save also records how it went in the optional ``save`` member
(:class:`SaveTiming`: sync or async, the seconds from the call until the manifest
was built, and the seconds the caller was blocked), so that operators can see
save stalls and throughput later (``mouthguard serve``). Like ``dcp`` it is
written only when present; manifests from before it parse unchanged.

With a manifest key (:mod:`mouthguard.format.signing`, which states the threat
model) the manifest also carries an HMAC signature before its checksum; parsed
with a key, an unsigned or wrongly signed manifest raises ``SignatureError``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from mouthguard.errors import FormatError, InvalidKeyError, ManifestError, SignatureError
from mouthguard.format.checksum import SHA256, XXH3_128, validate_digest
from mouthguard.format.dtypes import itemsize, validate_shape
from mouthguard.format.lineage import Lineage
from mouthguard.format.rank_file import HEADER_ALIGN
from mouthguard.format.sealed import SealError, seal, unseal
from mouthguard.format.signing import SignFunction, verify
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.tiers.key_material import Keyring
from mouthguard.tiers.object_keys import validate_segment

FORMAT_NAME = "mouthguard.checkpoint"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
MAX_FILES = 1 << 20
MAX_STEP = 10**15
#: Largest file size we accept from a manifest (1 PiB); bounds every allocation.
MAX_FILE_SIZE = 1 << 50


@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint (a rank file)."""

    name: str
    rank: int
    size: int
    data_offset: int
    checksum: str
    sha256: str | None = None


@dataclass(frozen=True)
class TensorRecord:
    """Where one stored tensor lives."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int


#: Largest duration a manifest may record for a save (about 115 days).
MAX_SAVE_SECONDS = 1e7
SAVE_MODES = ("sync", "async")


@dataclass(frozen=True)
class SaveTiming:
    """How the save that wrote a checkpoint went, as its coordinator measured it.

    Attributes:
        mode: ``sync`` (``save``) or ``async`` (``save_async``).
        seconds: from the call until the manifest was built, every rank file
            written and fsynced; the manifest's own write and rename (a few small
            writes) come after and are not counted.
        stall_seconds: how long the caller was blocked: ``seconds`` for a sync
            save, the snapshot (and the wait for the previous save) for an async one.
    """

    mode: str
    seconds: float
    stall_seconds: float

    def __post_init__(self) -> None:
        if self.mode not in SAVE_MODES:
            raise ManifestError(f"save mode must be one of {SAVE_MODES}, got {self.mode!r}")
        for name in ("seconds", "stall_seconds"):
            value = getattr(self, name)
            if not isinstance(value, float) or not 0.0 <= value <= MAX_SAVE_SECONDS:
                raise ManifestError(f"save {name} must be a number of seconds, got {value!r}")

    def to_json(self) -> dict[str, JsonValue]:
        """The manifest's ``save`` member."""
        return {"mode": self.mode, "seconds": self.seconds, "stall_seconds": self.stall_seconds}

    @classmethod
    def from_json(cls, raw: JsonValue) -> SaveTiming:
        """Parse the ``save`` member as hostile input (exact keys, types, bounds)."""
        if not isinstance(raw, dict) or set(raw) != {"mode", "seconds", "stall_seconds"}:
            raise ManifestError("manifest field 'save' must be {mode, seconds, stall_seconds}")
        mode = raw["mode"]
        if not isinstance(mode, str):
            raise ManifestError("save mode must be a string")
        return cls(mode, _seconds(raw["seconds"]), _seconds(raw["stall_seconds"]))


def _seconds(value: JsonValue) -> float:
    """A number of seconds within bounds (a JSON integer too; ``true`` is not one)."""
    bad = ManifestError(f"save seconds must be numbers in [0, {MAX_SAVE_SECONDS:g}]: {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad
    if not 0 <= value <= MAX_SAVE_SECONDS:  # before float(): a huge int would overflow; nan fails
        raise bad
    return float(value)


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated manifest. Immutable: mutable facts live in sidecars."""

    run: str
    step: int
    importance: Importance
    created: dt.datetime
    world_size: int
    files: tuple[FileRecord, ...]
    tensors: tuple[TensorRecord, ...]
    states: tuple[JsonValue, ...]
    framework: Mapping[str, str] = field(default_factory=dict)
    reference: JsonValue = None
    #: DCP metadata (``mouthguard.dcp``'s JSON form); None for a ``Checkpointer`` save.
    dcp: JsonValue = None
    #: How the save went (``Checkpointer`` saves); None for DCP and older manifests.
    save: SaveTiming | None = None
    #: What the checkpoint came from (:mod:`mouthguard.format.lineage`); None when unknown.
    lineage: Lineage | None = None

    @property
    def is_dcp(self) -> bool:
        """Whether the checkpoint was written through ``torch.distributed.checkpoint``.

        Its ``states`` are then empty: the state lives in DCP's metadata and is
        loaded with ``mouthguard.dcp.Reader``, not ``Checkpointer.load``.
        """
        return self.dcp is not None

    @property
    def nbytes(self) -> int:
        """Total bytes of the checkpoint's data files."""
        return sum(f.size for f in self.files)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor payload (excluding headers)."""
        return sum(t.length for t in self.tensors)

    def file(self, name: str) -> FileRecord:
        """Return the record of file ``name``."""
        for record in self.files:
            if record.name == name:
                return record
        raise ManifestError(f"manifest has no file {name!r}")

    def tensors_in(self, file_name: str) -> list[TensorRecord]:
        """Tensors stored in ``file_name``, sorted by offset."""
        return sorted((t for t in self.tensors if t.file == file_name), key=lambda t: t.offset)

    def to_bytes(self, keys: Keyring | None = None) -> bytes:
        """Serialise, appending the checksum of the serialised body (signed with ``keys``)."""
        body: dict[str, JsonValue] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "run": self.run,
            "step": self.step,
            "importance": self.importance.value,
            "created": self.created.isoformat(),
            "world_size": self.world_size,
            "framework": dict(self.framework),
            "files": [_file_json(f) for f in self.files],
            "tensors": [
                {
                    "name": t.name,
                    "file": t.file,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "offset": t.offset,
                    "length": t.length,
                }
                for t in self.tensors
            ],
            "states": list(self.states),
            "reference": self.reference,
        }
        if self.save is not None:
            # Only when present (as dcp): older manifests keep their exact bytes.
            body["save"] = self.save.to_json()
        if self.dcp is not None:
            # Only when present: manifests without it keep their exact bytes and checksum.
            body["dcp"] = self.dcp
        if self.lineage:
            body["lineage"] = self.lineage.to_json()
        return seal(body, None if keys is None else SignFunction(keys))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        """Parse and fully validate a manifest.

        Raises:
            ManifestError: the bytes fail the checksum, are malformed, or are hostile.
        """
        return parse_manifest(raw)


def _file_json(f: FileRecord) -> JsonValue:
    out: dict[str, JsonValue] = {
        "name": f.name,
        "rank": f.rank,
        "size": f.size,
        "data_offset": f.data_offset,
        "checksum": f.checksum,
    }
    if f.sha256 is not None:
        out["sha256"] = f.sha256
    return out


def parse_manifest(raw: bytes, keys: Keyring | None = None) -> Manifest:
    """Verify the self-checksum of ``raw`` and parse it into a :class:`Manifest`.

    With ``keys`` the manifest must also be signed with one of them and record
    the sha256 of every file (so the signature vouches for the files' bytes too).

    Raises:
        SignatureError: ``keys`` given and the signature is missing or wrong.
        ManifestError: anything else is wrong; the message says what.
    """
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"manifest is {len(raw)} bytes, larger than the {MAX_MANIFEST_BYTES} limit"
        )
    try:
        body = unseal(raw, "manifest")
    except SealError as exc:
        raise ManifestError(str(exc)) from None
    if keys is not None:
        verify(raw, body, keys)
    try:
        manifest = _validate(body)
    except ManifestError:
        raise
    except (FormatError, InvalidKeyError, ValueError) as exc:
        raise ManifestError(f"invalid manifest: {exc}") from None
    unhashed = [f.name for f in manifest.files if f.sha256 is None] if keys is not None else []
    if unhashed:
        raise SignatureError(f"signed manifest records no sha256 for {unhashed[:3]}")
    return manifest


def _validate(body: JsonValue) -> Manifest:
    if not isinstance(body, dict):
        raise ManifestError("manifest is not a JSON object")
    if body.get("format") != FORMAT_NAME:
        raise ManifestError(f"not a mouthguard manifest (format={body.get('format')!r})")
    version = body.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(f"unsupported manifest format_version {version!r} (this reader: 1)")
    run = validate_segment(_str(body, "run"))
    step = _nat(body, "step", MAX_STEP)
    importance = parse_importance(_str(body, "importance"))
    created = dt.datetime.fromisoformat(_str(body, "created"))
    world_size = _nat(body, "world_size", MAX_FILES)
    if world_size < 1:
        raise ManifestError("world_size must be at least 1")
    framework = body.get("framework", {})
    if not isinstance(framework, dict) or not all(isinstance(v, str) for v in framework.values()):
        raise ManifestError("framework must map names to version strings")
    files = _files(body.get("files"), world_size)
    tensors = _tensors(body.get("tensors"), {f.name: f for f in files})
    states = body.get("states")
    if not isinstance(states, list) or len(states) != world_size:
        raise ManifestError("states must be a list with one entry per rank")
    dcp = body.get("dcp")
    if "dcp" in body and not isinstance(dcp, dict):
        raise ManifestError(f"manifest field 'dcp' must be an object, got {type(dcp).__name__}")
    save = SaveTiming.from_json(body["save"]) if "save" in body else None
    lineage = Lineage.from_json(body["lineage"]) if "lineage" in body else None
    return Manifest(
        run=run,
        step=step,
        importance=importance,
        created=created,
        world_size=world_size,
        files=files,
        tensors=tensors,
        states=tuple(states),
        framework={str(k): str(v) for k, v in framework.items()},
        reference=body.get("reference"),
        dcp=dcp,
        save=save,
        lineage=lineage,
    )


def _str(obj: dict[str, JsonValue], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ManifestError(f"manifest field {key!r} must be a string, got {type(value).__name__}")
    return value


def _nat(obj: dict[str, JsonValue], key: str, limit: int) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise ManifestError(
            f"manifest field {key!r} must be an integer in [0, {limit}], got {value!r}"
        )
    return value


def _files(raw: JsonValue, world_size: int) -> tuple[FileRecord, ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_FILES:
        raise ManifestError("files must be a non-empty list")
    records: list[FileRecord] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ManifestError(f"files[{i}] is not an object")
        name = _str(item, "name")
        try:
            validate_segment(name)
        except InvalidKeyError:
            raise ManifestError(
                f"files[{i}] names {name!r}, which is outside its checkpoint"
            ) from None
        if name == MANIFEST_NAME or name in names:
            raise ManifestError(f"files[{i}]: duplicate or reserved file name {name!r}")
        names.add(name)
        size = _nat(item, "size", MAX_FILE_SIZE)
        data_offset = _nat(item, "data_offset", size)
        if data_offset < 8 or data_offset % HEADER_ALIGN:
            raise ManifestError(
                f"file {name!r}: data_offset {data_offset} is not a padded header end"
            )
        sha = item.get("sha256")
        records.append(
            FileRecord(
                name=name,
                rank=_nat(item, "rank", world_size - 1),
                size=size,
                data_offset=data_offset,
                checksum=validate_digest(item.get("checksum"), XXH3_128, f"file {name!r}"),
                sha256=None if sha is None else validate_digest(sha, SHA256, f"file {name!r}"),
            )
        )
    ranks = sorted(r.rank for r in records)
    if ranks != list(range(world_size)):
        raise ManifestError(f"files must hold exactly one file per rank 0..{world_size - 1}")
    return tuple(records)


def _tensors(raw: JsonValue, files: dict[str, FileRecord]) -> tuple[TensorRecord, ...]:
    if not isinstance(raw, list):
        raise ManifestError("tensors must be a list")
    records: list[TensorRecord] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ManifestError(f"tensors[{i}] is not an object")
        name, file_name, dtype = _str(item, "name"), _str(item, "file"), _str(item, "dtype")
        if file_name not in files:
            raise ManifestError(f"tensor {name!r} refers to unknown file {file_name!r}")
        if (file_name, name) in seen:
            raise ManifestError(f"duplicate tensor {name!r} in {file_name!r}")
        seen.add((file_name, name))
        record = TensorRecord(
            name=name,
            file=file_name,
            dtype=dtype,
            shape=validate_shape(item.get("shape"), f"tensor {name!r}"),
            offset=_nat(item, "offset", MAX_FILE_SIZE),
            length=_nat(item, "length", MAX_FILE_SIZE),
        )
        if math.prod(record.shape) * itemsize(dtype) != record.length:
            raise ManifestError(f"tensor {name!r}: length does not match dtype and shape")
        records.append(record)
    for file in files.values():
        _check_coverage(file, sorted((r for r in records if r.file == file.name), key=_order))
    return tuple(records)


def _order(record: TensorRecord) -> tuple[int, int]:
    return (record.offset, record.offset + record.length)


def _check_coverage(file: FileRecord, records: list[TensorRecord]) -> None:
    """Tensors must tile the data region exactly: no overlap, no gap, nothing past the end."""
    cursor = file.data_offset
    for record in records:
        if record.offset < cursor:
            raise ManifestError(f"tensor {record.name!r} overlaps another tensor or the header")
        if record.offset > cursor:
            raise ManifestError(f"file {file.name!r} has a gap before tensor {record.name!r}")
        cursor = record.offset + record.length
    if cursor != file.size:
        raise ManifestError(
            f"tensors of {file.name!r} end at byte {cursor} but the file has {file.size} bytes"
        )

"""Where model weights come from: the files to read, and their checksums where known.

A source is one of:

* a Hugging Face-style model directory: ``model.safetensors.index.json`` (its
  ``weight_map`` names every tensor's shard) and the shards it names, or a single
  ``model.safetensors``. No checksums: Hugging Face publishes none in the
  directory, so these bytes are loaded unverified (and reported so);
* a mouthguard checkpoint copy directory (``<root>/<run>/<step>/`` holding
  ``manifest.json``): every rank file with the manifest's xxh3-128 (and sha256 when
  recorded), verified while loading;
* a store (a directory or ``mouthguard.toml``) with ``run=`` (and ``step=``, else the
  newest committed step): the first tier holding that step, fast first;
* ``s3://bucket/prefix`` holding either of the first two layouts;
* a Hugging Face hub cache snapshot (``models--org--name/snapshots/<rev>/``, every
  file a link into ``../../blobs/``), or the ``models--org--name`` folder itself
  (the snapshot ``refs/main`` names): links are followed only inside the model's
  cache folder (:mod:`mouthguard.weights.hub`).

Everything read from a source is hostile input until checked: the index is
parsed by the strict JSON parser with size and depth caps, every file it names
must be a plain file name in the directory (never a path out of it), and every
tensor it maps must be in its shard's header (:mod:`mouthguard.weights.plan`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.store import open_store
from mouthguard.errors import MouthguardError, ObjectNotFoundError, WeightsError
from mouthguard.format import strict_json
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.format.signing import keys_from_env
from mouthguard.tiers import Tier, join_key
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.object_keys import validate_key
from mouthguard.weights.hub import HubSnapshot, find_snapshot

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
#: An index maps every tensor name to a file: a few MiB even for the largest models.
MAX_INDEX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class WeightFile:
    """One file to read: its key on the source's tier and what vouches for its bytes.

    Attributes:
        key: the object key (prefix included).
        name: the file name, as indexes and manifests name it.
        checksum: ``xxh3-128:...`` over the whole file, or None (unverifiable).
        sha256: ``sha256:...`` over the whole file, when the manifest recorded it.
        tensors: the tensor names wanted from this file (None: every tensor in it).
    """

    key: str
    name: str
    checksum: str | None = None
    sha256: str | None = None
    tensors: frozenset[str] | None = None


@dataclass(frozen=True)
class WeightSource:
    """An opened source: its tier, its files and how it was recognised.

    Attributes:
        tier: where the files are.
        files: the files, in the order the source lists them.
        kind: ``"safetensors-index"``, ``"safetensors"`` or ``"checkpoint"``.
        description: a path or URL for messages.
        run: the checkpoint's run (``kind == "checkpoint"``), for messages.
        step: the checkpoint's step, for messages.
    """

    tier: Tier
    files: tuple[WeightFile, ...]
    kind: str
    description: str
    run: str | None = None
    step: int | None = None

    def where(self, file: WeightFile) -> str:
        """How a message names ``file``: with its checkpoint's run and step where known."""
        if self.run is not None:
            return f"{file.name} of run {self.run!r} step {self.step} ({self.description})"
        return f"{self.description}/{file.name}"

    @contextlib.contextmanager
    def naming(self, file: WeightFile) -> Iterator[None]:
        """Re-raise a mouthguard error from the block as the same type naming ``file``.

        The message gains :meth:`where` in front unless it names it already; an
        error type that cannot be built from a message alone passes unchanged.
        """
        try:
            yield
        except MouthguardError as exc:
            where, message = self.where(file), str(exc)
            named: MouthguardError | None = None
            if where not in message:
                with contextlib.suppress(TypeError):  # a type with its own constructor
                    named = type(exc)(f"{where}: {message.removeprefix(f'{file.name}: ')}")
            if named is None:
                raise
            raise named from exc


def open_source(
    source: str | os.PathLike[str] | Tier,
    *,
    prefix: str = "",
    run: str | None = None,
    step: int | None = None,
) -> WeightSource:
    """Recognise ``source`` (see the module docstring) and list what to read.

    Raises:
        WeightsError: nothing loadable there, or the index is malformed.
        ManifestError, SignatureError: a checkpoint manifest that cannot be trusted.
        TierError: the source cannot be read.
    """
    if run is not None:
        return _from_store(source, run, step)
    if not isinstance(source, Tier) and not os.fspath(source).startswith("s3://"):
        snapshot = find_snapshot(Path(source))
        if snapshot is not None:
            return _from_snapshot(snapshot)
    tier = _tier_of(source)
    prefix = prefix.strip("/")
    description = tier.location(prefix)
    if tier.exists(join_key(prefix, MANIFEST_NAME)):
        return _from_checkpoint_dir(tier, prefix, source)
    index_key = join_key(prefix, INDEX_NAME)
    if tier.exists(index_key):
        return _from_index(tier, index_key, description, lambda f: join_key(prefix, f))
    single = join_key(prefix, SINGLE_NAME)
    if tier.exists(single):
        return WeightSource(tier, (WeightFile(single, SINGLE_NAME),), "safetensors", description)
    if isinstance(tier, LocalTier) and any(
        (Path(description) / name).is_symlink() for name in (INDEX_NAME, SINGLE_NAME)
    ):
        raise WeightsError(
            f"{description}: its {INDEX_NAME} or {SINGLE_NAME} is a symbolic link, and links "
            "are followed only inside a hub cache snapshot (models--org--name/snapshots/<rev>): "
            "load the snapshot, or copy the files here"
        )
    raise WeightsError(
        f"{description}: no {INDEX_NAME}, {SINGLE_NAME} or checkpoint {MANIFEST_NAME} "
        "(a checkpoint store needs run=)"
    )


def _tier_of(source: str | os.PathLike[str] | Tier) -> Tier:
    if isinstance(source, Tier):
        return source
    text = os.fspath(source)
    if text.startswith("s3://"):
        from mouthguard.tiers.s3 import S3Tier  # noqa: PLC0415 - obstore/boto3 only when used

        return S3Tier(text, name="weights", domain="s3")
    path = Path(text)
    if not path.is_dir():
        raise WeightsError(f"no model weights at {text}: not a directory")
    return LocalTier(path.resolve(), name="weights", domain="local")


def _from_snapshot(snapshot: HubSnapshot) -> WeightSource:
    description = str(snapshot.snapshot)
    index_key = snapshot.key(INDEX_NAME)
    if index_key is not None:

        def shard(name: str) -> str:
            key = snapshot.key(name)
            if key is None:
                raise WeightsError(f"{description}/{INDEX_NAME} names {name}, which is not there")
            return key

        return _from_index(snapshot.tier, index_key, description, shard)
    single = snapshot.key(SINGLE_NAME)
    if single is not None:
        files = (WeightFile(single, SINGLE_NAME),)
        return WeightSource(snapshot.tier, files, "safetensors", description)
    raise WeightsError(f"{description}: a hub cache snapshot with no {INDEX_NAME} or {SINGLE_NAME}")


def _from_index(
    tier: Tier, index_key: str, description: str, locate: Callable[[str], str]
) -> WeightSource:
    """The shards an index names; ``locate`` gives a shard's key from its file name."""
    info = tier.head(index_key)
    if info.size > MAX_INDEX_BYTES:
        raise WeightsError(f"{description}/{INDEX_NAME} is {info.size} bytes: not an index")
    try:
        raw = strict_json.parse(
            tier.get(index_key), max_depth=8, max_bytes=MAX_INDEX_BYTES, source=INDEX_NAME
        )
    except strict_json.StrictJsonError as exc:
        raise WeightsError(f"{description}/{INDEX_NAME} is not valid JSON: {exc}") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(f"{description}/{INDEX_NAME} has no weight_map of tensors to files")
    by_file: dict[str, set[str]] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise WeightsError(f"{INDEX_NAME}: tensor {name!r} maps to {file!r}, not a file name")
        by_file.setdefault(_plain_name(file), set()).add(name)
    files = tuple(
        WeightFile(locate(f), f, tensors=frozenset(names)) for f, names in sorted(by_file.items())
    )
    return WeightSource(tier, files, "safetensors-index", description)


def _plain_name(name: str) -> str:
    """``name`` if it is one safe file name in the directory (never a path out of it)."""
    try:
        validate_key(name)
    except MouthguardError:
        raise WeightsError(f"{INDEX_NAME} names {name!r}: not a file name") from None
    if "/" in name or not name.endswith(".safetensors"):
        raise WeightsError(f"{INDEX_NAME} names {name!r}: not a .safetensors file beside it")
    return name


def _from_checkpoint_dir(
    tier: Tier, prefix: str, source: str | os.PathLike[str] | Tier
) -> WeightSource:
    """A checkpoint copy directory, as a local ``<root>/<run>/<step>/`` path.

    Or as the prefix ``<run>/<step>`` of a tier or URL opened at the store's root.
    """
    if not prefix and isinstance(tier, LocalTier) and not isinstance(source, Tier):
        path = Path(tier.location())
        root = LocalTier(path.parent.parent, name="weights", domain="local")
        return _checkpoint_files(root, path.parent.name, _step_of(path.name))
    parts = prefix.split("/")
    if len(parts) != 2:
        raise WeightsError(
            f"{tier.location(prefix)} holds a checkpoint manifest, but a checkpoint is read "
            "as <run>/<step> below its store's root: open the root with that prefix"
        )
    return _checkpoint_files(tier, parts[0], _step_of(parts[1]))


def _step_of(name: str) -> int:
    if not name.isdigit():
        raise WeightsError(f"{name!r} is not a checkpoint step directory")
    return int(name)


def _checkpoint_files(tier: Tier, run: str, step: int) -> WeightSource:
    manifest = read_manifest(tier, run, step, keys_from_env())
    prefix = catalog.checkpoint_prefix(run, step)
    files = tuple(
        WeightFile(prefix + r.name, r.name, checksum=r.checksum, sha256=r.sha256)
        for r in manifest.files
    )
    return WeightSource(tier, files, "checkpoint", tier.location(prefix), run, step)


def _from_store(source: str | os.PathLike[str] | Tier, run: str, step: int | None) -> WeightSource:
    tiers = [source] if isinstance(source, Tier) else list(open_store(source, create=False).tiers)
    steps = catalog.committed_steps_on(tiers, run) if step is None else [step]
    if not steps:
        raise WeightsError(f"run {run!r} has no committed checkpoint in {source}")
    chosen = steps[-1]
    holding = catalog.tiers_holding(tiers, run, chosen)
    if not holding:
        raise ObjectNotFoundError(f"{run} step {chosen} is not committed in {source}")
    return _checkpoint_files(holding[0], run, chosen)

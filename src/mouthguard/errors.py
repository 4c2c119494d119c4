"""The exception hierarchy of mouthguard.

Every error raised for bad data, bad input or a failing tier is a subclass of
:class:`MouthguardError`, so callers (and the CLI) can turn any of them into a
clear message without a traceback. Programming errors (wrong argument types in
our own code) stay ordinary Python exceptions.
"""

from __future__ import annotations


class MouthguardError(Exception):
    """Base class of every error mouthguard raises on purpose."""


# --- tiers -----------------------------------------------------------------


class TierError(MouthguardError):
    """A tier could not perform an operation (I/O error, bad key, ...)."""


class InvalidKeyError(TierError):
    """A key is not a safe, relative, normalised object key."""


class ObjectNotFoundError(TierError):
    """The object (or prefix) does not exist on the tier."""


class ObjectExistsError(TierError):
    """A create-only put or rename found its destination already present."""


class DurabilityError(TierError):
    """fsync (or the tier's equivalent) failed.

    This is fatal for the write in progress and is never retried silently: after
    a failed fsync the kernel may have dropped the dirty pages, so a retry that
    "succeeds" proves nothing about what is on disk.
    """


class UnsupportedOperationError(TierError):
    """The tier does not have the capability the operation needs."""


class EncryptionKeyError(TierError):
    """An encrypted object was written with a key this reader does not have.

    Not proof of damage (the configuration may simply lack the key), so it never
    triggers a repair; a load still falls back past the copy.
    """


# --- format ----------------------------------------------------------------


class FormatError(MouthguardError):
    """Stored bytes do not follow the checkpoint format (hostile or damaged)."""


class ManifestError(FormatError):
    """A manifest is unreadable, fails its own checksum, or is inconsistent."""


class RankFileError(FormatError):
    """A rank file's safetensors header is malformed or disagrees with the manifest."""


class ChecksumMismatchError(FormatError):
    """Bytes read back do not match the checksum recorded at save time."""


class AuthenticationError(ChecksumMismatchError):
    """Encrypted bytes fail authentication (AES-GCM tag): tampered, swapped or damaged."""


class SignatureError(ManifestError):
    """A manifest's HMAC signature is missing, wrong, or made with an unknown key.

    Raised only to readers that have a manifest key configured. It is not counted
    as data damage (:func:`is_data_damage`): a reader with the wrong key sees every
    manifest this way, and a repair by a process without the key could not tell a
    forged copy from a good one anyway.
    """


class UnsupportedStateError(MouthguardError):
    """The state to save contains an object that cannot be stored without pickle.

    The message names the key path of the offending object, e.g.
    ``state['optim']['foo']``.
    """


# --- checkpoints -----------------------------------------------------------


class CheckpointError(MouthguardError):
    """Base class for checkpoint-level failures."""


class CheckpointExistsError(CheckpointError):
    """A committed checkpoint already exists for this run and step."""


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint exists for the requested run/step."""


class CorruptCheckpointError(CheckpointError):
    """Every copy of the requested checkpoint failed verification."""


class RankLostError(CheckpointError):
    """A peer rank died or went silent in a checkpoint collective (it timed out or closed).

    Raised on the surviving ranks, within the collective timeout, instead of
    hanging; a restart of every rank resumes from the newest committed checkpoint.
    """


class SuspectCheckpointError(CheckpointError):
    """The requested checkpoint's bytes are intact but its state failed the load's check."""


class NoValidCheckpointError(CheckpointError):
    """No committed checkpoint of the run passed verification."""


class StateMismatchError(CheckpointError):
    """An ``into=`` target does not match the stored tensor (shape, dtype, structure)."""


class RankFailedError(CheckpointError):
    """Another rank of a multi-rank save or load failed; nothing was committed or loaded.

    The message names the failing rank and its error. The rank that failed raises
    its own, original exception.
    """


class ConfigError(MouthguardError):
    """A store configuration (``mouthguard.toml``) is invalid."""


# --- datasets --------------------------------------------------------------


class DatasetError(MouthguardError):
    """Base class for dataset-level failures (``mouthguard.data``)."""


class DatasetNotFoundError(DatasetError):
    """No committed dataset (no ``dataset.json``) at the location named."""


class DatasetExistsError(DatasetError):
    """A committed dataset, or the debris of an unfinished write, is already there."""


class SampleError(DatasetError):
    """A sample given to a writer cannot be stored as WebDataset would read it back.

    The message names the sample's key (and the member, or the source file).
    """


class AdoptionError(DatasetError):
    """A user's data file cannot be indexed in place as it is (``mouthguard data index``).

    A tar that is hostile or that WebDataset would read differently than indexed
    (a member past the end of the file, a negative size, a path-traversal name,
    garbage after the last member, compression), or a file that is not a Parquet
    file pyarrow can read by row group. The message names the file and why.
    """


class MissingDependencyError(MouthguardError):
    """An optional dependency is not installed; the message says what to install."""


class ShardDamagedError(FormatError):
    """A shard or its index does not match the dataset manifest (damaged or hostile).

    Attributes:
        shard: the shard's name (``shard-000007.tar``); the message names it too, so
            the error keeps its meaning when a DataLoader worker re-raises it in the
            main process (torch rebuilds it from the message alone).
    """

    def __init__(self, message: str, *, shard: str = "") -> None:
        super().__init__(message)
        self.shard = shard


class DatasetChangedError(DatasetError):
    """A saved data-loader position belongs to another dataset version.

    The message names both fingerprints and the call that resumes anyway: the
    loader's ``load_state_dict(..., force=True)``, or
    ``TrainingState.load_state_dict(..., force_data=True)`` when it came through
    a :class:`~mouthguard.TrainingState` (which re-raises it with its own keyword).

    Attributes:
        saved: the fingerprint of the dataset the position was saved in.
        current: the fingerprint of the dataset now.
    """

    def __init__(self, message: str, *, saved: str = "", current: str = "") -> None:
        super().__init__(message)
        self.saved = saved
        self.current = current

    @classmethod
    def refusing(cls, saved: str, current: str, *, resume_with: str) -> DatasetChangedError:
        """The error for ``saved`` != ``current``, naming ``resume_with`` as the way past it."""
        return cls(
            f"the saved data position is in dataset {saved}, but the dataset "
            f"now is {current}: refusing to resume on other data "
            f"({resume_with} resumes anyway, at the same epoch and count)",
            saved=saved,
            current=current,
        )


class DataStateError(DatasetError):
    """A saved data-loader state is malformed or was saved under another configuration."""


def is_data_damage(exc: BaseException) -> bool:
    """Whether ``exc`` proves the stored bytes are damaged (not merely unreachable).

    Checksum, format and missing-file errors are damage: retrying will not help
    and the copy must be repaired. Other tier errors (I/O errors, timeouts, a
    dead object store) may be transient and never justify touching a copy.
    """
    return isinstance(exc, FormatError | ObjectNotFoundError) and not isinstance(
        exc, SignatureError
    )


class CheckpointFallbackWarning(UserWarning):
    """Emitted when ``load()`` skips a damaged copy or checkpoint and falls back."""


class UnsignedRestoreWarning(UserWarning):
    """Files restored from an unsigned store are ones a framework will unpickle.

    Checksums prove the bytes are the ones written, not who wrote them: anyone
    who could write the store could have planted them. A manifest key
    (``$MOUTHGUARD_MANIFEST_KEY``) makes only validly signed checkpoints load.
    """


class SuspectStateWarning(UserWarning):
    """Emitted when a save's check fails: the state is committed as transient and suspect."""


# --- KV cache --------------------------------------------------------------


class KVCacheError(MouthguardError):
    """A KV-cache store was misused or misconfigured (``mouthguard.kvcache``).

    Bad arguments (a block count that does not match the tokens, a negative token
    id, capacities that cannot hold one segment) and calls on a closed store raise
    it. Damaged stored blocks never do: a block that fails its checksum is a miss.
    """


class KVCacheBusyError(KVCacheError):
    """Another process (or another open ``KVStore``) already owns the disk directory."""


class WeightsError(MouthguardError):
    """Model weights cannot be loaded as asked (``mouthguard.weights``).

    A source that is neither a safetensors model directory nor a checkpoint, an
    index naming a file that is not there, a tensor-parallel split that does not
    divide a tensor, a device that is not available. Damaged bytes raise the
    format's own errors (``ChecksumMismatchError``, ``RankFileError``).
    """

"""The coordinator's part of every save, shared by the Checkpointer and the DCP writer.

Two writers produce checkpoints: ``Checkpointer.save`` (its ranks agree through
:mod:`~mouthguard.checkpoint.committer`'s collectives) and
``mouthguard.dcp.Writer`` (DCP's planner and ``finish`` are its collectives).
How the ranks meet differs; what the coordinator does around the rank files is
this module, for both, in this order::

    txn = clear_the_way(tier, run, step)      # before any rank writes: a valid
                                              # committed step refuses the save, a
                                              # damaged one is set aside
    staging = staging_prefix(tier, run, step, txn)
    ... every rank writes its file into staging, inside
    with discarding_on_failure(...):          # a failure removes what was staged
    manifest, raw = commit_staged(            # once every rank reported its file:
        tier, run, step, staging, world_size,
        build, keys=, validate=)              #   1. build() the manifest over the records
                                              #   2. serialise it (signed with keys) and
                                              #      re-parse the exact bytes as hostile
                                              #   3. validate(parsed): the writer's own
                                              #      reader-side checks (DCP: its metadata)
                                              #   4. several ranks: every rank file visible
                                              #      to the coordinator with its size
                                              #   5. the manifest last, create-only, then
                                              #      the rename (writer.commit_bytes),
                                              #      between an intent and an outcome
                                              #      record in the audit trail
    after_commit(tier, manifest, listener)    # 6. the importance hint down (advisory)
                                              # 7. the listener hears of the commit

Failure before the commit removes what this save staged (its private staging
directory; on tiers without rename, its own rank files under the final prefix)
and raises the original error. When another writer holds the step (its commit
won the create-only race), nothing under the final prefix is touched -- those
objects may be the winner's -- and :class:`CheckpointExistsError` is raised.
The DCP writer never calls ``finish`` (so never ``commit_staged``) when a rank
failed: DCP raises on every rank first, and the staging waits for ``gc``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.audit import audited
from mouthguard.checkpoint.hints import pass_hint_down
from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.checkpoint.quarantine import SetAside, set_aside_confirmed
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.checkpoint.writer import commit_bytes
from mouthguard.errors import (
    CheckpointExistsError,
    MouthguardError,
    ObjectExistsError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.format.manifest import FileRecord, Manifest
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring

log = logging.getLogger(__name__)


def clear_the_way(tier: Tier, run: str, step: int) -> str:
    """Refuse a valid existing ``step``, set a damaged one aside; return a new txn id.

    A resumed run that fell back past a damaged checkpoint saves that step again:
    the damaged copy is moved out of the way (bytes kept for inspection) once a
    second read confirms the damage, so the new save can commit.

    Raises:
        CheckpointExistsError: the step is committed and reads back intact.
        TierError: the existing copy cannot be read now (timeout, dead store):
            nothing is touched and nothing is saved.
    """
    if tier.exists(catalog.manifest_key(run, step)):
        ref = CopyRef(tier, run, step)
        verdict = verify_and_record(ref)
        if verdict.ok:
            raise CheckpointExistsError(f"checkpoint {run} step {step} already exists")
        if not verdict.damaged:
            raise TierError(
                f"cannot save {run} step {step}: the copy already committed on "
                f"{tier.name!r} cannot be verified now ({verdict.reason}); it was left as it is"
            )
        if set_aside_confirmed(ref, verdict.reason) is SetAside.NOT_CONFIRMED:
            raise CheckpointExistsError(
                f"checkpoint {run} step {step} already exists (a second read found it intact)"
            )
    return catalog.new_transaction_id()


@contextmanager
def discarding_on_failure(
    tier: Tier, run: str, step: int, staging: str, world_size: int, *, clean: bool = True
) -> Iterator[None]:
    """Within: a failure removes what this save staged (if ``clean``) and is re-raised.

    ``clean`` is for the coordinator; the other ranks only re-raise. Another
    writer holding the step (``ObjectExistsError`` at a create-only put, or
    ``CheckpointExistsError``) becomes :class:`CheckpointExistsError`, and then
    only a private staging directory is removed: on tiers without rename the
    objects under the final prefix may be the winner's.
    """
    try:
        yield
    except (ObjectExistsError, CheckpointExistsError):
        if clean and staging != catalog.checkpoint_prefix(run, step):
            remove_quietly(tier, staging)
        raise CheckpointExistsError(
            f"checkpoint {run} step {step} was committed by another writer"
        ) from None
    except BaseException:
        if clean:
            discard_staged(tier, run, step, staging, world_size)
        raise


def commit_staged(  # noqa: PLR0917 - the staged save, named in full
    tier: Tier,
    run: str,
    step: int,
    staging: str,
    world_size: int,
    build: Callable[[], Manifest],
    *,
    keys: Keyring | None = None,
    validate: Callable[[Manifest], object] | None = None,
    actor: str | None = None,
) -> tuple[Manifest, bytes]:
    """Coordinator: write the manifest over every staged rank file and publish it.

    Steps 1-5 of the module docstring, inside :func:`discarding_on_failure`.
    ``build`` makes the manifest from what the ranks reported (it may refuse an
    incomplete set by raising); ``validate`` raises if a reader would reject the
    parsed manifest. Returns the committed manifest, parsed from its exact
    bytes, and those bytes. The commit is recorded in the audit trail
    (:mod:`~mouthguard.checkpoint.audit`) by ``actor`` (default ``user@host``):
    the intent before the manifest is written, the outcome after.

    Raises:
        CheckpointExistsError: another writer committed the step meanwhile.
        ObjectNotFoundError: a rank file is not in staging as the coordinator sees it.
        TierError: a rank file has another size there (the tier is not shared by
            every rank), or the tier failed.
        MouthguardError: ``build`` or ``validate`` refused; nothing is committed.
    """
    with discarding_on_failure(tier, run, step, staging, world_size):
        raw = build().to_bytes(keys)
        manifest = Manifest.from_bytes(raw)  # peers' records are validated before the commit
        if validate is not None:
            validate(manifest)
        if world_size > 1:
            # One rank's own put has returned: there is nothing to check without peers.
            check_visible(tier, staging, manifest.files)
        reason = f"{manifest.importance.value} save by {world_size} rank(s)"
        with audited("commit", run, step, [tier], reason, actor, keys):
            commit_bytes(tier, staging, catalog.checkpoint_prefix(run, step), raw)
    return manifest, raw


def after_commit(tier: Tier, manifest: Manifest, listener: CheckpointListener | None) -> None:
    """Coordinator, once committed: pass the importance hint down, then tell the listener."""
    pass_hint_down(CopyRef(tier, manifest.run, manifest.step), manifest.importance, manifest)
    if listener is not None:
        listener.notify_commit(manifest.run, manifest.step)


def check_visible(tier: Tier, staging: str, files: tuple[FileRecord, ...]) -> None:
    """Every rank file is visible to the coordinator with its size, or the save fails.

    A rank file the coordinator cannot see means the tier is not shared by all
    ranks: committing a manifest over it would be a lie.
    """
    for record in files:
        try:
            size = tier.head(staging + record.name).size
        except ObjectNotFoundError:
            raise ObjectNotFoundError(
                f"{record.name} is not visible on tier {tier.name!r} from the coordinator: "
                "is the tier shared by every rank?"
            ) from None
        if size != record.size:
            raise TierError(
                f"{record.name} has {size} bytes on tier {tier.name!r} as the coordinator "
                f"sees it, its rank wrote {record.size}: is the tier shared by every rank?"
            )


def discard_staged(tier: Tier, run: str, step: int, staging: str, world_size: int) -> None:
    """Remove what a failed save staged, leaving any committed checkpoint alone."""
    final = catalog.checkpoint_prefix(run, step)
    if staging != final:
        remove_quietly(tier, staging)
    elif not tier.exists(catalog.manifest_key(run, step)):
        # No rename (object stores): remove our own uncommitted rank files so a
        # retry of this step is not blocked by them.
        for rank in range(world_size):
            remove_key_quietly(tier, final + catalog.rank_file_name(rank))


def remove_key_quietly(tier: Tier, key: str) -> None:
    """Best-effort removal of one object of a failed save."""
    try:
        tier.delete(key)
    except MouthguardError as exc:
        log.warning("could not remove %s on %s: %s", key, tier.name, exc)


def remove_quietly(tier: Tier, prefix: str) -> None:
    """Best-effort cleanup of a failed save; the original error is what matters."""
    try:
        tier.delete_prefix(prefix)
    except MouthguardError as exc:
        log.warning("could not remove partial save %s on %s: %s", prefix, tier.name, exc)

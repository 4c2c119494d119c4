"""Hugging Face hub cache snapshots, read without trusting their links.

``huggingface_hub`` keeps each file of a model once, as ``blobs/<hash>`` in the
model's cache folder, and names it in every revision that has it with a
relative symbolic link::

    models--org--name/
        blobs/<hash>
        refs/main                          the commit hash of the main branch
        snapshots/<rev>/model.safetensors -> ../../blobs/<hash>

The local tier opens files with ``O_NOFOLLOW`` and never follows a link, and
that stays so. A snapshot is instead read through a tier over the model's cache
folder, each file name mapped to the object its link names, by reading the link
here:

* the link's target, resolved against the snapshot's real path, must stay inside
  the model's cache folder; a link that leaves it is refused with an error naming
  the file and where it points;
* the target must exist: a dangling link (an interrupted or pruned download) is
  an error naming the file;
* the target is then opened by the local tier, which refuses a path through
  another link (``blobs`` itself a link, a link to a link) as it refuses any.

A regular file in a snapshot (copied rather than linked) is read where it is.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mouthguard.errors import MouthguardError, WeightsError
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.object_keys import validate_key, validate_segment

MODEL_FOLDER_PREFIX = "models--"
SNAPSHOTS = "snapshots"
MAIN_REF = "refs/main"


@dataclass(frozen=True)
class HubSnapshot:
    """One revision of a model in a hub cache.

    Attributes:
        model_dir: the model's cache folder (``models--org--name``), a real path.
        snapshot: the revision's folder, ``model_dir/snapshots/<rev>``.
        tier: a local tier over ``model_dir``; :meth:`key` gives its keys.
    """

    model_dir: Path
    snapshot: Path
    tier: LocalTier

    def key(self, name: str) -> str | None:
        """The tier key of the snapshot's file ``name``, or None if it has none.

        Raises:
            WeightsError: ``name`` is a link that leaves the model's cache folder,
                a dangling link, or not a file.
        """
        try:
            validate_key(name)
        except MouthguardError:
            raise WeightsError(f"{self.snapshot}: {name!r} is not a file name") from None
        path = self.snapshot / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISREG(mode):
            return path.relative_to(self.model_dir).as_posix()
        if not stat.S_ISLNK(mode):
            raise WeightsError(f"{path} is not a file")
        return self._link_key(path)

    def _link_key(self, path: Path) -> str:
        text = str(path.readlink())
        # Lexical: ``..`` is applied to the real snapshot path; a component that is
        # itself a link is refused later by the local tier, never followed.
        target = Path(os.path.normpath(path.parent / text))
        if not target.is_relative_to(self.model_dir) or target == self.model_dir:
            raise WeightsError(
                f"{path} is a link to {text!r} ({target}), outside the model's cache "
                f"folder {self.model_dir}: refused (links are followed only inside it)"
            )
        if not os.path.lexists(target):
            raise WeightsError(
                f"{path} is a dangling link: its target {target} does not exist "
                "(an interrupted or pruned download?)"
            )
        return target.relative_to(self.model_dir).as_posix()


def find_snapshot(directory: Path) -> HubSnapshot | None:
    """``directory`` as a hub cache snapshot, or None if it is not one.

    A snapshot is ``.../models--org--name/snapshots/<rev>``; the model's folder
    ``models--org--name`` itself means the snapshot ``refs/main`` names.

    Raises:
        WeightsError: a model folder without ``refs/main``, or whose ``refs/main``
            names no snapshot.
    """
    real = Path(os.path.realpath(directory))
    if real.parent.name == SNAPSHOTS and real.parent.parent.name.startswith(MODEL_FOLDER_PREFIX):
        model_dir = real.parent.parent
        return HubSnapshot(model_dir, real, LocalTier(model_dir, name="weights", domain="local"))
    if not (real.name.startswith(MODEL_FOLDER_PREFIX) and (real / SNAPSHOTS).is_dir()):
        return None
    return find_snapshot(real / SNAPSHOTS / _main_revision(real))


def _main_revision(model_dir: Path) -> str:
    try:
        revision = (model_dir / MAIN_REF).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        revision = ""
    try:
        validate_segment(revision)
    except MouthguardError:
        revisions = sorted(p.name for p in (model_dir / SNAPSHOTS).iterdir())
        raise WeightsError(
            f"{model_dir}: no commit in {MAIN_REF}; load one of its snapshots "
            f"({', '.join(revisions) or 'none'}) by its folder {model_dir / SNAPSHOTS}/<rev>"
        ) from None
    if not (model_dir / SNAPSHOTS / revision).is_dir():
        raise WeightsError(f"{model_dir}: {MAIN_REF} names {revision}, which has no snapshot")
    return revision

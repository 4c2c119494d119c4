"""The on-disk states a power loss may leave, from a recorded operation log.

The persistence model (what a power loss, kernel panic or node reboot may keep):

* **Data.** A ``write`` or ``truncate`` of a file is *covered* once an
  ``fsync``/``fdatasync`` of that file follows it; a covered operation
  persists. An uncovered write may be lost or persist in part, page by page
  (4 KiB pages: each page it touched independently keeps the new bytes or
  the old ones; the file grows only as far as its persisted pages reach).
* **Names.** A ``create`` (file or directory), ``link``, ``unlink``/``rmdir``
  or ``rename`` is covered once an ``fsync`` of its directory follows it (for
  a rename: of the destination directory); uncovered, it may be lost. A
  rename persists or is lost whole (it is atomic).
* **No order among what is not synced.** Covered operations persist; the
  uncovered ones persist or are lost independently of one another and of
  the order they were issued in (write-back and journal commits between two
  ``fsync`` calls follow no promise). Nothing is reordered across an
  ``fsync``: what it covers is on the disk before any later operation is
  issued, so no later operation can persist without it. (A stronger rule --
  "if anything after an ``fsync`` persisted, everything before it did" --
  would let any later ``fsync`` hide a missing one; it is deliberately not
  assumed.)

So a crash after the first ``k`` operations leaves every covered operation
and any subset of the uncovered ones, each uncovered write possibly torn.

The states enumerated for each crash point (:func:`candidates`) are: none of
the uncovered operations; all of them; each in-order prefix of them; all but
one, for each one; only one, for each one; and, for each uncovered write of
more than one page, all the others with that write torn: each in-order prefix
of its pages, all its pages but one (for each page), every other page. The
space of all subsets is exponential; this family is what "all states" means at
the soak level, and states with the same content are counted once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from reliability.fsrecord import Op

PAGE = 4096
#: What each operation persists in a crash state: all of it, or only these pages.
Pages = frozenset[int]
ALL: Pages = frozenset({-1})

_MUTATIONS = ("create", "write", "truncate", "rename", "link", "unlink")


@dataclass(frozen=True)
class Step:
    """One mutation of the log, with model inode ids (never reused)."""

    index: int  # position in the log
    op: Op
    target: int | None  # model id written, created, linked or moved
    dir: int | None  # model id of the directory whose entry changes (destination)
    sdir: int | None  # rename: model id of the source directory
    covered_at: int  # log position of the fsync that covers it (len(log) if none)


@dataclass
class Log:
    """A recorded log, resolved: the mutations with their coverage, marks, fsync positions."""

    ops: list[Op]
    steps: list[Step]
    fsyncs: list[int]
    root: int = 0

    @classmethod
    def resolve(cls, ops: list[Op], root_ino: int) -> Log:
        """Bind real inode numbers to model ids in log order, find what covers what."""
        ids: dict[int, int] = {root_ino: 0}
        next_id = 1

        def model(ino: int | None) -> int | None:
            nonlocal next_id
            if ino is None:
                return None
            if ino not in ids:  # existed before the log (or was never created here)
                ids[ino] = next_id
                next_id += 1
            return ids[ino]

        raw: list[tuple[int, Op, int | None, int | None, int | None]] = []
        fsyncs: list[int] = []
        synced_ids: list[int | None] = []
        for i, op in enumerate(ops):
            kind = op["op"]
            if kind == "create":
                ids[op["ino"]] = next_id  # a new inode, even if the number is reused
                next_id += 1
            if kind == "fsync":
                fsyncs.append(i)
                synced_ids.append(model(op["ino"]))
            elif kind in _MUTATIONS:
                raw.append(
                    (i, op, model(op.get("ino")), model(op.get("dir")), model(op.get("sdir")))
                )
        steps = []
        for i, op, target, directory, sdir in raw:
            covers = target if op["op"] in ("write", "truncate") else directory
            covered_at = next(
                (
                    pos
                    for pos, synced in zip(fsyncs, synced_ids, strict=True)
                    if pos > i and synced == covers
                ),
                len(ops),
            )
            steps.append(Step(i, op, target, directory, sdir, covered_at))
        return cls(ops, steps, fsyncs)

    def marks_before(self, k: int) -> list[Op]:
        """The driver's marks among the first ``k`` operations."""
        return [op for op in self.ops[:k] if op["op"] == "mark"]


@dataclass(frozen=True)
class CrashState:
    """A crash after ``k`` operations: which mutations persisted, and how much of each."""

    k: int
    kept: tuple[tuple[int, Pages], ...]  # (index into Log.steps, pages or ALL)
    how: str


def _write_pages(op: Op) -> list[int]:
    start, end = op["off"], op["off"] + len(op["data"])
    return list(range(start // PAGE, (end + PAGE - 1) // PAGE))


def candidates(log: Log, k: int) -> Iterator[CrashState]:
    """The states of the family above for a crash after the first ``k`` operations."""
    steps = [n for n, s in enumerate(log.steps) if s.index < k]
    base = [n for n in steps if log.steps[n].covered_at < k]
    free = [n for n in steps if log.steps[n].covered_at >= k]
    yield from _subsets(k, base, free, log)


def _subsets(k: int, base: list[int], free: list[int], log: Log) -> Iterator[CrashState]:
    def state(extra: list[int], how: str, torn: tuple[int, Pages] | None = None) -> CrashState:
        kept = [(n, ALL) for n in sorted(base + extra)]
        if torn is not None:
            kept = sorted([*kept, torn])
        return CrashState(k, tuple(kept), how)

    yield state([], "all uncovered lost")
    if not free:
        return
    yield state(free, "all persisted")
    for i in range(1, len(free)):
        yield state(free[:i], f"first {i} persisted")
    if len(free) > 1:
        for n in free:
            yield state([m for m in free if m != n], f"only #{log.steps[n].index} lost")
            yield state([n], f"only #{log.steps[n].index} persisted")
    for n in free:
        op = log.steps[n].op
        if op["op"] != "write":
            continue
        pages = _write_pages(op)
        if len(pages) < 2:
            continue
        others = [m for m in free if m != n]
        tears = [(f"first {i} pages", pages[:i]) for i in range(1, len(pages))]
        tears += [(f"page {p} lost", [q for q in pages if q != p]) for p in pages]
        tears.append(("every other page", pages[::2]))
        for name, chosen in tears:
            yield state(others, f"#{log.steps[n].index} torn: {name}", (n, frozenset(chosen)))


# --- replay ------------------------------------------------------------------------


@dataclass
class Image:
    """A file-system image: directory entries and file contents by model id."""

    entries: dict[int, dict[str, int]]
    data: dict[int, bytearray]

    def files(self) -> Iterator[tuple[str, bytes]]:
        """``(relative path, bytes)`` of every file reachable from the root, sorted."""
        yield from self._walk(0, "", set())

    def _walk(self, node: int, prefix: str, seen: set[int]) -> Iterator[tuple[str, bytes]]:
        seen.add(node)
        for name in sorted(self.entries.get(node, {})):
            child = self.entries[node][name]
            path = f"{prefix}{name}"
            if child in self.entries:
                if child not in seen:
                    yield f"{path}/", b""
                    yield from self._walk(child, f"{path}/", seen)
            else:
                yield path, bytes(self.data.get(child, b""))

    def digest(self) -> str:
        """A hash of the whole image (paths and bytes): equal states are counted once."""
        h = hashlib.blake2b(digest_size=16)
        for path, data in self.files():
            h.update(path.encode() + b"\0" + len(data).to_bytes(8, "little"))
            h.update(data)
        return h.hexdigest()

    def write_to(self, directory: Path) -> None:
        """Create the image's directories and files under ``directory`` (created)."""
        directory.mkdir(parents=True, exist_ok=True)
        for path, data in self.files():
            target = directory / path
            if path.endswith("/"):
                target.mkdir(exist_ok=True)
            else:
                target.write_bytes(data)


def replay(log: Log, state: CrashState) -> Image:
    """Apply the persisted mutations of ``state`` in log order to an empty root."""
    image = Image(entries={0: {}}, data={})
    for n, pages in state.kept:
        step = log.steps[n]
        _apply(image, step, pages)
    return image


def _apply(image: Image, step: Step, pages: Pages) -> None:
    op = step.op
    kind = op["op"]
    if kind == "create":
        assert step.target is not None
        assert step.dir is not None
        if op["kind"] == "dir":
            image.entries.setdefault(step.target, {})
        else:
            image.data.setdefault(step.target, bytearray())
        image.entries.setdefault(step.dir, {})[op["name"]] = step.target
    elif kind == "link":
        assert step.target is not None
        assert step.dir is not None
        image.entries.setdefault(step.dir, {})[op["name"]] = step.target
    elif kind == "rename":
        assert step.dir is not None
        assert step.sdir is not None
        # A rename whose source never persisted moves nothing (a journal never
        # commits the rename of a name it has not got).
        moved = image.entries.get(step.sdir, {}).pop(op["sname"], None)
        if moved is not None:
            image.entries.setdefault(step.dir, {})[op["name"]] = moved
    elif kind == "unlink":
        assert step.dir is not None
        image.entries.get(step.dir, {}).pop(op["name"], None)
    elif kind == "truncate":
        assert step.target is not None
        buf = image.data.setdefault(step.target, bytearray())
        size = op["size"]
        del buf[size:]
        buf.extend(bytes(size - len(buf)))
    elif kind == "write":
        assert step.target is not None
        buf = image.data.setdefault(step.target, bytearray())
        _write(buf, op["off"], op["data"], pages)


def _write(buf: bytearray, off: int, data: bytes, pages: Pages) -> None:
    if pages == ALL:
        spans = [(off, off + len(data))]
    else:
        spans = [(max(off, p * PAGE), min(off + len(data), (p + 1) * PAGE)) for p in sorted(pages)]
    for start, end in spans:
        if start >= end:
            continue
        if len(buf) < end:
            buf.extend(bytes(end - len(buf)))
        buf[start:end] = data[start - off : end - off]

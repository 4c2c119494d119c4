"""The audit trail: every act recorded before it is acknowledged, every edit found."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from typing_extensions import override

import mouthguard
from mouthguard.checkpoint import audit
from mouthguard.checkpoint.audit_check import acts, check_store, merged, read_trails
from mouthguard.checkpoint.sidecars import CopyRef, report_damage
from mouthguard.checks import finite
from mouthguard.cli.main import main
from mouthguard.errors import CheckpointFallbackWarning, TierError
from mouthguard.format.audit_record import AuditRecord
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode
from mouthguard.tiers.key_material import Keyring
from mouthguard.tiers.wrapper import WrappedTier
from tests.checkpoint.helpers import flip_byte

ROOT = Path(__file__).parents[2]


def _child_env() -> dict[str, str]:
    """The environment for a child interpreter: this checkout's tests and sources first."""
    paths = [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


DAY = 86400.0
KEY = "a" * 64


def _acts(store: mouthguard.Store, run: str = "r") -> list[tuple[str, int | None, str]]:
    """(act, step, status) of every recorded act, oldest first."""
    return [
        (a.intent.record.act, a.intent.record.step, a.status)
        for a in acts(merged(read_trails(store.tiers)), run)
    ]


def _trail_dir(store: mouthguard.Store, tier: str) -> Path:
    return Path(store.tier(tier).location("_audit/"))


def _save(ckpt: mouthguard.Checkpointer, steps: range, importance: str = "routine") -> None:
    for step in steps:
        ckpt.save(step, {"w": torch.full((16,), float(step))}, importance=importance)


# --- every act produces its record -------------------------------------------------------


def test_every_act_on_a_checkpoint_is_recorded_with_who_why_and_where(
    store: mouthguard.Store,
) -> None:
    ckpt = mouthguard.Checkpointer(store, "r", background=False, actor="alice@lab")
    _save(ckpt, range(1, 7))
    Replicator(store).run_once()
    ckpt.hold(6, "legal", reason="case 42")
    ckpt.release(6, "legal", actor="bob@lab")
    ckpt.release(6, "legal")  # none left: recorded as not needed
    ckpt.set_importance(5, "milestone", reason="eval point")
    now = time.time()
    apply_retention(store, now=now, actor="janitor")  # trash 1 and 2 (keep-last 3 + milestone)
    ckpt.set_importance(2, "critical", reason="oops, keep it")
    apply_retention(store, now=now, actor="janitor")  # restore 2 from the trash
    apply_retention(store, now=now + 2 * DAY, actor="janitor")  # purge 1

    recorded = _acts(store)
    kinds = {(act, step) for act, step, _ in recorded}
    assert {("commit", s) for s in range(1, 7)} <= kinds
    assert {("copy", s) for s in range(1, 7)} <= kinds
    assert {("hold", 6), ("release", 6), ("importance", 5), ("importance", 2)} <= kinds
    assert {("trash", 1), ("trash", 2), ("restore", 2), ("purge", 1)} <= kinds
    assert ("release", 6, "not needed") in recorded
    assert all(status in ("done", "not needed") for _, _, status in recorded)

    by_act = {
        (a.intent.record.act, a.intent.record.step): a.intent.record
        for a in acts(merged(read_trails(store.tiers)), "r")
    }
    hold = by_act[("hold", 6)]
    assert hold.actor == "alice@lab" and hold.reason == "legal: case 42"
    assert set(hold.tiers) == {"fast", "durable"}
    assert by_act[("release", 6)].actor in ("bob@lab", "alice@lab")
    assert by_act[("trash", 1)].actor == "janitor"
    assert "last 3" in by_act[("trash", 1)].reason
    assert dict(by_act[("copy", 1)].extra) == {"from": "fast"}
    assert by_act[("commit", 1)].tiers == ("fast",)
    breaks, _ = check_store(store.tiers, None)
    assert breaks == []


def test_damage_found_set_aside_and_suspect_marks_are_recorded(
    store: mouthguard.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(audit.ENV_ACTOR, "ops@site")
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    _save(ckpt, range(1, 3))
    ckpt.save(3, {"w": torch.full((16,), float("nan"))})
    flip_byte(Path(store.fast.location("r/000000000002/rank-00000.safetensors")), 4100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        loaded = ckpt.load(check=finite())  # 3 is suspect, 2 is damaged: resumes from 1
    assert loaded.step == 1
    ckpt.save(2, {"w": torch.ones(16)})  # the damaged copy is set aside, then re-saved
    recorded = _acts(store)
    assert ("suspect", 3, "done") in recorded
    assert ("damage", 2, "done") in recorded
    assert ("set-aside", 2, "done") in recorded
    assert [s for a, s, _ in recorded if a == "commit"] == [1, 2, 3, 2]
    actors = {a.intent.record.actor for a in acts(merged(read_trails(store.tiers)), "r")}
    assert actors == {"ops@site"}


# --- written before the act, outcome after -------------------------------------------------


class _NoTrail(WrappedTier):
    """A tier that refuses every write of the audit trail (a full or read-only trail)."""

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        if key.startswith(audit.TRAIL_DIR + "/"):
            raise TierError("trail not writable")
        return self.inner.put(key, data, mode=mode)


def test_an_act_whose_intent_cannot_be_recorded_is_not_done(store: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    _save(ckpt, range(1, 2))
    broken = mouthguard.Store([_NoTrail(t) for t in store.tiers], source=store.source)
    with pytest.raises(TierError, match="audit trail"):
        mouthguard.Checkpointer(broken, "r", background=False).hold(1, "legal")
    assert ckpt.info(1).holds == ()  # type: ignore[union-attr]
    with pytest.raises(TierError, match="audit trail"):
        mouthguard.Checkpointer(broken, "r", background=False).save(2, {"w": torch.ones(2)})
    assert ckpt.steps() == [1]


@pytest.mark.parametrize("act", ["hold", "commit"])
def test_a_kill_between_intent_and_outcome_leaves_the_intent_saying_so(
    tmp_path: Path, act: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    store = mouthguard.open_store(path)
    _save(mouthguard.Checkpointer(store, "r", background=False), range(1, 2))
    child = subprocess.Popen(  # our own interpreter and module
        [sys.executable, "-m", "tests.checkpoint.audit_child", str(path), act],
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(),
        cwd=ROOT,
    )
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "paused"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
    step = 1 if act == "hold" else 2
    interrupted = [a for a in acts(merged(read_trails(store.tiers)), "r") if a.outcome is None]
    assert [(a.intent.record.act, a.intent.record.step) for a in interrupted] == [(act, step)]
    assert interrupted[0].intent.record.actor == "child@test"
    assert "no outcome recorded" in interrupted[0].status
    # The act did not happen; the trail is still a valid chain, and says what is open.
    info = mouthguard.Checkpointer(store, "r", background=False).info(1)
    assert info is not None and info.holds == ()
    assert mouthguard.Checkpointer(store, "r", background=False).steps() == [1]
    capsys.readouterr()
    assert main(["--store", str(path), "audit", "--check"]) == 0
    assert f"no outcome: {act} of r step {step}" in capsys.readouterr().out
    # Later acts chain on after the orphaned intent.
    mouthguard.Checkpointer(store, "r", background=False).hold(1, "later")
    assert check_store(store.tiers, None)[0] == []


def test_two_processes_appending_at_once_never_clobber_each_other(tmp_path: Path) -> None:
    path = tmp_path / "store"
    mouthguard.open_store(path)
    code = (
        "import sys, mouthguard\n"
        "from mouthguard.checkpoint.audit import audited\n"
        "store = mouthguard.open_store(sys.argv[1])\n"
        "for i in range(25):\n"
        "    with audited('hold', 'r', i, [store.fast], sys.argv[2]):\n"
        "        pass\n"
    )
    env = _child_env()
    children = [
        subprocess.Popen([sys.executable, "-c", code, str(path), name], env=env)
        for name in ("one", "two")
    ]
    assert [c.wait(timeout=300) for c in children] == [0, 0]
    store = mouthguard.open_store(path)
    breaks, trails = check_store(store.tiers, None)
    assert breaks == []
    entries = trails.entries["fast"]
    assert [e.seq for e in entries] == list(range(100))  # 2 writers x 25 acts x 2 records
    done = acts(merged(trails), "r")
    assert sorted(a.intent.record.reason for a in done) == ["one"] * 25 + ["two"] * 25
    assert all(a.status == "done" for a in done)


# --- tampering ---------------------------------------------------------------------------


@pytest.fixture
def trail(store: mouthguard.Store) -> mouthguard.Store:
    """Run r: 4 commits and a hold, replicated (a trail on each of the two tiers)."""
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    _save(ckpt, range(1, 5))
    Replicator(store).run_once()
    ckpt.hold(4, "legal", reason="case 42")
    assert check_store(store.tiers, None)[0] == []
    return store


def _edit(path: Path, old: bytes, new: bytes) -> None:
    raw = path.read_bytes()
    assert old in raw
    path.write_bytes(raw.replace(old, new))


def test_an_edited_record_is_found_and_named(trail: mouthguard.Store) -> None:
    record = _trail_dir(trail, "fast") / "000000000002.json"
    _edit(record, b"routine save", b"routine SAVE")
    (brk,) = check_store(trail.tiers, None)[0]
    assert (brk.tier, brk.seq) == ("fast", 2) and "edited" in brk.what


def test_a_removed_record_is_found_and_named(trail: mouthguard.Store) -> None:
    (_trail_dir(trail, "fast") / "000000000003.json").unlink()
    (brk,) = check_store(trail.tiers, None)[0]
    assert (brk.tier, brk.seq) == ("fast", 3) and "missing: removed" in brk.what


def test_reordered_records_are_found(trail: mouthguard.Store) -> None:
    folder = _trail_dir(trail, "fast")
    a, b = folder / "000000000001.json", folder / "000000000004.json"
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(raw_b)
    b.write_bytes(raw_a)
    breaks = check_store(trail.tiers, None)[0]
    assert {(x.tier, x.seq) for x in breaks} >= {("fast", 1), ("fast", 4)}
    moved = {x.seq for x in breaks if "moved" in x.what}
    assert moved == {1, 4}


def test_a_cut_tail_on_one_tier_is_found_from_the_other(trail: mouthguard.Store) -> None:
    folder = _trail_dir(trail, "durable")
    last = sorted(folder.iterdir())
    for path in last[-2:]:  # the hold's intent and outcome
        path.unlink()
    breaks = check_store(trail.tiers, None)[0]
    assert [(b.tier, "hold" in b.what and "missing here" in b.what) for b in breaks] == [
        ("durable", True)
    ]


def test_with_a_key_a_rewritten_chain_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOUTHGUARD_MANIFEST_KEY", KEY)
    store = mouthguard.open_store(tmp_path / "store")
    _save(mouthguard.Checkpointer(store, "r", background=False), range(1, 3))
    folder = _trail_dir(store, "fast")
    records = sorted(folder.iterdir())
    body = json.loads(records[-1].read_bytes())
    assert body["mac"].startswith("blake2b:")
    # Whoever lacks the key can edit the newest record and keep it canonical: the
    # chain cannot see that (nothing follows it), the signature can.
    body["actor"] = "mallory@evil"
    records[-1].write_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    keys = audit.trail_keys(None)
    (brk,) = check_store(store.tiers, keys)[0]
    assert brk.seq == len(records) - 1 and "signature does not match" in brk.what
    # Without the key the same edit is invisible: that is what the key is for.
    assert check_store(store.tiers, None)[0] == []
    other = Keyring.single(bytes.fromhex("b" * 64))
    assert all("not in the keyring" in b.what for b in check_store(store.tiers, other)[0])


# --- the command --------------------------------------------------------------------------


def test_audit_lists_filters_exports_and_checks(
    trail: mouthguard.Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # rich reads it: no table cell wrapped
    root = trail.source
    capsys.readouterr()
    assert main(["--store", root, "audit", "r", "4", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["act"] for x in lines] == ["commit", "copy", "hold"]
    assert lines[2]["reason"] == "legal: case 42" and lines[2]["status"] == "done"
    assert lines[1]["from"] == "fast"
    assert main(["--store", root, "audit", "--since", "1h", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 9
    assert main(["--store", root, "audit", "--since", "2099-01-01", "--json"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["--store", root, "audit"]) == 0
    assert "legal: case 42" in capsys.readouterr().out
    assert main(["--store", root, "audit", "--check"]) == 0
    assert "audit trail intact" in capsys.readouterr().out
    (_trail_dir(trail, "fast") / "000000000001.json").unlink()
    assert main(["--store", root, "audit", "--check"]) == 1
    out = capsys.readouterr().out
    assert "break fast record 1: record(s) 1 missing: removed" in out
    assert main(["--store", root, "audit", "--check", "--json"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["ok"] is False and body["breaks"][0]["seq"] == 1


def test_audit_rejects_bad_arguments(trail: mouthguard.Store) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--store", trail.source, "audit", "--since", "yesterday"])
    assert exited.value.code == 2
    assert main(["--store", trail.source, "audit", "_audit"]) == 2


def test_the_trail_is_not_a_run(
    trail: mouthguard.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["--store", trail.source, "ls", "--json"]) == 0
    assert {json.loads(x)["run"] for x in capsys.readouterr().out.splitlines()} == {"r"}
    with pytest.raises(ValueError, match="reserved for the audit trail"):
        mouthguard.Checkpointer(trail, "_audit")


def test_records_are_bounded_and_checked() -> None:
    with pytest.raises(ValueError, match="limited"):
        AuditRecord("x", "intent", "hold", "t", "a", "r", 1, ("fast",), "y" * 5000)
    with pytest.raises(ValueError, match="phase"):
        AuditRecord("x", "maybe", "hold", "t", "a", "r", 1, ("fast",))


def test_damage_reports_are_recorded_from_any_reader(store: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    _save(ckpt, range(1, 2))
    report_damage(CopyRef(store.fast, "r", 1), "bit rot at 4200", ckpt.info(1).created)  # type: ignore[union-attr]
    (damage,) = [
        a for a in acts(merged(read_trails(store.tiers)), "r") if a.intent.record.act == "damage"
    ]
    assert damage.intent.record.reason == "bit rot at 4200" and damage.status == "done"


def test_the_trail_can_be_switched_off_for_measurement(
    store: mouthguard.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(audit.ENV_SWITCH, "off")
    _save(mouthguard.Checkpointer(store, "r", background=False), range(1, 2))
    assert not _trail_dir(store, "fast").exists()
    shutil.rmtree(Path(store.fast.location("r/")))


def test_garbage_collection_sweeps_a_killed_appender_s_temporary_file(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    _save(ckpt, range(1, 2))
    trail = _trail_dir(store, "fast")
    old, young = trail / ".tmp-0123456789abcdef", trail / ".tmp-fedcba9876543210"
    old.write_bytes(b"{half a record")  # what a writer killed inside its put leaves
    young.write_bytes(b"{in flight")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    reports = ckpt.collect_garbage(grace_seconds=60)
    assert not old.exists() and young.exists()  # a writer still in flight keeps its file
    assert sum(r.incomplete_objects for r in reports) == 1
    assert check_store(store.tiers, None)[0] == []  # the records themselves untouched

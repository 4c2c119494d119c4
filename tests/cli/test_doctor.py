"""``mouthguard doctor``: measured capabilities, placement per level, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mouthguard.cli.main import main
from mouthguard.errors import TierError
from mouthguard.tiers.local import LocalTier
from tests.jobs.conftest import make_store
from tests.s3.fixtures import S3Bucket

LEVELS = ["critical", "milestone", "routine", "transient"]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")


def doctor_json(config: Path, capsys: pytest.CaptureFixture[str], expect: int) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["--store", str(config), "doctor", "--json"]) == expect
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def local_config(root: Path, *tiers: tuple[str, str]) -> Path:
    make_store(root, *tiers)
    return root / "mouthguard.toml"


def test_two_domains_are_healthy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = local_config(tmp_path / "two", ("fast", "node-a"), ("durable", "node-b"))
    report = doctor_json(config, capsys, expect=0)
    assert report["ok"] and report["problems"] == []
    # Both directories live on tmp_path's filesystem: "distinct" domains only on paper.
    (warning,) = report["warnings"]
    assert "fast (node-a) and durable (node-b)" in warning and "share one filesystem" in warning
    fast, durable = report["tiers"]
    assert (fast["name"], fast["kind"], fast["domain"]) == ("fast", "LocalTier", "node-a")
    assert durable["location"] == str((tmp_path / "two" / "durable").resolve())
    assert fast["capabilities"] == {
        "atomic_rename": True,
        "conditional_put": True,
        "object_lock": False,
        "durable": True,
        "persistent": True,
    }
    assert fast["measured"] == {"conditional_put": True}
    assert fast["hints"].startswith("xattr") and isinstance(fast["hints_work"], bool)
    assert 0 < fast["free_bytes"] <= fast["total_bytes"]
    assert list(report["placement"]) == LEVELS
    assert all(p["satisfiable"] for p in report["placement"].values())
    assert report["placement"]["routine"]["targets"] == ["fast", "durable"]
    assert report["placement"]["transient"]["targets"] == ["fast"]
    # What doctor says about syncing is what the write path does: the durable local
    # tier fsyncs every save, transient ones included.
    synced = "a save is on stable storage before it is acknowledged (fast is durable)"
    assert all(synced in p["reasons"] for p in report["placement"].values())
    assert not any("fsync" in r for p in report["placement"].values() for r in p["reasons"])
    # The probe objects are gone again: no run appears, no directory is left.
    for tier in ("fast", "durable"):
        assert list((tmp_path / "two" / tier).iterdir()) == []
    assert main(["--store", str(config), "ls", "--json"]) == 0
    assert capsys.readouterr().out == ""


def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = local_config(tmp_path / "two", ("fast", "node-a"), ("durable", "node-b"))
    assert main(["--store", str(config), "doctor"]) == 0
    out = capsys.readouterr().out
    assert "LocalTier" in out and "node-b" in out and "conditional_put yes (measured)" in out
    assert "placement by importance" in out and "RF2 minimum" in out
    assert "ok: every importance level can be placed" in out
    assert "warning:" in out and "share one filesystem" in out


def test_one_failure_domain_is_not_ready(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = local_config(tmp_path / "one", ("fast", "rack-1"), ("durable", "rack-1"))
    report = doctor_json(config, capsys, expect=1)
    assert not report["ok"]
    satisfiable = {level: p["satisfiable"] for level, p in report["placement"].items()}
    assert satisfiable == {
        "critical": False,
        "milestone": False,
        "routine": False,
        "transient": True,
    }
    assert any(
        p.startswith("routine: unsatisfiable") and "distinct failure domains" in p
        for p in report["problems"]
    )
    assert main(["--store", str(config), "doctor"]) == 1
    out = capsys.readouterr().out
    assert "not ready:" in out and "add a durable tier in another failure domain" in out


def test_a_single_tier_cannot_hold_two_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = local_config(tmp_path / "only", ("only", "node-a"))
    report = doctor_json(config, capsys, expect=1)
    assert [t["name"] for t in report["tiers"]] == ["only"]
    assert any("the store has 1 durable tier" in p for p in report["problems"])
    assert report["placement"]["transient"]["satisfiable"]


def test_an_unwritable_tier_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = local_config(tmp_path / "two", ("fast", "node-a"), ("durable", "node-b"))
    real_put = LocalTier.put

    def put(self: LocalTier, key: str, *args: Any, **kwargs: Any) -> Any:
        if self.name == "durable" and key.startswith("mouthguard-doctor/"):
            raise TierError("read-only file system (EROFS)")
        return real_put(self, key, *args, **kwargs)

    monkeypatch.setattr(LocalTier, "put", put)
    report = doctor_json(config, capsys, expect=1)
    assert report["problems"] == ["tier durable is not writable: read-only file system (EROFS)"]
    assert report["tiers"][1]["measured"] == {}


def test_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    config = local_config(tmp_path / "two", ("fast", "node-a"), ("durable", "node-b"))
    with pytest.raises(SystemExit) as exited:
        main(["--store", str(config), "doctor", "--frobnicate"])
    assert exited.value.code == 2


# --- S3: capabilities as the tier's open-time probe measured them -------------------


def s3_config(root: Path, bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> Path:
    """fast (local, node-a) + s3 (region-a); credentials through AWS_* like a user's."""
    server = bucket.server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    lines = [
        "[[tiers]]",
        'name = "fast"',
        'kind = "local"',
        'path = "fast"',
        'domain = "node-a"',
        "",
        "[[tiers]]",
        'name = "s3"',
        'kind = "s3"',
        f'url = "{bucket.url}"',
        f'region = "{server.region}"',
        'domain = "region-a"',
    ]
    if server.endpoint is not None:
        lines.append(f'endpoint = "{server.endpoint}"')
    root.mkdir(parents=True)
    config = root / "mouthguard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def test_s3_plain_bucket_honours_conditional_put(
    tmp_path: Path,
    s3_bucket: S3Bucket,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = s3_config(tmp_path / "s3", s3_bucket, monkeypatch)
    report = doctor_json(config, capsys, expect=0)
    s3 = report["tiers"][1]
    assert (s3["name"], s3["kind"], s3["domain"]) == ("s3", "S3Tier", "region-a")
    assert s3["location"] == f"s3://{s3_bucket.name}/{s3_bucket.prefix}"
    assert s3["measured"] == {"conditional_put": True, "object_lock": False}
    assert s3["create_guard"] == "if-none-match"
    assert s3["capabilities"]["conditional_put"] is True
    assert s3["capabilities"]["atomic_rename"] is False
    assert s3["free_bytes"] is None and s3["hints"].startswith("object tags")
    assert any("refused" in note for note in s3["notes"])
    assert all(p["satisfiable"] for p in report["placement"].values())


def test_s3_lock_bucket_reports_what_the_server_ignores(
    tmp_path: Path,
    s3_lock_bucket: S3Bucket,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = s3_config(tmp_path / "s3", s3_lock_bucket, monkeypatch)
    report = doctor_json(config, capsys, expect=0)
    s3 = report["tiers"][1]
    assert s3["measured"]["object_lock"] is True
    assert s3["capabilities"]["object_lock"] is True
    assert "legal hold on s3 (object lock)" in report["placement"]["critical"]["reasons"]
    assert any(note.startswith("versioning Enabled") for note in s3["notes"])
    if s3_lock_bucket.server.is_local_ceph:
        # This Ceph RGW ignores If-None-Match on Object-Lock (versioned) buckets: the
        # measurement says so, and the tier keeps CREATE atomic through versions instead.
        assert s3["measured"]["conditional_put"] is False
        assert s3["create_guard"] == "oldest-version"
        assert s3["capabilities"]["conditional_put"] is True
        assert any("IGNORED If-None-Match" in note for note in s3["notes"])
    assert main(["--store", str(config), "doctor"]) == 0
    out = capsys.readouterr().out
    assert "S3Tier" in out and "object_lock yes (measured)" in out
    if s3_lock_bucket.server.is_local_ceph:
        assert "conditional_put yes (server: no, measured)" in out
        assert "create-only via oldest-version" in out


def test_doctor_shows_the_latest_acts_and_warns_of_a_broken_trail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch  # noqa: PLC0415

    import mouthguard  # noqa: PLC0415 - torch only for this test

    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, "r", background=False, actor="alice@lab")
    ckpt.save(1, {"w": torch.ones(2)})
    ckpt.hold(1, "legal", reason="case 42")
    capsys.readouterr()
    main(["--store", store.source, "doctor", "--json"])
    body = json.loads(capsys.readouterr().out)
    (entry,) = body["latest_acts"]
    assert (entry["run"], entry["step"]) == ("r", 1)
    assert [(a["act"], a["actor"], a["status"]) for a in entry["acts"]] == [
        ("hold", "alice@lab", "done"),
        ("commit", "alice@lab", "done"),
    ]
    main(["--store", store.source, "doctor"])
    assert "latest acts per checkpoint" in capsys.readouterr().out
    (Path(store.fast.location("_audit/")) / "000000000000.json").unlink()
    main(["--store", store.source, "doctor", "--json"])
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any("audit trail: fast record 0: record(s) 0 missing" in w for w in warnings)

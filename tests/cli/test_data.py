"""``mouthguard data``: pack, index, verify, ls and show, in-process through main()."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from mouthguard.cli.main import main
from mouthguard.data import open_dataset
from tests.cli.test_startup import loaded_by
from tests.data.adopted import parquet_files, wds_tars
from tests.data.helpers import flip_byte, shard_path, write_dataset
from tests.data.writing.test_pack import make_tree
from tests.s3.fixtures import S3Bucket


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich reads COLUMNS: wide enough that table cells are never cut."""
    monkeypatch.setenv("COLUMNS", "250")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["data", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def packed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    make_tree(tmp_path / "photos", n=20)
    code, out, _ = run(
        capsys, "pack", str(tmp_path / "photos"), str(tmp_path / "out"), "--shard-size", "20KiB"
    )
    assert code == 0, out
    assert "packed 21 samples" in out and "fingerprint sha256:" in out
    return tmp_path / "out" / "photos"  # the name defaults to SRC's directory name


def test_pack_json_describes_the_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_tree(tmp_path / "src", n=6)
    code, out, _ = run(
        capsys, "pack", str(tmp_path / "src"), str(tmp_path / "out"), "--name", "six", "--json"
    )
    assert code == 0
    info = json.loads(out)
    dataset = open_dataset(tmp_path / "out" / "six")
    assert info["fingerprint"] == dataset.fingerprint and info["samples"] == 7
    assert info["name"] == "six" and info["signed"] is False


def test_verify_a_clean_dataset(packed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "verify", str(packed))
    assert code == 0
    assert "ok shard-000000.tar" in out and "photos: valid" in out


def test_verify_names_a_damaged_shard_and_exits_1(
    packed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_byte(shard_path(packed, 1), 600)
    code, out, _ = run(capsys, "verify", str(packed))
    assert code == 1
    assert "MISMATCH shard-000001.tar" in out and "INVALID" in out
    assert "ok shard-000000.tar" in out
    code, out, _ = run(capsys, "verify", str(packed), "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 1
    assert {(x["shard"], x["status"]) for x in lines if x["status"] != "ok"} == {
        ("shard-000001.tar", "mismatch")
    }


def test_ls_lists_datasets_and_their_damage(
    packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset(tmp_path / "out", "other", n=3)
    (tmp_path / "out" / "debris" / "shards").mkdir(parents=True)  # uncommitted: invisible
    (tmp_path / "out" / "debris" / "shards" / "shard-000000.tar").write_bytes(b"x")
    code, out, _ = run(capsys, "ls", str(tmp_path / "out"), "--json")
    assert code == 0
    listed = {x["name"]: x for x in map(json.loads, out.splitlines())}
    assert set(listed) == {"photos", "other"}
    assert listed["other"]["samples"] == 3
    flip_byte(tmp_path / "out" / "other" / "dataset.json", 30)
    code, out, _ = run(capsys, "ls", str(tmp_path / "out"))
    assert code == 0 and "photos" in out and "damaged: other" in out
    code, out, _ = run(capsys, "ls", str(packed))  # a dataset itself
    assert code == 0 and "photos" in out


def test_show(packed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", str(packed), "--json")
    info = json.loads(out)
    assert code == 0 and info["samples"] == 21
    assert [s["name"] for s in info["shard_list"]][:2] == ["shard-000000.tar", "shard-000001.tar"]
    code, out, _ = run(capsys, "show", str(packed))
    assert code == 0 and "fingerprint" in out and "shard-000000.tar" in out


@pytest.mark.parametrize("command", ["verify", "show", "ls"])
def test_no_dataset_there_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, _, err = run(capsys, command, str(tmp_path / "missing"))
    assert code == 2 and "no dataset" in err
    assert not (tmp_path / "missing").exists()


def test_pack_refuses_a_taken_name_and_a_bad_file(
    packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "pack", str(tmp_path / "photos"), str(tmp_path / "out"))
    assert code == 2 and "already committed" in err
    (tmp_path / "photos" / "NOEXT").write_bytes(b"x")
    code, _, err = run(capsys, "pack", str(tmp_path / "photos"), str(tmp_path / "new"))
    assert code == 1 and "NOEXT" in err


@pytest.mark.parametrize("size", ["abc", "0", "-5", "1.5M"])
def test_bad_shard_sizes_are_argument_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["data", "pack", str(tmp_path), str(tmp_path / "o"), "--shard-size", size])
    assert exited.value.code == 2
    assert "must be a size in bytes" in capsys.readouterr().err


def test_pack_and_verify_an_s3_dataset(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = s3_bucket.server
    assert server.endpoint is not None
    for name, value in (
        ("AWS_ENDPOINT_URL", server.endpoint),
        ("AWS_ACCESS_KEY_ID", server.access_key),
        ("AWS_SECRET_ACCESS_KEY", server.secret_key),
        ("AWS_REGION", server.region),
    ):
        monkeypatch.setenv(name, value)
    make_tree(tmp_path / "src", n=10)
    dest = s3_bucket.url.rstrip("/") + "/datasets"
    code, out, err = run(capsys, "pack", str(tmp_path / "src"), dest, "--name", "ten")
    assert code == 0, err
    code, out, _ = run(capsys, "verify", f"{dest}/ten")
    assert code == 0 and "ten: valid" in out
    code, out, _ = run(capsys, "ls", dest, "--json")
    assert [json.loads(x)["name"] for x in out.splitlines()] == ["ten"]
    assert server.secret_key not in out


@pytest.mark.slow
@pytest.mark.parametrize("args", [["data", "--help"], ["data", "ls"], ["data", "verify"]])
def test_data_commands_import_no_torch(tmp_path: Path, args: list[str]) -> None:
    write_dataset(tmp_path, n=3)
    extra = [] if args[-1] == "--help" else [str(tmp_path / "ds")]
    assert loaded_by(*args, *extra) == []


# --- index: adopting a dataset the user already has --------------------------------


def test_index_webdataset_tars_then_verify_show_and_ls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wds_tars(tmp_path / "mine", shards=2, per=4)
    code, out, _ = run(capsys, "index", str(tmp_path / "mine"))
    assert code == 0
    assert "indexed 8 samples in 2 webdataset files" in out and "fingerprint sha256:" in out
    code, out, _ = run(capsys, "verify", str(tmp_path / "mine"))
    assert code == 0 and "ok train/part-001.tar" in out and "mine: valid" in out
    code, out, _ = run(capsys, "ls", str(tmp_path), "--json")
    [listed] = [json.loads(line) for line in out.splitlines()]
    assert listed["name"] == "mine" and listed["layout"] == "indexed" and listed["shards"] == 2
    code, out, err = run(capsys, "index", str(tmp_path / "mine"))
    assert code == 2  # already indexed: nothing to adopt
    assert "indexing" not in err  # refused before any byte was read: no bar drawn
    assert f"mouthguard data index --again {tmp_path / 'mine'}" in err  # says how


def test_index_again_after_a_file_changed_as_verify_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = wds_tars(tmp_path / "mine", shards=2, per=4)
    assert run(capsys, "index", str(tmp_path / "mine"))[0] == 0
    paths[1].write_bytes(paths[0].read_bytes())
    code, out, _ = run(capsys, "verify", str(tmp_path / "mine"))
    assert code == 1 and "MISMATCH train/part-001.tar" in out
    hint = f"mouthguard data index --again {tmp_path / 'mine'}"
    assert f"changed on purpose, index them again: {hint}" in out
    code, out, _ = run(capsys, "index", str(tmp_path / "mine"), "--again")
    assert code == 0 and "indexed 8 samples in 2 webdataset files" in out
    assert run(capsys, "verify", str(tmp_path / "mine"))[0] == 0


def test_index_parquet_json_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, rows = parquet_files(tmp_path / "text", files=2)
    code, out, _ = run(capsys, "index", str(tmp_path / "text"), "--name", "corpus", "--json")
    assert code == 0
    info = json.loads(out)
    assert info["kind"] == "parquet" and info["name"] == "corpus" and info["samples"] == rows
    assert info["files"] == 2 and info["row_groups"] == 9 and "text" in info["columns"]
    code, out, _ = run(capsys, "show", str(tmp_path / "text"), "--json")
    files = json.loads(out)["file_list"]
    assert [f["name"] for f in files] == [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
    ]
    code, out, _ = run(capsys, "show", str(tmp_path / "text"))
    assert code == 0 and "row groups" in out and "train-00001-of-00002.parquet" in out


def test_verify_reports_an_unlisted_file_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths, _ = parquet_files(tmp_path / "text", files=1)
    assert run(capsys, "index", str(tmp_path / "text"))[0] == 0
    (tmp_path / "text" / "data" / "late.parquet").write_bytes(paths[0].read_bytes())
    code, out, _ = run(capsys, "verify", str(tmp_path / "text"))
    assert code == 1 and "UNLISTED data/late.parquet" in out and "1 unlisted" in out
    assert f"to include it: mouthguard data index --again {tmp_path / 'text'}" in out
    code, out, _ = run(capsys, "verify", str(tmp_path / "text"), "--json")
    statuses = {x["shard"]: x["status"] for x in map(json.loads, out.splitlines())}
    assert code == 1 and statuses["data/late.parquet"] == "unlisted"


def test_index_exit_codes_for_what_cannot_be_indexed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "index", str(tmp_path / "missing"))
    assert code == 2 and "not a directory" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "index", str(tmp_path / "empty"))
    assert code == 2 and "no .tar files" in err
    (tmp_path / "hostile").mkdir()
    with tarfile.open(tmp_path / "hostile" / "evil.tar", "w") as tar:
        tar.addfile(tarfile.TarInfo("../../etc/cron.d/x.sh"), io.BytesIO(b""))
    code, _, err = run(capsys, "index", str(tmp_path / "hostile"))
    assert code == 1 and "error: " in err and "evil.tar" in err and "path traversal" in err
    wds_tars(tmp_path / "both", shards=1, per=1)
    parquet_files(tmp_path / "both", files=1)
    code, _, err = run(capsys, "index", str(tmp_path / "both"))
    assert code == 2 and "--kind" in err
    assert run(capsys, "index", str(tmp_path / "both"), "--kind", "webdataset")[0] == 0
    parquet_files(tmp_path / "text", files=1)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    code, _, err = run(capsys, "index", str(tmp_path / "text"))
    assert code == 2 and "pip install 'mouthguard[parquet]'" in err
    with pytest.raises(SystemExit) as exited:
        main(["data", "index", str(tmp_path / "text"), "--kind", "csv"])
    assert exited.value.code == 2


def test_pack_names_a_refused_file_before_any_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_tree(tmp_path / "src", n=3)
    (tmp_path / "src" / "IMG_1.JPG").write_bytes(b"x")
    code, out, err = run(capsys, "pack", str(tmp_path / "src"), str(tmp_path / "out"))
    assert code != 0
    assert "IMG_1" in err and "--lowercase-extensions" in err
    assert "packing" not in err  # the survey refused it: no bar was drawn
    code, out, _ = run(
        capsys, "pack", str(tmp_path / "src"), str(tmp_path / "out"), "--lowercase-extensions"
    )
    assert code == 0 and "packed 5 samples" in out


def test_pack_errors_found_before_the_first_sample_are_printed_without_a_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "pack", str(tmp_path / "missing"), str(tmp_path / "out"))
    assert code != 0 and "not a directory" in err and "packing" not in err
    make_tree(tmp_path / "src", n=2)
    assert run(capsys, "pack", str(tmp_path / "src"), str(tmp_path / "out"))[0] == 0
    code, _, err = run(capsys, "pack", str(tmp_path / "src"), str(tmp_path / "out"))
    assert code == 2 and "already committed" in err and "packing" not in err
    code, _, err = run(capsys, "verify", str(tmp_path / "nothing"))
    assert code == 2 and err.startswith("error: ")


def test_verify_on_a_folder_of_datasets_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_tree(tmp_path / "src", n=2)
    for name in ("one", "two"):
        code, _, _ = run(
            capsys, "pack", str(tmp_path / "src"), str(tmp_path / "all"), "--name", name
        )
        assert code == 0
    wds_tars(tmp_path / "all" / "three", shards=1, per=2)
    assert run(capsys, "index", str(tmp_path / "all" / "three"))[0] == 0  # adopted: named too
    code, _, err = run(capsys, "verify", str(tmp_path / "all"))
    assert code == 2
    assert "holds 3 dataset(s): one, three, two" in err
    assert f"mouthguard data verify {tmp_path / 'all'}/one" in err
    code, _, err = run(capsys, "show", str(tmp_path / "all"))
    assert code == 2 and f"mouthguard data show {tmp_path / 'all'}/one" in err

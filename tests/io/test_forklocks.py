"""Lock files that a forked child lets go of: the parent's release frees the lock, child alive."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mouthguard.io import forklocks

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads


@contextlib.contextmanager
def forked_child(work: Callable[[], object] = lambda: None) -> Iterator[Callable[[], object]]:
    """Fork a child that runs ``work`` as it starts, reports its result, then waits.

    Yields a function that returns the child's result (JSON). The child lives,
    holding whatever it inherited, until the block ends.
    """
    results, report = os.pipe()
    go_on, child_done = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(child_done)
            os.close(results)
            try:
                value = work()
            except Exception as exc:
                value = f"{type(exc).__name__}: {exc}"
            os.write(report, json.dumps(value).encode() + b"\n")
            os.read(go_on, 1)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(report)
    os.close(go_on)

    def result() -> object:
        ready, _, _ = select.select([results], [], [], 30)
        assert ready, "the child did not report within 30 s"
        return json.loads(os.read(results, 4096))

    try:
        yield result
    finally:
        os.close(child_done)  # the child reads end-of-file and exits
        os.close(results)
        os.waitpid(pid, 0)


def free(path: Path) -> bool:
    """Whether nobody holds ``path``'s lock (a fresh open file asks, without waiting)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.mark.parametrize("how", ["flocked", "try_lock"])
def test_a_lock_held_across_a_fork_is_free_once_the_parent_releases_it(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "a.lock"
    with contextlib.ExitStack() as held:
        if how == "flocked":
            held.enter_context(forklocks.flocked(path))
        else:
            fd = forklocks.try_lock(path)
            assert fd is not None
            held.callback(forklocks.close_lock_file, fd)
        child = forked_child()
        report = child.__enter__()
        try:
            assert report() is None  # the child runs: its fork handler has run
            assert not free(path)  # the parent still holds it
            held.close()
            # without forklocks, the living child's copy would still hold it
            assert free(path)
        finally:
            child.__exit__(None, None, None)


def test_a_descriptor_opened_before_a_fork_and_locked_after_it_is_not_shared(
    tmp_path: Path,
) -> None:
    # The noting is tied to the open: the lock belongs to the open file, which a child
    # forked in between would share even though it was taken after the fork.
    path = tmp_path / "b.lock"
    fd = forklocks.open_lock_file(path)
    with forked_child() as child:
        child()
        fcntl.flock(fd, fcntl.LOCK_EX)
        forklocks.close_lock_file(fd)
        assert free(path)


def test_the_child_can_take_the_lock_itself_once_the_parent_released_it(tmp_path: Path) -> None:
    path = tmp_path / "c.lock"
    fd = forklocks.try_lock(path)
    assert fd is not None
    released = tmp_path / "released"

    def take_after_release() -> object:
        deadline = time.monotonic() + 30
        while not released.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        got = forklocks.try_lock(path)  # its own inherited copy must not stand in the way
        return got is not None

    with forked_child(take_after_release) as child:
        forklocks.close_lock_file(fd)
        released.touch()
        assert child() is True


def test_in_the_child_an_inherited_descriptor_keeps_its_number_and_points_at_dev_null(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.lock"
    fd = forklocks.try_lock(path)
    assert fd is not None
    other = tmp_path / "other"
    other.write_bytes(b"still open")

    def look() -> object:
        null = Path(os.devnull).stat()
        st = os.fstat(fd)
        # a file the child opens now gets a new number; a stale close of the old one
        # (an object inherited from the parent) must not close it
        mine = os.open(other, os.O_RDONLY)
        forklocks.close_lock_file(fd)
        return {
            "dev_null": (st.st_rdev, st.st_ino) == (null.st_rdev, null.st_ino),
            "new_number": mine != fd,
            "still_reads": os.pread(mine, 64, 0).decode(),
        }

    try:
        with forked_child(look) as child:
            assert child() == {"dev_null": True, "new_number": True, "still_reads": "still open"}
    finally:
        forklocks.close_lock_file(fd)


def test_a_fork_does_not_wait_for_a_lock_another_thread_waits_for(tmp_path: Path) -> None:
    path = tmp_path / "e.lock"
    holder = forklocks.try_lock(path)
    assert holder is not None
    # another open file of this process asks for it: it waits as another process would
    entered = threading.Event()

    def wait_for_lock() -> None:
        with forklocks.flocked(path):
            entered.set()

    waiter = threading.Thread(target=wait_for_lock)
    waiter.start()
    try:
        time.sleep(0.2)  # the waiter is (very likely) in flock now; the fork must not care
        with forked_child() as child:  # a fork that waited for the lock would hang here
            child()
        assert not entered.is_set()  # the fork was done while the waiter still waited
    finally:
        forklocks.close_lock_file(holder)
        waiter.join(timeout=10)
    assert entered.is_set()


def test_try_lock_says_none_for_a_lock_or_pin_held_and_for_a_missing_file_without_create(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f.lock"
    fd = forklocks.try_lock(path)
    assert fd is not None
    try:
        assert forklocks.try_lock(path) is None
    finally:
        forklocks.close_lock_file(fd)
    pin = os.open(path, os.O_RDONLY)  # a reader's pin on a cache blob: a shared lock
    try:
        fcntl.flock(pin, fcntl.LOCK_SH)
        assert forklocks.try_lock(path, os.O_RDONLY | os.O_NOFOLLOW) is None
        fcntl.flock(pin, fcntl.LOCK_UN)
        fd = forklocks.try_lock(path, os.O_RDONLY | os.O_NOFOLLOW)
        assert fd is not None
        forklocks.close_lock_file(fd)
    finally:
        os.close(pin)
    assert forklocks.try_lock(tmp_path / "missing", os.O_RDONLY) is None
    assert not (tmp_path / "missing").exists()

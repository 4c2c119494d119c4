"""The tier conformance suite: the contract of :mod:`mouthguard.tiers.base`, as pytest tests.

Usage, for a tier of your own (a fuller example is in ``docs/testing.md``)::

    import pytest
    from mouthguard.testing.conformance import TierConformance

    class TestMyTier(TierConformance):
        @pytest.fixture
        def make_tier(self, tmp_path):
            return lambda: MyTier(tmp_path)  # a new instance over the same storage

Then ``pytest``: every contract the tier breaks is a failing test named after it.
mouthguard runs this same suite against each of its own tiers (memory, local,
S3 on plain and Object-Lock buckets, and the encrypting, pacing and
fault-injecting wrappers).

The contract of an object's bytes (round trips, ranges, ``read_into``) is in
:mod:`mouthguard.testing.conformance_bytes`, which ``TierConformance`` inherits.
Helpers for a tier's own extra tests are public too: :func:`payload`,
:data:`INVALID_KEYS`, :data:`INVALID_PREFIXES`, :data:`MiB`.
"""

from __future__ import annotations

import inspect
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

try:
    import pytest
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without pytest
    raise ImportError(
        "mouthguard.testing.conformance is a pytest suite and needs pytest: "
        "pip install 'mouthguard[testing]' (or pip install pytest)"
    ) from exc

from mouthguard.errors import (
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
    TierError,
    UnsupportedOperationError,
)
from mouthguard.testing.conformance_bytes import BytesContract, MiB, payload
from mouthguard.testing.hostile_names import HOSTILE_NAMES
from mouthguard.tiers.base import OPERATIONS, PutMode, Tier

__all__ = ["INVALID_KEYS", "INVALID_PREFIXES", "MiB", "TierConformance", "payload"]

#: Keys every tier must refuse with InvalidKeyError, before any I/O: the hostile
#: names every validator in mouthguard refuses, then names only keys refuse.
INVALID_KEYS = [
    *HOSTILE_NAMES.values(),
    "a/./b",
    ".hidden",  # dot-names are a tier's own temporary files
    "a/.hidden",
    "a b",
    "a" * 300,  # one segment longer than NAME_MAX
    "/".join(["a" * 200] * 6),  # whole key longer than MAX_KEY_LENGTH
]

#: Prefixes ``list``, ``list_info``, ``list_dirs`` and ``location`` must refuse.
INVALID_PREFIXES = ["../", "/abs", "a//", "a/./", ".hidden/", "a\x00/", "/"]


class TierConformance(BytesContract):
    """The contract of every tier, as tests. Subclass it and provide ``make_tier``.

    ``make_tier`` is a fixture returning a zero-argument factory: each call gives
    a *new instance over the same backing storage* (for a RAM tier, simply a new
    tier), starting empty for each test. The suite's ``tier`` fixture is
    ``make_tier()``; a subclass may override it, and add tests of its own.

    What a tier declares in its ``capabilities`` decides what is checked: racing
    creators only where ``conditional_put``, moves only where ``atomic_rename``
    (elsewhere ``rename_prefix`` must refuse), legal holds only where
    ``object_lock``, persistence only where ``persistent``.
    """

    @pytest.fixture
    def make_tier(self) -> Callable[[], Tier]:
        """Override me: a factory of new instances over one (initially empty) storage."""
        raise NotImplementedError(
            f"{type(self).__name__} must define a make_tier fixture returning a "
            "zero-argument factory of the tier under test"
        )

    @pytest.fixture
    def tier(self, make_tier: Callable[[], Tier]) -> Tier:
        """The tier under test: ``make_tier()``."""
        return make_tier()

    # --- modes, head, exists ---------------------------------------------------

    def test_create_refuses_existing_and_keeps_old(self, tier: Tier) -> None:
        """``PutMode.CREATE`` refuses an existing key and leaves its bytes alone."""
        assert tier.put("c/k", b"first", mode=PutMode.CREATE).size == 5
        with pytest.raises(ObjectExistsError):
            tier.put("c/k", b"second", mode=PutMode.CREATE)
        assert tier.get("c/k") == b"first"
        assert list(tier.list("c/")) == ["c/k"]

    def test_overwrite_replaces(self, tier: Tier) -> None:
        """``PutMode.OVERWRITE`` replaces the bytes and the size."""
        tier.put("o", b"a much longer first version")
        tier.put("o", b"short", mode=PutMode.OVERWRITE)
        assert tier.get("o") == b"short"
        assert tier.head("o").size == 5

    def test_concurrent_create_has_one_winner(self, tier: Tier) -> None:
        """Where ``conditional_put`` is declared, of racing creators exactly one wins."""
        if not tier.capabilities.conditional_put:
            pytest.skip("CREATE is not atomic on this tier")
        barrier = threading.Barrier(8)

        def attempt(i: int) -> bool:
            barrier.wait()
            try:
                tier.put("race", f"writer-{i}".encode(), mode=PutMode.CREATE)
            except ObjectExistsError:
                return False
            return True

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(attempt, range(8)))
        assert results.count(True) == 1
        assert tier.get("race") == f"writer-{results.index(True)}".encode()

    def test_head_and_exists(self, tier: Tier) -> None:
        """``head`` and ``exists`` see objects, not the "directories" above them."""
        tier.put("h/x", b"12345")
        info = tier.head("h/x")
        assert (info.key, info.size) == ("h/x", 5)
        assert tier.exists("h/x")
        assert not tier.exists("h")  # a "directory" is not an object
        with pytest.raises(ObjectNotFoundError):
            tier.head("h")

    # --- list / list_dirs ------------------------------------------------------

    def test_list_sorted_with_prefix_semantics(self, tier: Tier) -> None:
        """``list`` is sorted; a prefix is a plain string prefix of the key."""
        keys = ["b", "a0", "a/y/z", "ab/x", "a-b", "a/x", "a/yy", "c/d/e/f"]
        for key in random.Random(3).sample(keys, len(keys)):  # noqa: S311 - a shuffle
            tier.put(key, key.encode())
        assert list(tier.list()) == sorted(keys)
        assert list(tier.list("a/")) == ["a/x", "a/y/z", "a/yy"]
        assert list(tier.list("a")) == sorted(k for k in keys if k.startswith("a"))
        assert list(tier.list("a/y")) == ["a/y/z", "a/yy"]
        assert list(tier.list("a/y/")) == ["a/y/z"]
        assert list(tier.list("c/d/")) == ["c/d/e/f"]
        assert list(tier.list("zzz/")) == []
        assert list(tier.list("a0")) == ["a0"]

    def test_list_info_matches_list_and_head(self, tier: Tier) -> None:
        """``list_info`` yields what ``list`` yields, in order, with ``head``'s size and etag."""
        objects = {"i/a": b"", "i/b/c": b"12345", "i/bb": b"x" * 4096, "j/k": b"jk"}
        for key in random.Random(5).sample(sorted(objects), len(objects)):  # noqa: S311
            tier.put(key, objects[key])
        for prefix in ["", "i/", "i/b", "i/b/", "j/", "zzz/"]:
            infos = list(tier.list_info(prefix))
            assert [i.key for i in infos] == list(tier.list(prefix)), prefix
            for info in infos:
                assert info.size == len(objects[info.key]), info.key
                assert info.etag == tier.head(info.key).etag, info.key

    def test_list_info_stamp_changes_when_rewritten(self, tier: Tier) -> None:
        """A tier that stamps versions gives a same-size rewrite a new stamp, everywhere."""
        first = tier.put("v/obj", b"first version")
        (before,) = tier.list_info("v/")
        tier.put("v/obj", b"other version")  # same size, other bytes
        (after,) = tier.list_info("v/")
        assert before.size == after.size == len(b"first version")
        if before.etag is None:  # the tier cannot tell versions apart: nothing to keep
            assert after.etag is None
            return
        assert after.etag is not None
        assert after.etag != before.etag
        assert tier.head("v/obj").etag == after.etag
        if first.etag is not None:  # put may report the stamp; then it is the stored one
            assert first.etag == before.etag

    def test_list_dirs(self, tier: Tier) -> None:
        """``list_dirs`` names the sub-directories holding objects; its prefix ends with ``/``."""
        for key in ["r/s1/x", "r/s2/deep/y", "r/file", "top"]:
            tier.put(key, b"v")
        assert tier.list_dirs() == ["r"]
        assert tier.list_dirs("r/") == ["s1", "s2"]
        assert tier.list_dirs("r/s2/") == ["deep"]
        assert tier.list_dirs("r/s1/") == []
        assert tier.list_dirs("missing/") == []
        with pytest.raises(InvalidKeyError):
            tier.list_dirs("r")  # must be empty or end with "/"

    # --- delete ----------------------------------------------------------------

    def test_delete(self, tier: Tier) -> None:
        """``delete`` says whether the key existed; ``delete_prefix`` counts what it deleted."""
        tier.put("d/a/1", b"x")
        tier.put("d/a/2", b"y")
        assert tier.delete("d/a/1") is True
        assert tier.delete("d/a/1") is False
        assert not tier.exists("d/a/1")
        with pytest.raises(ObjectNotFoundError):
            tier.get("d/a/1")
        assert tier.delete("d/a") is False  # not an object
        assert list(tier.list()) == ["d/a/2"]
        assert tier.delete_prefix("d/") == 1
        assert list(tier.list()) == []
        assert tier.list_dirs() == []

    # --- rename_prefix ---------------------------------------------------------

    def test_rename_prefix_moves_everything(self, tier: Tier) -> None:
        """``rename_prefix`` moves exactly one prefix, or is refused where not atomic."""
        tier.put("tmp/step1/a", b"A")
        tier.put("tmp/step1/b/c", b"C")
        tier.put("tmp/step10/z", b"Z")  # shares a string prefix but is not under tmp/step1/
        if not tier.capabilities.atomic_rename:
            with pytest.raises(UnsupportedOperationError):
                tier.rename_prefix("tmp/step1", "done/step1")
            return
        tier.rename_prefix("tmp/step1", "done/step1")
        assert list(tier.list("done/")) == ["done/step1/a", "done/step1/b/c"]
        assert list(tier.list("tmp/")) == ["tmp/step10/z"]
        assert tier.get("done/step1/b/c") == b"C"

    def test_rename_prefix_refusals(self, tier: Tier) -> None:
        """Where ``atomic_rename``: busy, missing, overlapping, invalid prefixes change nothing."""
        if not tier.capabilities.atomic_rename:
            pytest.skip("covered by test_rename_prefix_moves_everything")
        tier.put("s/a", b"1")
        tier.put("t/x", b"2")
        with pytest.raises(ObjectExistsError):
            tier.rename_prefix("s", "t")
        assert list(tier.list()) == ["s/a", "t/x"]
        with pytest.raises(ObjectNotFoundError):
            tier.rename_prefix("nothing", "elsewhere")
        for src, dst in [("s", "s/inner"), ("s", "s"), ("s/a", "s")]:
            with pytest.raises(TierError):
                tier.rename_prefix(src, dst)
        with pytest.raises(InvalidKeyError):
            tier.rename_prefix("s", "../escape")
        assert list(tier.list()) == ["s/a", "t/x"]

    # --- invalid keys ----------------------------------------------------------

    @pytest.mark.parametrize("key", INVALID_KEYS)
    def test_invalid_keys_rejected_without_side_effects(self, tier: Tier, key: str) -> None:
        """Every operation refuses an unsafe key with InvalidKeyError before any I/O."""
        tier.put("canary", b"c")
        with pytest.raises(InvalidKeyError):
            tier.put(key, b"data")
        with pytest.raises(InvalidKeyError):
            tier.put(key, b"data", mode=PutMode.CREATE)
        with pytest.raises(InvalidKeyError):
            tier.get(key)
        with pytest.raises(InvalidKeyError):
            tier.read_into(key, 0, memoryview(bytearray(1)))
        with pytest.raises(InvalidKeyError):
            tier.head(key)
        with pytest.raises(InvalidKeyError):
            tier.exists(key)
        with pytest.raises(InvalidKeyError):
            tier.delete(key)
        assert list(tier.list()) == ["canary"]

    @pytest.mark.parametrize("prefix", INVALID_PREFIXES)
    def test_invalid_prefixes_rejected(self, tier: Tier, prefix: str) -> None:
        """``list``, ``list_info``, ``list_dirs`` and ``location`` refuse unsafe prefixes."""
        with pytest.raises(InvalidKeyError):
            list(tier.list(prefix))
        with pytest.raises(InvalidKeyError):
            list(tier.list_info(prefix))
        with pytest.raises(InvalidKeyError):
            tier.list_dirs(prefix)
        with pytest.raises(InvalidKeyError):
            tier.location(prefix)

    def test_collect_incomplete_never_touches_objects(self, tier: Tier) -> None:
        """Collecting debris never removes a complete object."""
        tier.put("g/a", b"a")
        tier.put("g/b/c", b"c")
        assert tier.collect_incomplete("", 0.0) == 0
        assert tier.collect_incomplete("g/", 0.0) == 0
        assert list(tier.list()) == ["g/a", "g/b/c"]

    # --- concurrency, instances, location --------------------------------------

    def test_concurrent_distinct_puts_all_land(self, tier: Tier) -> None:
        """Concurrent puts of distinct keys all land, intact."""
        keys = [f"conc/d{i % 4}/k{i:03d}" for i in range(64)]

        def write(key: str) -> None:
            tier.put(key, key.encode() * 100)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(write, keys))
        assert list(tier.list("conc/")) == sorted(keys)
        assert all(tier.get(k) == k.encode() * 100 for k in keys)

    def test_new_instance_sees_objects_iff_persistent(
        self, tier: Tier, make_tier: Callable[[], Tier]
    ) -> None:
        """A new instance over the same storage sees the objects exactly when ``persistent``."""
        tier.put("p/q", b"persist me")
        again = make_tier()
        if tier.capabilities.persistent:
            assert again.get("p/q") == b"persist me"
            assert list(again.list()) == ["p/q"]
        else:
            assert list(again.list()) == []

    def test_location_and_capabilities(self, tier: Tier) -> None:
        """Locations are strings that tell prefixes apart; durable implies persistent."""
        assert isinstance(tier.location(), str)
        assert isinstance(tier.location("a/b/"), str)
        assert tier.location("a/b") != tier.location("a/c")
        caps = tier.capabilities
        assert not (caps.durable and not caps.persistent)  # durable implies persistent
        assert tier.name in repr(tier)

    # --- advisory annotations (the importance hint passed down) -------------

    def test_annotations_are_advisory_and_per_object(self, tier: Tier) -> None:
        """Annotations are stored per object where supported, else dropped; bytes never change."""
        tier.put("hint/a", b"x")
        tier.put("hint/b", b"y")
        stored = tier.annotate("hint/a", {"importance": "critical"})
        if stored:
            assert tier.annotations("hint/a") == {"importance": "critical"}
            assert tier.annotate("hint/a", {"importance": "routine"})
            assert tier.annotations("hint/a") == {"importance": "routine"}
        else:
            assert tier.annotations("hint/a") == {}
        assert tier.annotations("hint/b") == {}
        assert tier.get("hint/a") == b"x"  # annotating never changes the bytes

    # --- legal holds (only where object_lock is declared) --------------------

    def test_legal_hold_follows_the_capability(self, tier: Tier) -> None:
        """``set_legal_hold`` works exactly where ``object_lock`` is declared; bytes stay."""
        tier.put("held/obj", b"keep me")
        placed = tier.set_legal_hold("held/obj", True)
        assert placed == tier.capabilities.object_lock
        if placed:
            assert tier.set_legal_hold("held/obj", False)  # released: cleanup can delete it
        assert tier.get("held/obj") == b"keep me"

    # --- the suite itself -----------------------------------------------------

    def test_the_suite_exercises_every_operation(self) -> None:
        """Some test here calls every operation of ``Tier``.

        The operations are derived from the ``Tier`` class (``OPERATIONS``), so a
        method added to the interface fails this until a contract test calls it.
        """
        source = "".join(
            inspect.getsource(cls)
            for cls in TierConformance.__mro__
            if cls.__module__.startswith("mouthguard.testing.")
        )
        missing = [op for op in OPERATIONS if f".{op}(" not in source]
        assert not missing, f"no conformance test calls {missing}: write their contract tests"

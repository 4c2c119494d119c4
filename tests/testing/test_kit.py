"""The testing kit, as a user meets it: a tier written from scratch passes, broken ones fail.

``DictTier`` below is the example of ``docs/testing.md`` (the doc's own files
are run as written by ``test_the_documented_example_passes_as_written``).
"""

from __future__ import annotations

import builtins
import inspect
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import mouthguard.testing
from mouthguard.errors import ObjectExistsError, ObjectNotFoundError
from mouthguard.testing.conformance import TierConformance
from mouthguard.tiers import (
    ObjectInfo,
    PutData,
    PutMode,
    Tier,
    TierCapabilities,
    check_range,
    faults,
    iter_buffers,
    validate_dir_prefix,
    validate_key,
    validate_prefix,
)

pytest_plugins = ["pytester"]

DOC = Path(__file__).parents[2] / "docs" / "testing.md"


class DictTier(Tier):
    """Objects in a dict: gone with the instance, and CREATE is not atomic."""

    def __init__(self, name: str = "dict") -> None:
        super().__init__(name, domain="ram")
        self.objects: dict[str, bytes] = {}

    @property
    def capabilities(self) -> TierCapabilities:
        return TierCapabilities(
            atomic_rename=False,
            conditional_put=False,
            object_lock=False,
            durable=False,
            persistent=False,
        )

    def location(self, prefix: str = "") -> str:
        return f"dict://{self.name}/{validate_prefix(prefix)}"

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        validate_key(key)
        blob = b"".join(bytes(chunk) for chunk in iter_buffers(data))  # all, or nothing
        if mode is PutMode.CREATE and key in self.objects:
            raise ObjectExistsError(f"{key!r} exists")
        self.objects[key] = blob
        return ObjectInfo(key, len(blob))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        blob = self._blob(key)
        return blob[start : check_range(key, len(blob), start, end)]

    def head(self, key: str) -> ObjectInfo:
        return ObjectInfo(key, len(self._blob(key)))

    def list(self, prefix: str = "") -> Iterator[str]:
        validate_prefix(prefix)
        return iter(sorted(k for k in self.objects if k.startswith(prefix)))

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        validate_dir_prefix(prefix)
        rests = (k[len(prefix) :] for k in self.objects if k.startswith(prefix))
        return sorted({rest.split("/", 1)[0] for rest in rests if "/" in rest})

    def delete(self, key: str) -> bool:
        validate_key(key)
        return self.objects.pop(key, None) is not None

    def _blob(self, key: str) -> bytes:
        try:
            return self.objects[validate_key(key)]
        except KeyError:
            raise ObjectNotFoundError(f"{key!r} not found") from None


class TestDictTier(TierConformance):
    @pytest.fixture
    def make_tier(self) -> Callable[[], Tier]:
        return DictTier


# --- the kit can fail: one deliberate bug per tier, and the test that must catch it ---


class RangeIgnoringTier(DictTier):
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._blob(key)  # the whole object, whatever was asked


class ShortReadTier(DictTier):
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._blob(key)[start:end]  # Python's slicing: past the end is silently short


class OverwritingCreateTier(DictTier):
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        return super().put(key, data)  # the mode is dropped


class HalfWrittenTier(DictTier):
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        validate_key(key)
        self.objects[key] = b""
        for chunk in iter_buffers(data):  # visible while it grows, and left half-written
            self.objects[key] += bytes(chunk)
        return ObjectInfo(key, len(self.objects[key]))


class AliasingTier(DictTier):
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        if isinstance(data, bytearray):  # keeps the caller's buffer instead of a copy
            self.objects[validate_key(key)] = data  # type: ignore[assignment]
            return ObjectInfo(key, len(data))
        return super().put(key, data, mode=mode)


class KeyTrustingTier(DictTier):
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            blob = self.objects[key]  # no validation: "../x" is just another missing key
        except KeyError:
            raise ObjectNotFoundError(f"{key!r} not found") from None
        return blob[start : check_range(key, len(blob), start, end)]


class UnsortedListTier(DictTier):
    def list(self, prefix: str = "") -> Iterator[str]:
        validate_prefix(prefix)
        return iter([k for k in self.objects if k.startswith(prefix)])  # insertion order


class StaleSizeListingTier(DictTier):
    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # sizes remembered from an older listing, not the objects' own
        return (ObjectInfo(key, 0) for key in self.list(prefix))


class PersistentClaimTier(DictTier):
    @property
    def capabilities(self) -> TierCapabilities:
        return TierCapabilities(
            atomic_rename=False,
            conditional_put=False,
            object_lock=False,
            durable=True,  # claimed, not true: a new instance sees nothing
            persistent=True,
        )


BROKEN: list[tuple[type[DictTier], str, dict[str, object]]] = [
    (RangeIgnoringTier, "test_get_ranges", {}),
    (ShortReadTier, "test_get_bad_ranges_raise", {"start": 0, "end": 1001}),
    (ShortReadTier, "test_every_range_of_a_small_object", {}),
    (OverwritingCreateTier, "test_create_refuses_existing_and_keeps_old", {}),
    (HalfWrittenTier, "test_failing_iterable_is_all_or_nothing", {}),
    (AliasingTier, "test_put_copies_its_input", {}),
    (KeyTrustingTier, "test_invalid_keys_rejected_without_side_effects", {"key": "../x"}),
    (UnsortedListTier, "test_list_sorted_with_prefix_semantics", {}),
    (StaleSizeListingTier, "test_list_info_matches_list_and_head", {}),
    (PersistentClaimTier, "test_new_instance_sees_objects_iff_persistent", {}),
]


@pytest.mark.parametrize(
    ("broken", "test", "params"), BROKEN, ids=[f"{b.__name__}-{t}" for b, t, _ in BROKEN]
)
def test_a_broken_tier_fails_the_test_of_its_contract(
    broken: type[DictTier], test: str, params: dict[str, object]
) -> None:
    run = getattr(TierConformance(), test)
    wanted = inspect.signature(run).parameters

    def call(tier: type[DictTier]) -> None:
        fixtures = {"tier": tier(), "make_tier": tier, **params}  # what pytest would pass
        run(**{name: value for name, value in fixtures.items() if name in wanted})

    call(DictTier)  # the sound tier passes it...
    # ...the broken one does not: a failed assert, pytest.raises' "DID NOT RAISE", or an
    # unexpected error are all failures in a pytest run; a skip would not be.
    with pytest.raises(BaseException) as excinfo:
        call(broken)
    assert not isinstance(excinfo.value, pytest.skip.Exception)


def _doc_files() -> dict[str, str]:
    """The Python blocks of docs/testing.md that name a file on their first line."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    named = (re.match(r"# (\w+\.py)\n", block) for block in blocks)
    return {m.group(1): block for m, block in zip(named, blocks, strict=True) if m}


def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    outcomes = result.parseoutcomes()
    return {kind: outcomes.get(kind, 0) for kind in ("passed", "skipped", "failed", "errors")}


def test_the_documented_example_passes_as_written(pytester: pytest.Pytester) -> None:
    files = _doc_files()
    assert set(files) == {"dict_tier.py", "test_dict_tier.py"}
    pytester.makepyfile(**{name.removesuffix(".py"): text for name, text in files.items()})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    outcomes = _outcomes(result)
    assert outcomes["failed"] == outcomes["errors"] == 0, result.stdout.str()
    # The doc shows the summary line a user gets: keep it true.
    summary = f"{outcomes['passed']} passed, {outcomes['skipped']} skipped"
    assert summary in DOC.read_text(), f"docs/testing.md should say {summary!r}"


def test_a_broken_tier_fails_a_real_run(pytester: pytest.Pytester) -> None:
    files = _doc_files()
    broken = textwrap.dedent(
        """
        from dict_tier import DictTier

        class RangeIgnoringTier(DictTier):
            def get(self, key, start=0, end=None):
                return self._blob(key)
        """
    )
    test = files["test_dict_tier.py"].replace("DictTier", "RangeIgnoringTier")
    test = test.replace("from dict_tier import", "from broken_tier import")
    pytester.makepyfile(dict_tier=files["dict_tier.py"], broken_tier=broken, test_broken=test)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert _outcomes(result)["failed"] >= 1
    result.stdout.fnmatch_lines(["*FAILED*test_get_ranges*"])


def test_the_kit_reexports_the_fault_injection_tier() -> None:
    assert mouthguard.testing.FaultyTier is faults.FaultyTier
    assert mouthguard.testing.FaultPlan is faults.FaultPlan
    assert set(mouthguard.testing.__all__) == set(faults.__all__)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_storage_core_never_imports_the_kit_or_pytest() -> None:
    # Every module but the kit itself, imported by path (pkgutil would import the kit).
    done = _python(
        """
        import importlib, pathlib, sys
        import mouthguard
        root = pathlib.Path(mouthguard.__file__).parent
        for path in sorted(root.rglob("*.py")):
            parts = ("mouthguard", *path.relative_to(root).with_suffix("").parts)
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            if parts[1:2] != ("testing",):
                try:
                    importlib.import_module(".".join(parts))
                except ModuleNotFoundError as exc:
                    # The vLLM plug-ins import vllm, which lives in its own environment.
                    if (exc.name or "").split(".")[0] != "vllm":
                        raise
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"pytest", "_pytest"})
        print(loaded, "mouthguard.testing" in sys.modules)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"


def test_without_pytest_the_faults_import_and_the_suite_says_what_is_missing() -> None:
    done = _python(
        """
        import sys
        sys.modules["pytest"] = None  # as if pytest were not installed
        from mouthguard.testing import FaultPlan, FaultyTier
        try:
            import mouthguard.testing.conformance
        except ImportError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "mouthguard.testing.conformance is a pytest suite and needs pytest" in done.stdout

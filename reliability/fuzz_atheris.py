"""Optional coverage-guided fuzzing of the parsers with atheris (libFuzzer for Python).

Not a dependency and not part of CI: ``pip install atheris`` (a binary wheel for
CPython 3.11 on manylinux x86_64; it installed in about 2 s here), then::

    python -m reliability.fuzz_atheris manifest -max_total_time=60
    python -m reliability.fuzz_atheris rank_header -runs=200000 corpus_dir/

Targets: ``manifest`` (``parse_manifest``, the input also re-sealed so the checksum
passes), ``rank_header`` (``parse_header``), ``typed_json`` (``loads_strict`` +
``decode`` + ``tensor_references``), ``sidecar`` (``unseal``), ``dcp_metadata``
(a DCP manifest whose ``dcp`` member is the input, re-sealed). The documented
error of each parser is swallowed; any other exception is a crash that libFuzzer
reports with the input that caused it (``crash-<sha1>`` in the working directory).
The seed corpus is written from real saves (:mod:`reliability.fuzz_seeds`) when
the corpus directory given is empty, or into a temporary one when none is given.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGETS = ("manifest", "rank_header", "typed_json", "sidecar", "dcp_metadata")


def available() -> bool:
    """Whether atheris can be imported here."""
    try:
        importlib.import_module("atheris")
    except ImportError:
        return False
    return True


def _targets() -> dict[str, Callable[[bytes], None]]:
    from mouthguard.dcp.metadata_json import decode_metadata  # noqa: PLC0415
    from mouthguard.errors import FormatError, ManifestError, RankFileError  # noqa: PLC0415
    from mouthguard.format import typed_json  # noqa: PLC0415
    from mouthguard.format.manifest import parse_manifest  # noqa: PLC0415
    from mouthguard.format.rank_file import parse_header  # noqa: PLC0415
    from mouthguard.format.sealed import unseal  # noqa: PLC0415
    from mouthguard.format.state_tree import tensor_references  # noqa: PLC0415
    from reliability.fuzz_mutate import seal_prefix, split_sealed  # noqa: PLC0415

    def manifest(data: bytes) -> None:
        for raw in (data, seal_prefix(split_sealed(data)[0])):
            with contextlib.suppress(ManifestError):
                parse_manifest(raw)

    def rank_header(data: bytes) -> None:
        with contextlib.suppress(RankFileError):
            parse_header(data, len(data))

    def typed(data: bytes) -> None:
        try:
            value = typed_json.loads_strict(data)
        except FormatError:
            return
        for action in (typed_json.decode, tensor_references):
            with contextlib.suppress(FormatError):
                action(value)

    def sidecar(data: bytes) -> None:
        for raw in (data, seal_prefix(split_sealed(data)[0])):
            with contextlib.suppress(FormatError):
                unseal(raw)

    def dcp(data: bytes) -> None:
        try:
            raw = seal_prefix(split_sealed(data)[0])
            found = parse_manifest(raw)
            if found.dcp is not None:
                decode_metadata(found.dcp, found)
        except ManifestError:
            pass

    return {
        "manifest": manifest,
        "rank_header": rank_header,
        "typed_json": typed,
        "sidecar": sidecar,
        "dcp_metadata": dcp,
    }


def _corpus(target: str, directory: Path) -> None:
    from reliability.fuzz_seeds import build_seeds  # noqa: PLC0415

    seeds = build_seeds(Path(tempfile.mkdtemp(prefix="mouthguard-atheris-seeds-")))
    items: list[bytes] = []
    for seed in seeds.checkpoints.values():
        if target in ("manifest", "sidecar") or (target == "dcp_metadata" and seed.name == "dcp"):
            items.append(seed.manifest)
        if target == "rank_header":
            items.extend(seed.files.values())
        if target == "typed_json":
            items.append(json.dumps(seed.body["states"]).encode())
    if target == "sidecar":
        items.extend(raw for _, raw in seeds.sidecars.values())
    for i, item in enumerate(items):
        (directory / f"seed-{i}").write_bytes(item)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not available():
        print("atheris is not installed: pip install atheris (optional)", file=sys.stderr)
        return 2
    if not args or args[0] not in TARGETS:
        print(f"usage: python -m reliability.fuzz_atheris {{{','.join(TARGETS)}}} [libFuzzer args]")
        return 2
    name, rest = args[0], args[1:]
    atheris: Any = importlib.import_module("atheris")
    # Only mouthguard is instrumented (all of torch would take minutes); nothing of it
    # may be imported before this point.
    with atheris.instrument_imports(include=["mouthguard"]):
        target = _targets()[name]
    corpus_dirs = [a for a in rest if not a.startswith("-")]
    if not corpus_dirs:
        corpus = Path(tempfile.mkdtemp(prefix=f"mouthguard-atheris-{name}-"))
        rest.append(str(corpus))
        corpus_dirs = [str(corpus)]
    first = Path(corpus_dirs[0])
    first.mkdir(parents=True, exist_ok=True)
    if not any(first.iterdir()):
        _corpus(name, first)
    atheris.Setup([sys.argv[0], *rest], target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())

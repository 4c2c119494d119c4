"""End to end: hostile checkpoints and planted links in a real local store, in a watched sandbox.

Each case writes one damaged or hostile checkpoint (or hostile sidecars) into the
fast tier of a real two-tier local store and runs what an operator would:
``Checkpointer.list``/``load``, ``verify``, a replication pass and garbage
collection. Only mouthguard's documented errors may come out; a load that
succeeds must return the bytes an independent safetensors reader finds; and
nothing outside the tier roots may be opened, read or written (watched by
inotify, see :mod:`reliability.fuzz_sandbox`). A blocking open of a FIFO would
hang the case: the runner's watchdog reports it.

The link scenarios plant symbolic links inside the tier roots pointing outside
(to the canary directory, which holds a *valid* checkpoint, and to FIFOs) and
check that listing, loading, verification, replication and collection never
follow them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mouthguard
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.dcp.reader import Reader
from mouthguard.errors import MouthguardError
from mouthguard.jobs.replicator import Replicator
from reliability import fuzz_mutate as mut
from reliability.fuzz_case import ACCEPTED_CORRUPT, Case, Context
from reliability.fuzz_checkpoints import changed_without_seal, judge_load, make_checkpoint
from reliability.fuzz_sandbox import Sandbox, make_sandbox
from reliability.fuzz_seeds import Seeds


@dataclass
class E2E:
    """The sandboxed store shared by the end-to-end cases of one worker."""

    sandbox: Sandbox
    store: mouthguard.Store


def _step_dir(tier_root: Path, run: str, step: int) -> Path:
    return tier_root / run / f"{step:012d}"


def _write_checkpoint(tier_root: Path, run: str, step: int, parts: dict[str, bytes]) -> None:
    directory = _step_dir(tier_root, run, step)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in parts.items():
        (directory / name).write_bytes(data)


def setup(workdir: Path, seeds: Seeds) -> E2E:
    """Build the sandbox: canaries (with a valid checkpoint outside) and an empty store."""
    sandbox = make_sandbox(workdir)
    single = seeds.checkpoints["single"]
    outside = sandbox.canary / "tree"
    _write_checkpoint(outside, single.run, 9, _restep(single.manifest, 9, single.files))
    _write_checkpoint(
        outside, single.run, single.step, {"manifest.json": single.manifest, **single.files}
    )
    (sandbox.canary / "rank-00000.safetensors").write_bytes(single.files["rank-00000.safetensors"])
    for name, raw in seeds.sidecars.values():
        (sandbox.canary / name).write_bytes(raw)
    (sandbox.canary / "empty-run").mkdir()
    store = mouthguard.open_store(sandbox.store)
    sandbox.start()
    return E2E(sandbox, store)


def _restep(manifest: bytes, step: int, files: dict[str, bytes]) -> dict[str, bytes]:
    body = json.loads(manifest)
    body.pop("manifest_checksum")
    body["step"] = step
    return {"manifest.json": mut.seal_text(mut.dumps(body)), **files}


def _reset(env: E2E) -> None:
    for tier_root in env.sandbox.tiers:
        for child in tier_root.iterdir():
            if child.is_symlink() or not child.is_dir():
                child.unlink()
            else:
                shutil.rmtree(child)


def _outside_reads(env: E2E) -> str | None:
    events = env.sandbox.events()
    if events:
        return "touched outside the store: " + "; ".join(str(e) for e in events[:5])
    return None


def _operate(env: E2E, case: Case, ctx: Context, run: str, step: int) -> str | None:
    """Everything an operator runs over the store; returns a broken invariant or None."""
    ckpt = mouthguard.Checkpointer(env.store, run=run, background=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(MouthguardError):
            ckpt.list()
        for wanted in (step, None):
            try:
                loaded = ckpt.load(wanted)
            except MouthguardError:
                continue
            if loaded.step == case.meta.get("step") and case.target == "e2e":
                problem = judge_load(
                    case, ctx.seeds, _manifest_on_disk(env, run, step), 0, loaded.state
                )
                if problem:
                    return problem
        report = verify_and_record(CopyRef(env.store.fast, run, step))
        if report.ok and case.target == "e2e" and changed_without_seal(case, ctx.seeds):
            return ACCEPTED_CORRUPT + f"{case.mode}: verify passed a damaged copy"
        if case.meta.get("seed") == "dcp":
            with contextlib.suppress(MouthguardError):
                Reader(env.store, run=run, step=step).read_metadata()
        Replicator(env.store).replicate(run, step)  # documented: never raises for bad data
        with contextlib.suppress(MouthguardError):
            ckpt.collect_garbage(grace_seconds=0)
    return None


def _manifest_on_disk(env: E2E, run: str, step: int) -> bytes:
    # The loaded copy came from the fast tier (or a durable copy replicated from it).
    return (_step_dir(env.sandbox.tiers[0], run, step) / "manifest.json").read_bytes()


def make_e2e(rng: random.Random, seeds: Seeds, index: int) -> Case:
    if rng.random() < 0.25:  # a pristine checkpoint on both tiers, hostile sidecars on each
        seed = seeds.checkpoints["single"]
        parts: dict[str, bytes] = {}
        for kind in rng.sample(sorted(seeds.sidecars), rng.randrange(1, 4)):
            name, raw = seeds.sidecars[kind]
            body = json.loads(raw)
            body.pop("manifest_checksum", None)
            parts[name] = mut.seal_text(mut.dumps(mut.mutate_json(rng, body)))
        meta = {"seed": seed.name, "run": seed.run, "step": seed.step}
        return Case("e2e", index, "sidecars", parts, meta)
    return make_checkpoint(rng, seeds, "e2e", index)


def check_e2e(case: Case, ctx: Context, env: E2E) -> str | None:
    _reset(env)
    run, step = str(case.meta["run"]), int(case.meta["step"])
    fast, durable = env.sandbox.tiers
    if case.mode == "sidecars":
        # Hostile facts on the fast copy, the genuine ones on the durable copy: readers
        # merge them across copies.
        seed = ctx.seeds.checkpoints[case.meta["seed"]]
        genuine = {name: raw for name, raw in ctx.seeds.sidecars.values() if name in case.parts}
        for root, facts in ((fast, case.parts), (durable, genuine)):
            _write_checkpoint(root, run, step, {"manifest.json": seed.manifest, **seed.files})
            _write_checkpoint(root, run, step, facts)
    else:
        _write_checkpoint(fast, run, step, case.parts)
    problem = _operate(env, case, ctx, run, step)
    return problem or _outside_reads(env)


# --- planted links -------------------------------------------------------------------


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _seed_copy(env: E2E, ctx: Context, root: Path | None = None) -> tuple[str, int]:
    seed = ctx.seeds.checkpoints["single"]
    _write_checkpoint(
        root or env.sandbox.tiers[0],
        seed.run,
        seed.step,
        {"manifest.json": seed.manifest, **seed.files},
    )
    return seed.run, seed.step


def _expect_invisible(env: E2E, run: str, step: int) -> str | None:
    ckpt = mouthguard.Checkpointer(env.store, run=run, background=False)
    if step in ckpt.steps():
        return f"step {step} of {run} reached through a link is listed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            loaded = ckpt.load(step)
        except MouthguardError:
            return None
    return f"step {loaded.step} of {run} was loaded through a link outside the tier"


def _scenario_step_dir(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    _link(
        _step_dir(env.sandbox.tiers[0], run, 9), env.sandbox.canary / "tree" / run / "000000000009"
    )
    return _expect_invisible(env, run, 9) or _operate_all(env, ctx, run, step)


def _scenario_run_dir(env: E2E, ctx: Context) -> str | None:
    _link(env.sandbox.tiers[0] / "evil", env.sandbox.canary / "tree" / "r")
    run, step = _seed_copy(env, ctx)
    return _expect_invisible(env, "evil", 9) or _operate_all(env, ctx, run, step)


def _scenario_rank_file(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    rank = _step_dir(env.sandbox.tiers[0], run, step) / "rank-00000.safetensors"
    rank.unlink()
    _link(rank, env.sandbox.canary / "rank-00000.safetensors")  # identical bytes outside
    ckpt = mouthguard.Checkpointer(env.store, run=run, background=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ckpt.load(step)
        except MouthguardError:
            return _operate_all(env, ctx, run, step)
    return "a rank file reached through a link outside the tier was loaded"


def _scenario_fifo_files(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    directory = _step_dir(env.sandbox.tiers[0], run, step)
    (directory / "rank-00000.safetensors").unlink()
    _link(directory / "rank-00000.safetensors", env.sandbox.fifo)
    _link(directory / "sidecar.trash.json", env.sandbox.canary / "fifo")
    os.mkfifo(directory / "sidecar.hold.fifo.json")
    os.mkfifo(directory / "sidecar.verified.json")
    return _operate_all(env, ctx, run, step)


def _scenario_manifest(env: E2E, ctx: Context) -> str | None:
    single = ctx.seeds.checkpoints["single"]
    directory = _step_dir(env.sandbox.tiers[0], single.run, 9)
    directory.mkdir(parents=True)
    (directory / "rank-00000.safetensors").write_bytes(single.files["rank-00000.safetensors"])
    _link(
        directory / "manifest.json",
        env.sandbox.canary / "tree" / "r" / "000000000009" / "manifest.json",
    )
    return _expect_invisible(env, single.run, 9) or _operate_all(env, ctx, single.run, 9)


def _scenario_sidecars(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    directory = _step_dir(env.sandbox.tiers[0], run, step)
    for name, _ in ctx.seeds.sidecars.values():
        _link(directory / name, env.sandbox.canary / name)
    _link(directory / "sidecar.hold.secret.json", env.sandbox.canary / "secret.txt")
    return _operate_all(env, ctx, run, step)


def _expect_loads(env: E2E, run: str, step: int) -> str | None:
    """A valid copy on the fast tier loads, whatever was planted on the other tier."""
    ckpt = mouthguard.Checkpointer(env.store, run=run, background=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ckpt.load(step)
        except MouthguardError as exc:
            return f"a valid copy on the fast tier did not load: {type(exc).__name__}: {exc}"
    return None


def _scenario_destination(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    _link(env.sandbox.tiers[1] / run, env.sandbox.canary / "empty-run")
    # A write through the link would show as a create event in the watched empty-run.
    return _expect_loads(env, run, step) or _operate_all(env, ctx, run, step)


def _scenario_destination_step(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    _link(_step_dir(env.sandbox.tiers[1], run, step), env.sandbox.canary / "empty-run")
    return _expect_loads(env, run, step) or _operate_all(env, ctx, run, step)


def _scenario_partial(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    fast = env.sandbox.tiers[0]
    _link(
        fast / run / f"{3:012d}.partial-deadbeef",
        env.sandbox.canary / "tree" / "r" / "000000000009",
    )
    loose = fast / run / f"{4:012d}"
    loose.mkdir(parents=True)
    (loose / "rank-00000.safetensors").write_bytes(b"debris")
    _link(loose / "rank-00001.safetensors", env.sandbox.canary / "secret.txt")
    _link(fast / run / f"{5:012d}.partial-0123abcd", env.sandbox.canary)
    return _operate_all(env, ctx, run, step)


def _scenario_root_links(env: E2E, ctx: Context) -> str | None:
    run, step = _seed_copy(env, ctx)
    fast = env.sandbox.tiers[0]
    _link(fast / "up", Path(".."))
    _link(fast / run / "parent", Path("../.."))
    _link(fast / run / f"{step:012d}" / "canary.txt", env.sandbox.root / "canary.txt")
    _link(fast / "abs", Path("/"))
    return _expect_invisible(env, "up", 1) or _operate_all(env, ctx, run, step)


def _operate_all(env: E2E, ctx: Context, run: str, step: int) -> str | None:
    case = Case("symlink", 0, "link", {}, {"run": run, "step": step})
    problem = _operate(env, case, ctx, run, step)
    if problem:
        return problem
    try:
        Replicator(env.store).run_once()
    except MouthguardError as exc:
        return f"a replication pass failed: {exc}"
    return None


SCENARIOS: dict[str, Callable[[E2E, Context], str | None]] = {
    "step_dir_link": _scenario_step_dir,
    "run_dir_link": _scenario_run_dir,
    "rank_file_link": _scenario_rank_file,
    "fifo_and_fifo_links": _scenario_fifo_files,
    "manifest_link": _scenario_manifest,
    "sidecar_links": _scenario_sidecars,
    "destination_run_link": _scenario_destination,
    "destination_step_link": _scenario_destination_step,
    "partial_and_debris_links": _scenario_partial,
    "links_to_parents_and_root": _scenario_root_links,
}


def check_symlink(case: Case, ctx: Context, env: E2E) -> str | None:
    _reset(env)
    name = case.meta["scenario"]
    problem = SCENARIOS[name](env, ctx)
    return problem or _outside_reads(env)

"""Code that runs inside the gloo processes of the DCP tests (module level: picklable).

The state is FSDP-like: parameters and optimizer moments are DTensors sharded on
dim 0 of a CPU device mesh (one shard uneven), one is replicated, and plain
values (step, lr) become DCP bytes items. :func:`full_state` is the ground truth
both the ranks and the test process compute.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.futures import Future

from mouthguard.dcp import Reader, Writer

RUN = "r"
#: Which placement each tensor gets on the mesh (the rest of full_state is plain values).
PLACEMENTS: dict[str, Shard | Replicate] = {
    "model.embed.weight": Shard(0),
    "model.fc.weight": Shard(0),
    "model.fc.bias": Shard(0),
    "model.odd": Shard(0),  # 7 rows: uneven on 2 ranks (4, 3) and on 4 (2, 2, 2, 1)
    "model.norm.scale": Replicate(),
    "optim.exp_avg.fc.weight": Shard(0),
}


def full_state(step: int) -> dict[str, Any]:
    """The unsharded state saved at ``step`` (deterministic)."""
    g = torch.Generator().manual_seed(step)
    return {
        "model": {
            "embed.weight": torch.randn(12, 6, generator=g),
            "fc.weight": torch.randn(10, 6, generator=g),
            "fc.bias": torch.randn(10, generator=g),
            "odd": torch.arange(7 * 3, dtype=torch.int64).view(7, 3) * step,
            "norm.scale": torch.arange(6, dtype=torch.bfloat16) + step,
        },
        "optim": {
            "step": step,
            "lr": 0.1 / step,
            "betas": (0.9, 0.999),
            "exp_avg": {"fc.weight": torch.randn(10, 6, generator=g)},
        },
    }


def _walk(state: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any], str]]:
    """(dotted path, containing dict, key) of every leaf."""
    out = []
    for key, value in state.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _walk(value, f"{path}.")
        else:
            out.append((path, state, key))
    return out


def sharded_state(step: int, *, empty: bool = False) -> dict[str, Any]:
    """full_state(step) as DTensors on a 1-D mesh over every rank (zeros if ``empty``)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    state = full_state(step)
    for path, parent, key in _walk(state):
        value = parent[key]
        if isinstance(value, torch.Tensor):
            if empty:
                value = torch.zeros_like(value)
            parent[key] = distribute_tensor(value, mesh, [PLACEMENTS[path]])
        elif empty:
            parent[key] = None  # DCP replaces bytes items wholesale
    return state


def as_full(state: dict[str, Any]) -> dict[str, Any]:
    """Replace every DTensor by its full tensor (a collective: every rank calls it)."""
    for _, parent, key in _walk(state):
        if isinstance(parent[key], DTensor):
            parent[key] = parent[key].full_tensor()
    return state


def assert_equal_states(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Exact equality: same keys, tensors bitwise with dtype and shape, values by ==."""
    got_leaves = {p: parent[k] for p, parent, k in _walk(got)}
    want_leaves = {p: parent[k] for p, parent, k in _walk(want)}
    assert sorted(got_leaves) == sorted(want_leaves)
    for path, value in want_leaves.items():
        mine = got_leaves[path]
        if isinstance(value, torch.Tensor):
            assert isinstance(mine, torch.Tensor), path
            assert mine.dtype == value.dtype and mine.shape == value.shape, path
            assert torch.equal(mine, value), path
        else:
            assert type(mine) is type(value) and mine == value, (path, mine, value)


class FailingWriter(Writer):
    """Rank 1 fails in write_data (after rank 0 may already have written its file)."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if plan.storage_data.rank == 1:
            raise OSError("simulated: rank 1 lost its disk")
        return super().write_data(plan, planner)


def save_two_ranks(rank: int, world_size: int, root: str) -> dict[str, Any]:
    """The saves the DCP tests inspect (one spawn for all of them).

    * step 1: ``dcp.save``, importance milestone, with sha256;
    * step 2: the same Writer reused through ``checkpoint_id="r/2"``;
    * step 3: rank 1 fails in write_data -> nothing may be committed;
    * step 4: ``dcp.async_save`` (the newest).
    """
    del world_size
    writer = Writer(
        root, run=RUN, step=1, importance="milestone", with_sha256=True, background=False
    )
    dcp.save(sharded_state(1), storage_writer=writer)
    dcp.save(sharded_state(2), storage_writer=writer, checkpoint_id=f"{RUN}/2")
    failed: dict[str, Any] = {}
    try:
        dcp.save(
            sharded_state(3), storage_writer=FailingWriter(root, run=RUN, step=3, background=False)
        )
    except CheckpointException as exc:
        failed = {
            "ranks": sorted(exc.failures),
            "errors": [type(e).__name__ for e, _ in exc.failures.values()],
        }
    response = dcp.async_save(
        sharded_state(4), storage_writer=Writer(root, run=RUN, step=4, background=False)
    )
    future = getattr(response, "upload_completion", response)
    future.result(timeout=60)
    return {"rank": rank, "failed": failed}


def load_four_ranks(rank: int, world_size: int, root: str) -> dict[str, int | None]:
    """Load step 1 and the newest step into a 4-rank sharding and compare exactly."""
    del rank, world_size
    resolved: dict[str, int | None] = {}
    for name, step, expected_step in (("explicit", 1, 1), ("newest", None, 4)):
        state = sharded_state(expected_step, empty=True)
        reader = Reader(root, run=RUN, step=step)
        dcp.load(state, storage_reader=reader)
        assert_equal_states(as_full(state), full_state(expected_step))
        resolved[name] = reader.resolved_step
    return resolved

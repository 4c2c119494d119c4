"""Two real torch.distributed ranks (gloo), two DataLoader workers each: every sample once
per epoch across ranks x workers, and each rank's resume exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import run_distributed

from .helpers import expected, write_dataset

N = 45  # odd: the ranks' spans differ by one sample
BATCH = 4


def _loader(root: str, seed: int = 2) -> object:
    from mouthguard.data import StreamingDataLoader, StreamingDataset  # noqa: PLC0415

    dataset = StreamingDataset(
        Path(root) / "ds", shuffle=True, seed=seed, batch_size=BATCH, cache_dir=Path(root) / "c"
    )
    # A spawned rank's default start method is spawn; workers fork here as under torchrun
    # (spawned workers are tested in test_loader, once: each costs a torch import).
    return StreamingDataLoader(dataset, num_workers=2, multiprocessing_context="fork")


def _keys(loader: object, count: int | None = None) -> list[str]:
    out: list[str] = []
    for number, batch in enumerate(loader):  # type: ignore[attr-defined]
        out += list(batch["__key__"])
        if count is not None and number + 1 == count:
            break
    return out


def _work(rank: int, world_size: int, root: str) -> dict[str, object]:
    import multiprocessing  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    # run_distributed starts its ranks as daemons (so they die with the test), and a daemon
    # may not start processes: this rank's DataLoader workers need it not to be one.
    multiprocessing.current_process().daemon = False

    reference_loader = _loader(root)
    assert reference_loader.dataset.rank == rank  # type: ignore[attr-defined]
    assert reference_loader.dataset.world_size == world_size  # type: ignore[attr-defined]
    reference = _keys(reference_loader) + _keys(reference_loader)  # epochs 0 and 1

    first = _loader(root)
    head = _keys(first, 3)
    state = first.state_dict()  # type: ignore[attr-defined]
    dist.barrier()  # both ranks were interrupted: now both resume
    resumed = _loader(root, seed=99)  # the seed comes back from the state
    resumed.load_state_dict(state)  # type: ignore[attr-defined]
    tail: list[str] = []
    for epoch in range(resumed.epoch, 2):  # type: ignore[attr-defined]
        resumed.set_epoch(epoch)  # type: ignore[attr-defined]
        tail += _keys(resumed)
    return {"reference": reference, "resumed": head + tail, "state": state}


@pytest.mark.slow
def test_two_ranks_two_workers_exactly_once_and_exact_resume(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=N)
    results = run_distributed(_work, 2, str(tmp_path), timeout=120)
    everyone = expected(N)
    for epoch in range(2):
        seen: list[str] = []
        for result in results:
            reference: list[str] = result["reference"]
            half = len(reference) // 2
            seen += reference[epoch * half : (epoch + 1) * half]
        assert sorted(seen) == sorted(everyone), f"epoch {epoch}: each sample exactly once"
    sizes = [len(r["reference"]) // 2 for r in results]
    assert sorted(sizes) == [N // 2, N - N // 2]
    for rank, result in enumerate(results):
        assert result["resumed"] == result["reference"], f"rank {rank}"
        assert result["state"]["rank"] == rank and result["state"]["world_size"] == 2


# --- a Parquet dataset: row groups in the role of shards -------------------------

PARQUET_BATCH = 8


def row_ids(batch: list[dict[str, object]]) -> list[object]:
    """collate_fn: the ids of a batch of rows (module level: workers may pickle it)."""
    return [row["id"] for row in batch]


def _parquet_loader(root: str, seed: int = 2) -> object:
    from mouthguard.data import StreamingDataLoader, StreamingDataset  # noqa: PLC0415

    dataset = StreamingDataset(
        Path(root) / "text",
        shuffle=True,
        seed=seed,
        batch_size=PARQUET_BATCH,
        shuffle_window=2,
        cache_dir=Path(root) / "c",
    )
    return StreamingDataLoader(
        dataset, num_workers=2, multiprocessing_context="fork", collate_fn=row_ids
    )


def _ids(loader: object, count: int | None = None) -> list[object]:
    out: list[object] = []
    for number, batch in enumerate(loader):  # type: ignore[attr-defined]
        out += batch
        if count is not None and number + 1 == count:
            break
    return out


def _parquet_work(rank: int, world_size: int, root: str) -> dict[str, object]:
    import multiprocessing  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    multiprocessing.current_process().daemon = False  # see _work
    reference = _ids(_parquet_loader(root))
    first = _parquet_loader(root)
    head = _ids(first, 5)
    state = first.state_dict()  # type: ignore[attr-defined]
    dist.barrier()
    resumed = _parquet_loader(root, seed=99)
    resumed.load_state_dict(state)  # type: ignore[attr-defined]
    return {"reference": reference, "resumed": head + _ids(resumed)}


@pytest.mark.slow
def test_parquet_two_ranks_two_workers_every_row_once_and_exact_resume(tmp_path: Path) -> None:
    from mouthguard.data import index_dataset  # noqa: PLC0415

    from .adopted import parquet_files  # noqa: PLC0415

    _, rows = parquet_files(tmp_path / "text")
    index_dataset(tmp_path / "text")
    results = run_distributed(_parquet_work, 2, str(tmp_path), timeout=120)
    seen = [i for result in results for i in result["reference"]]
    assert sorted(seen) == list(range(rows)), "each row exactly once across ranks and workers"
    for rank, result in enumerate(results):
        assert result["resumed"] == result["reference"], f"rank {rank}"

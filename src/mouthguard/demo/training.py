"""The demo's training job: a small MLP learning a fixed random teacher on synthetic data.

Everything random that a real training loop touches is exercised, so a resume
that forgot any piece of state would visibly diverge from the reference run:

* dropout masks and input batches come from torch's global RNG;
* per-batch input gain (a toy augmentation) comes from Python's ``random``;
* label noise comes from NumPy's global RNG;
* AdamW moments and step counts, and a warmup-then-cosine LR schedule, evolve
  every step.

The teacher network is *not* training state: it is rebuilt from the seed with a
private generator in every process, exactly as a real job reloads its dataset.

Determinism contract: given the same :class:`TrainConfig`, every process that
calls :func:`configure_determinism` and then :func:`build_training_state` and
:func:`train_step` produces bitwise identical losses and weights on CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from mouthguard.checkpoint.training_state import TrainingState
from mouthguard.format.state_tree import iter_tensors
from mouthguard.policy.importance import Importance

#: torch's intra-op thread count in every demo process. A fixed count keeps
#: float reductions in the same order in every process, hence bitwise results.
NUM_THREADS = 1


@dataclass(frozen=True)
class TrainConfig:
    """Shape of the demo job. Sizes are chosen so the state is ~30 MB and a step ~30 ms.

    Attributes:
        seed: seeds the model init, the teacher and every global RNG.
        in_features: input width.
        hidden: width of the hidden layers.
        depth: number of hidden layers.
        out_features: output width.
        batch_size: examples per step.
        dropout: dropout probability after every hidden layer.
        lr: peak learning rate.
        warmup_steps: linear warmup length.
        total_steps: length of the run (the cosine schedule ends here).
    """

    seed: int = 0
    in_features: int = 256
    hidden: int = 1024
    depth: int = 3
    out_features: int = 64
    batch_size: int = 64
    dropout: float = 0.1
    lr: float = 1e-3
    warmup_steps: int = 10
    total_steps: int = 100


@dataclass
class Job:
    """A training state plus what is needed to run steps on it.

    Attributes:
        state: model, AdamW, scheduler, step and metadata (what is checkpointed).
        teacher: the fixed target function (rebuilt from the seed, never saved).
        config: the configuration the job was built from.
    """

    state: TrainingState
    teacher: nn.Module
    config: TrainConfig

    @property
    def model(self) -> nn.Module:
        """The trained model."""
        model = self.state.model
        assert isinstance(model, nn.Module)
        return model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer."""
        optimizer = self.state.optimizer
        assert isinstance(optimizer, torch.optim.Optimizer)
        return optimizer


def configure_determinism(seed: int) -> None:
    """Fix the thread count and seed torch's, NumPy's and Python's global RNGs."""
    torch.set_num_threads(NUM_THREADS)
    torch.manual_seed(seed)
    np.random.seed(seed)  # the global RNG on purpose: resume must restore it
    random.seed(seed)


def _mlp(config: TrainConfig, *, dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = config.in_features
    for _ in range(config.depth):
        layers += [nn.Linear(width, config.hidden), nn.GELU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = config.hidden
    layers.append(nn.Linear(width, config.out_features))
    return nn.Sequential(*layers)


def _build_teacher(config: TrainConfig) -> nn.Module:
    # A private generator: building the teacher must not move the global RNGs.
    generator = torch.Generator().manual_seed(config.seed + 1)
    teacher = _mlp(dataclasses.replace(config, hidden=128, depth=2), dropout=0.0)
    with torch.no_grad():
        for param in teacher.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5)
    teacher.requires_grad_(False)
    return teacher.eval()


def build_job(config: TrainConfig) -> Job:
    """Seed everything and build a fresh job at step 0.

    Call it the same way in every process (fresh or resuming): a resume then
    overwrites the freshly initialised state with the checkpoint's.
    """
    configure_determinism(config.seed)
    model = _mlp(config, dropout=config.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=0.1, total_iters=config.warmup_steps
    )
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=max(1, config.total_steps - config.warmup_steps)
    )
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer, [warmup, cosine], milestones=[config.warmup_steps]
    )
    state = TrainingState(
        model,
        optimizer,
        scheduler,
        step=0,
        metadata={"job": "mouthguard-demo", "seed": config.seed},
    )
    return Job(state=state, teacher=_build_teacher(config), config=config)


def train_step(job: Job) -> float:
    """Run one optimisation step, advance ``job.state.step``, return the loss.

    The returned float is the float32 loss converted exactly, so ``float.hex()``
    of it compares bitwise across processes.
    """
    config = job.config
    inputs = torch.randn(config.batch_size, config.in_features)
    gain = random.uniform(0.5, 1.5)  # noqa: S311 - data augmentation, not security
    noise = np.random.standard_normal((config.batch_size, config.out_features))
    inputs = inputs * gain
    with torch.no_grad():
        targets = job.teacher(inputs) + 0.05 * torch.from_numpy(noise.astype(np.float32))
    job.model.train()
    loss = nn.functional.mse_loss(job.model(inputs), targets)
    job.optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    job.optimizer.step()
    scheduler = job.state.scheduler
    assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
    scheduler.step()
    job.state.step += 1
    value = float(loss.item())
    job.state.metadata["loss"] = value
    return value


def importance_for(step: int, *, total_steps: int, milestone_every: int) -> Importance:
    """The importance hint of the checkpoint at ``step``.

    The final checkpoint is the run's deliverable (critical); every
    ``milestone_every`` steps a milestone worth keeping long-term; the rest are
    routine restart points that retention may thin out.
    """
    if step == total_steps:
        return Importance.CRITICAL
    if milestone_every > 0 and step % milestone_every == 0:
        return Importance.MILESTONE
    return Importance.ROUTINE


def tensors_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over the names, dtypes, shapes and raw bytes of ``tensors``, in order."""
    digest = hashlib.sha256()
    for name, tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def weights_digest(job: Job) -> str:
    """Digest of every parameter and buffer of the model."""
    return tensors_digest(job.model.state_dict().items())


def optimizer_digest(job: Job) -> str:
    """Digest of every optimizer state tensor (AdamW moments and step counts)."""
    state = job.optimizer.state_dict()["state"]
    items: list[tuple[str, torch.Tensor]] = []
    for index in sorted(state):
        for key in sorted(state[index]):
            value = state[index][key]
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            items.append((f"{index}.{key}", tensor))
    return tensors_digest(items)


def parameter_count(job: Job) -> int:
    """Number of trainable scalars in the model."""
    return sum(p.numel() for p in job.model.parameters())


class MemcpyClock:
    """Times a plain memcpy of a state: the floor an async save's stall is compared with.

    The destination tensors are allocated once, untimed, and reused, so what is
    timed is the copy alone (no allocation, no page faults) -- the fairest
    reference for a snapshot into a reused staging buffer.
    """

    def __init__(self) -> None:
        self._targets: list[torch.Tensor] = []

    def seconds(self, state: object) -> float:
        """Seconds to copy every tensor of ``state`` into the reused destinations."""
        sources = [t.detach() for _path, t in iter_tensors(state)]
        shapes = [(t.shape, t.dtype) for t in sources]
        if [(t.shape, t.dtype) for t in self._targets] != shapes:
            self._targets = [torch.empty_like(t, device="cpu") for t in sources]
        started = time.perf_counter()
        for target, source in zip(self._targets, sources, strict=True):
            target.copy_(source)
        return time.perf_counter() - started

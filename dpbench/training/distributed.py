"""One run across K processes (``torch.distributed``): one mask, noise once, one accountant.

Under ``torchrun --nproc_per_node=K -m dpbench ...`` (or a SLURM / submitit job with K tasks)
every rank composes the same config and builds the same trainer from the same seed. A step:

1. every rank draws the *global* Poisson mask over all N examples from the run's sampling
   stream. The stream has the same seed and state on every rank, so this is one draw of the
   mask the accountant assumes, replicated, not K independent draws. Rank r keeps the
   examples ``indices[r::K]`` of it (``ShardedBatchSampler``); a rank whose slice is empty
   still takes part in every collective, so no rank ever skips a step;
2. each rank forms the clipped sums of its slice with the run's engine (book-keeping
   included: its sums are not autograd gradients, so they are reduced here explicitly, never
   by a DDP hook); the sums and the extra queries' sums are all-reduced (``Collective.sum_``);
3. rank 0 alone adds the Gaussian noise, drawn from the run's noise stream, and broadcasts
   the release (``Collective.from_main_``): the noise is added exactly once, at full
   strength, and every rank applies the same released update.

The ledger and accountant see the steps of the 1-process run. Only rank 0 writes files
(``results.json``, checkpoints, W&B); a resumed run starts every rank from rank 0's state.
A collective that fails (a rank died) raises ``PeerLost``, one line naming the rank.
See docs/distributed.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from dpbench.errors import ConfigError, DPBenchError
from dpbench.utils.launch import launched_world_size  # noqa: F401 (re-exported)


class PeerLost(DPBenchError):
    """A collective failed: another rank died or cannot be reached."""


def _lost(collective: Collective, err: BaseException) -> PeerLost:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return PeerLost(f"rank {collective.rank} of {collective.world_size}: lost contact with "
                    f"another rank ({first[:200]}); the run stops (its last checkpoint is kept)")


@dataclass(frozen=True)
class Collective:
    """The process group a run trains on; ``Collective()`` is the 1-process run (no-ops)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _call(self, fn, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, ConnectionError, OSError) as err:  # gloo / NCCL peer failures
            raise _lost(self, err) from None

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum ``tensors`` over the ranks in place (one flat all-reduce)."""
        if not self.distributed or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self._call(torch.distributed.all_reduce, flat)
        _unflatten_into(flat, tensors)

    def from_main_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite ``tensors`` on every rank with rank 0's values (one flat broadcast)."""
        if not self.distributed or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self._call(torch.distributed.broadcast, flat, src=0)
        _unflatten_into(flat, tensors)

    def count(self, n: int, device: torch.device | str = "cpu") -> int:
        """Return the sum of ``n`` over the ranks."""
        if not self.distributed:
            return n
        t = torch.tensor([n], dtype=torch.int64, device=device)
        self._call(torch.distributed.all_reduce, t)
        return int(t.item())

    def any(self, flag: bool, device: torch.device | str = "cpu") -> bool:
        """Return whether ``flag`` holds on any rank (so that every rank decides alike)."""
        if not self.distributed:
            return flag
        t = torch.tensor([int(flag)], dtype=torch.int64, device=device)
        self._call(torch.distributed.all_reduce, t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    def cat(self, values: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """Return the 1-D ``values`` of every rank, concatenated in rank order (on ``device``:
        NCCL gathers CUDA tensors only)."""
        if not self.distributed:
            return values
        values = values.to(device)
        size = torch.tensor([values.numel()], dtype=torch.int64, device=device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        self._call(torch.distributed.all_gather, sizes, size)
        longest = max(int(s.item()) for s in sizes)
        padded = torch.zeros(longest, dtype=values.dtype, device=device)
        padded[:values.numel()] = values.reshape(-1)
        parts = [torch.zeros_like(padded) for _ in range(self.world_size)]
        self._call(torch.distributed.all_gather, parts, padded)
        return torch.cat([p[:int(s.item())] for p, s in zip(parts, sizes)])

    def bytes_from_main(self, data: bytes, device: torch.device | str = "cpu") -> bytes:
        """Return rank 0's ``data`` on every rank (e.g. its serialised state)."""
        if not self.distributed:
            return data
        size = torch.tensor([len(data) if self.is_main else 0], dtype=torch.int64,
                            device=device)
        self._call(torch.distributed.broadcast, size, src=0)
        buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
        if self.is_main and len(data):
            buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self._call(torch.distributed.broadcast, buffer, src=0)
        return data if self.is_main else buffer.cpu().numpy().tobytes()

    def gather_strings(self, value: str) -> list[str]:
        """Return ``value`` of every rank, in rank order (e.g. their devices)."""
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        self._call(torch.distributed.all_gather_object, out, value)
        return [str(v) for v in out]

    def barrier(self) -> None:
        if self.distributed:
            self._call(torch.distributed.barrier)


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    start = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[start:start + n].view_as(t))
        start += n


#: the environment torchrun (and ``submitit.helpers.TorchDistributedEnvironment``) sets
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def device_name(device: torch.device) -> str:
    """Return e.g. ``cpu`` or ``cuda:0 (NVIDIA H200)``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def resolve_device(name: str, collective: Collective | None = None) -> torch.device:
    """Return the run's device; rank r of a multi-process run on CUDA uses cuda:LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if collective is not None and collective.distributed and name.startswith("cuda"):
        return torch.device("cuda", collective.local_rank)
    return torch.device(name)


def init_collective(device: str) -> Collective:
    """Join the process group torchrun described in the environment (1 process: no-op).

    gloo on CPU, NCCL on CUDA; each rank then uses ``cuda:LOCAL_RANK``. A SLURM job with K
    tasks (submitit's ``tasks_per_node``) exports the same variables through
    ``submitit.helpers.TorchDistributedEnvironment`` first.
    """
    if launched_world_size() == 1:
        return Collective()
    missing = [k for k in _ENV if k not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE is set but {', '.join(missing)} are not: launch with "
                          "torchrun --nproc_per_node=K -m dpbench ...")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=rank,
                                             world_size=world)
    return Collective(rank=rank, world_size=world, local_rank=local)


def from_slurm_tasks() -> None:
    """Export torchrun's variables from a submitit/SLURM job with several tasks (if any)."""
    if "WORLD_SIZE" in os.environ:
        return
    try:
        import submitit
        env = submitit.JobEnvironment()
    except (ImportError, RuntimeError):
        return  # not inside a submitit job
    if env.num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export()


def close_collective(collective: Collective) -> None:
    if collective.distributed and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class ShardedBatchSampler(Sampler[list[int]]):
    """Rank r's slice ``indices[r::K]`` of each global batch of ``batches`` (a batch sampler
    drawing the global Poisson mask from the run's sampling stream, as the 1-process run)."""

    def __init__(self, batches: Sampler[list[int]], collective: Collective) -> None:
        self.batches = batches
        self.collective = collective

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        r, k = self.collective.rank, self.collective.world_size
        for indices in self.batches:
            yield list(indices)[r::k]


def shard_loader(loader: DataLoader, collective: Collective) -> DataLoader:
    """Return ``loader`` yielding only this rank's slice of every global batch.

    The same dataset, collate function (empty slices included) and generator, so the global
    masks are the draws the 1-process run makes.
    """
    if not collective.distributed:
        return loader
    return DataLoader(loader.dataset,
                      batch_sampler=ShardedBatchSampler(loader.batch_sampler, collective),
                      collate_fn=loader.collate_fn, generator=loader.generator,
                      num_workers=loader.num_workers)

"""``dpbench-bench --processes K``: one DP-SGD step of the loop's release across K processes.

Each of K spawned processes (gloo on CPU, NCCL on CUDA) takes its slice ``r::K`` of the same
batch and runs the loop's release with the collective of ``training/distributed.py``: the
clipped sums all-reduced, the noise drawn by rank 0, the release broadcast; then the update.
Rounds alternate a 1-process group and a K-process group, each timed after its own warm-up
(process start-up is not timed), and the ratio is formed per round. On one CPU machine the K
processes share its cores: the ratio then measures the collectives' overhead, not a speed-up.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: builds rank r's step of a ``world``-process group: (spec, rank, world, device) -> step.
#: ``dpbench.bench`` passes ``bench_steps.rank_step`` (a module-level function: spawn pickles
#: it by name), so this module does not import the harness that imports it
RankStep = Callable[[dict[str, Any], int, int, torch.device], Callable[[], None]]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _worker(rank: int, world: int, port: int, spec: dict[str, Any], rank_step: RankStep,
            results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = spec["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(rank)
    torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=rank,
                                         world_size=world)
    try:
        torch.set_num_threads(spec["threads"])
        torch.manual_seed(0)
        step = rank_step(spec, rank, world, device)
        for _ in range(spec["warmup"]):
            step()
        times = []
        for _ in range(spec["reps"]):
            torch.distributed.barrier()
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - start)
        if rank == 0:
            results.put(statistics.median(times))
    finally:
        torch.distributed.destroy_process_group()


def _timed_group(world: int, spec: dict[str, Any], rank_step: RankStep) -> float:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, _free_port(), spec, rank_step, results),
                       nprocs=world,
                       join=True, start_method="spawn")
    return float(results.get())


def bench_processes(model: str, mode: str, batch: int, shape: tuple, world: int, reps: int,
                    warmup: int, rounds: int, rank_step: RankStep, device: str = "cpu",
                    threads: int = 1) -> list[tuple[float, float]]:
    """Return per round (median 1-process step s, median ``world``-process step s);
    ``rank_step`` builds each rank's step (``dpbench.bench_steps.rank_step``)."""
    spec = {"model": model, "mode": mode, "batch": batch, "shape": shape, "reps": reps,
            "warmup": warmup, "device": device, "threads": threads}
    return [(_timed_group(1, spec, rank_step), _timed_group(world, spec, rank_step))
            for _ in range(rounds)]

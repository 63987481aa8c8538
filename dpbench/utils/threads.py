"""Torch threads per job: a parallel sweep must not run k jobs with all cores' threads each.

With ``hydra/launcher=joblib`` and ``n_jobs = k`` every job gets ``max(1, cores // k)``
intra-op threads (k jobs x all cores' threads oversubscribe the CPU: OpenMP workers then spin
against each other, and a step can take ten times longer). A thread count the user set wins:
``trainer.num_threads``, or ``OMP_NUM_THREADS`` in the environment. The default launcher
(one job at a time) keeps torch's default, all cores.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """Return the CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def parallel_jobs(n_jobs: int, cores: int) -> int:
    """Return how many jobs joblib runs at once for ``n_jobs`` (-1: all cores, -2: all but
    one, ...)."""
    if n_jobs < 0:
        return max(1, cores + 1 + n_jobs)
    return max(1, n_jobs)


def threads_per_job(requested: int | None, concurrent_jobs: int, cores: int,
                    env: dict[str, str] | None = None) -> int | None:
    """Return the torch thread count for one job, or None to keep torch's default.

    ``requested`` (``trainer.num_threads``) wins, then ``OMP_NUM_THREADS`` (None: torch
    already honours it); k > 1 concurrent jobs share the cores, ``max(1, cores // k)`` each.
    """
    env = os.environ if env is None else env
    if requested is not None:
        return int(requested)
    if env.get("OMP_NUM_THREADS"):
        return None
    if concurrent_jobs > 1:
        return max(1, cores // concurrent_jobs)
    return None


def launcher_jobs(hydra_cfg) -> int:
    """Return how many jobs the Hydra launcher of this run executes at once (1: sequential)."""
    launcher = hydra_cfg.get("launcher") or {}
    target = str(launcher.get("_target_", ""))
    if "joblib" not in target.lower():
        return 1
    return parallel_jobs(int(launcher.get("n_jobs", -1)), available_cores())


def apply_threads(requested: int | None, hydra_cfg=None) -> int | None:
    """Set torch's intra-op threads for this job (see the module doc); return what was set."""
    jobs = launcher_jobs(hydra_cfg) if hydra_cfg is not None else 1
    threads = threads_per_job(requested, jobs, available_cores())
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return threads


def torch_threads() -> int:
    """Return torch's intra-op thread count (for the run log)."""
    import torch

    return torch.get_num_threads()

"""One seed per random stream, spawned from the run's seed (``numpy.random.SeedSequence``).

Every stream a run draws from (the Poisson sampler, the Gaussian noise, per-example draws,
posterior samples, audit canaries, model initialisation...) gets its own seed: stream ``name``
of run seed ``s`` is seeded by ``SeedSequence(s, spawn_key=(STREAMS.index(name), *index))``,
i.e. the ``name``-th child of ``SeedSequence(s).spawn``. Two names (or two indices) never
share a spawn key, so no two streams share a seed, and each stream is independent of the
others. ``STREAMS`` is append-only: reordering it would change every run's randomness.
See docs/privacy-unit-and-streams.md.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

from dpbench.errors import ConfigError

if TYPE_CHECKING:  # torch is imported by the functions that make generators: the seeds
    import torch  # themselves (``stream_seed``) serve commands that train nothing

#: every named random stream of a run (append-only: a name's position is its spawn key)
STREAMS: tuple[str, ...] = (
    "model_init",  # torch/numpy/python global RNGs while the model is built
    "model_configure",  # global RNGs while a method reconfigures the model (stage 0)
    "global",  # global RNGs during training (e.g. dropout): set after the model is built
    "sampler",  # Poisson sampling of the training batches
    "noise",  # the Gaussian noise of every release
    "method",  # method-side draws, e.g. IVON / DP-IVON posterior samples
    "task",  # per-example draws of the loss, e.g. diffusion steps, noise and target masks
    "task_eval",  # test-time sampling of a task (seeded by the task's eval_seed)
    "method_eval",  # test-time draws of a method, e.g. IVON's model-averaging samples
    "audit_secrets",  # which audit canaries are included (seeded by audit.seed)
    "audit_canaries",  # the Poisson sampling of the included canaries (audit.seed)
    "hpo_trial",  # the run seed of each dpbench-tune trial (indexed by trial; the master seed)
    "hpo_draws",  # dpbench-tune's random draws of hyper-parameters (indexed: 0 lr and batch
    # size, 1 clip floor; seeded by the master seed)
    "partitions",  # the fixed partitions of cyclic Poisson sampling (BandMF)
    "engine_check",  # per-example draws of the loss during the per-run engine check
    "task_rank",  # per-example draws of the loss on rank r of a K-process run (indexed by r)
    "hpo_selection",  # the search's private selection (dpbench-tune's exponential mechanism)
    "mia_model",  # the run seed of each model dpbench-mia trains (indexed by model)
    "mia_split",  # which pool examples train each dpbench-mia model (indexed by model)
    "mia_metrics",  # dpbench-mia's bootstrap and held-out threshold halves
    "user_partition",  # the synthetic user partition (index 0) and which of a user's
    # records privacy.max_examples_per_user keeps (index 1; dpbench/data/users.py)
    "mia_user_split",  # which pool users train each dpbench-mia model under privacy.unit=user
    # (indexed by model; dpbench/audit/mia/users.py)
)


def stream_seed(seed: int, name: str, *index: int) -> int:
    """Return the 63-bit seed of stream ``name`` (and sub-stream ``index``) of run ``seed``."""
    if name not in STREAMS:
        raise ValueError(f"unknown random stream {name!r}; known: {', '.join(STREAMS)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0 (got {seed!r})")
    sequence = np.random.SeedSequence(int(seed), spawn_key=(STREAMS.index(name), *index))
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))


def stream_generator(seed: int, name: str, device: str | torch.device = "cpu",
                     *index: int) -> torch.Generator:
    """Return a torch generator on ``device`` seeded for stream ``name`` of run ``seed``."""
    import torch

    return torch.Generator(device=device).manual_seed(stream_seed(seed, name, *index))


def seed_everything(seed: int, name: str = "model_init") -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) global generators for stream ``name``."""
    import torch

    stream = stream_seed(seed, name)
    random.seed(stream)
    np.random.seed(stream % 2**32)
    torch.manual_seed(stream)


def run_streams(seed: int, device: str | torch.device, rank: int | None = None
                ) -> dict[str, torch.Generator]:
    """Return the loop's generators, one spawned seed each (all are checkpointed).

    ``sampler`` (the Poisson masks) and ``task`` on the CPU, ``noise`` and ``method`` on the
    run's device; rank r of a K-process run (``rank``) draws its examples' per-example values
    from ``task_rank`` r instead, while the mask and the noise stay the run's own.
    """
    return {"sampler": stream_generator(seed, "sampler"),
            "noise": stream_generator(seed, "noise", device),
            "method": stream_generator(seed, "method", device),
            "task": (stream_generator(seed, "task") if rank is None
                     else stream_generator(seed, "task_rank", "cpu", rank))}

"""``scores.npz``: what a dpbench-mia cell measured, enough to recompute its table.

Arrays (numpy, no pickled objects; read with ``np.load(path)``, ``allow_pickle`` stays off):

- ``members`` ``(K, n)`` bool: example i of the pool trained model k (targets first);
- ``log_p_pool`` / ``phi_pool`` ``(K, n)``: each model's log-probability of the true label and
  its logit-scaled confidence on the pool;
- ``log_p_population`` ``(K, m)``: each model's log-probability on the population samples;
- ``phi_pool_augmented`` ``(K, A, n)`` (with ``mia.lira_augment``): phi on the pool's
  shifted copies, the first the images as they are;
- ``targets`` (scalar): how many of the K models were attacked;
- ``scores_<attack>`` ``(targets * n,)``: the attack's scores on the targets' pools, target 0
  first; ``target_members`` ``(targets * n,)``: the matching membership labels;
- under ``privacy.unit=user``: ``users`` ``(n,)`` each pool example's user (0..U-1), and the
  scores and ``target_members`` are per user, ``(targets * U,)`` (``users.py``).

docs/empirical-privacy.md shows the recomputation with scikit-learn.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from dpbench.audit.mia.models import ModelOutputs
from dpbench.utils.io import atomic_write_bytes

SCORES_NAME = "scores.npz"


def scores_arrays(out: ModelOutputs, targets: int, scores: dict[str, np.ndarray],
                  users: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Return the arrays ``scores.npz`` holds (see the module docstring)."""
    from dpbench.audit.mia.scoring import target_members

    return {"members": out.members.astype(bool), "log_p_pool": out.log_p_pool,
            "phi_pool": out.phi_pool, "log_p_population": out.log_p_population,
            "targets": np.asarray(targets),
            "target_members": target_members(out, targets, users),
            **({"users": np.asarray(users, np.int64)} if users is not None else {}),
            **({"phi_pool_augmented": out.phi_pool_augmented}
               if out.phi_pool_augmented is not None else {}),
            **{f"scores_{attack}": np.asarray(s, np.float64) for attack, s in scores.items()}}


def write_scores(run_dir: Path, arrays: dict[str, np.ndarray]) -> str:
    """Write ``scores.npz`` (compressed, atomically) into ``run_dir``; return its name."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write_bytes(run_dir / SCORES_NAME, buffer.getvalue())
    return SCORES_NAME

"""The population split of a membership-inference run (Carlini et al. 2022, Sec. IV-C).

Model k of a run (k = 0 .. targets + references - 1) trains on the pool examples its mask
selects: each example independently with probability 1/2 (a random half), drawn from stream
``mia_split`` k of the run seed; model k's own seed is stream ``mia_model`` k, from which its
loop spawns every other stream. Independent inclusion is what lets each example's
membership count as one trial of the empirical epsilon (Steinke et al. 2023).
"""

from __future__ import annotations

import numpy as np

from dpbench.utils.seeding import stream_seed


def model_seed(seed: int, model: int) -> int:
    """Return the run seed of model ``model`` of the run with seed ``seed``."""
    return stream_seed(seed, "mia_model", model)


def membership(seed: int, model: int, pool_size: int) -> np.ndarray:
    """Return the bool mask of the pool examples that train model ``model``."""
    rng = np.random.default_rng(stream_seed(seed, "mia_split", model))
    return rng.random(pool_size) < 0.5


def memberships(seed: int, models: int, pool_size: int) -> np.ndarray:
    """Return the ``(models, pool_size)`` masks of every model of the run."""
    return np.stack([membership(seed, k, pool_size) for k in range(models)])

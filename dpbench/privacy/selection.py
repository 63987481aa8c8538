"""Private selection of a hyper-parameter and the epsilon of search + run (dpbench-tune).

See docs/tuning-and-claims.md, "What the accounted epsilon covers".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpbench.privacy.composition import compose_ledgers


def exponential_mechanism(scores: Sequence[float], epsilon: float, sensitivity: float,
                          rng: np.random.Generator) -> int:
    """Return an index drawn with P(i) proportional to exp(epsilon * score_i / (2 sensitivity)).

    The exponential mechanism (McSherry and Talwar 2007), epsilon-DP for scores of the given
    sensitivity; drawn as Gumbel-max, argmax_i(epsilon s_i / (2 Delta) + G_i) with
    G_i ~ Gumbel(0, 1), which has exactly that distribution.
    """
    logits = np.asarray(scores, dtype=float) * epsilon / (2 * sensitivity)
    return int(np.argmax(logits + rng.gumbel(size=len(logits))))


def search_and_run_epsilon(search_ledger: list[Mapping[str, Any]], selection_epsilon: float,
                           run_ledger: list[Mapping[str, Any]], run_epsilon: float,
                           delta: float, accountant: str) -> float:
    """Return the epsilon of a tuned run: all trials, the selection, then the run itself.

    A fixed, data-independent partition splits the training set into a trial part and a
    validation part. An example of the trial part is in every trial and in the run: adaptive
    composition of all their ledgers. An example of the validation part is in the selection
    (pure ``selection_epsilon``) and in the run: basic composition. The run is as private as
    the worse of the two.
    """
    trials = compose_ledgers([search_ledger, run_ledger], delta, accountant)
    validation = selection_epsilon + run_epsilon if math.isfinite(run_epsilon) else math.inf
    return float(max(trials, validation))

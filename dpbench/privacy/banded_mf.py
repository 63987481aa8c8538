"""Banded Toeplitz strategies for the matrix mechanism and their streaming noise.

Notation of Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization" (BandMF,
arXiv 2306.08153): the workload A (n x n prefix sums, A_ij = 1 for j <= i) factors as
A = B C with C lower-triangular, b-banded and Toeplitz, C_ij = c_(i-j) for 0 <= i-j < b.
The mechanism releases C X + sigma S Z, so the optimiser sees X + C^{-1} sigma S Z: step t's
gradient carries the correlated noise w_t = (C^{-1} Z)_t, computed by the recursion (their
Alg. 9) w_t = (z_t - sum_{j=1}^{b-1} c_j w_{t-j}) / c_0 from the last b - 1 noise vectors.

Strategies (||c||_2 = 1, so C's largest column norm, the per-participation sensitivity of the
amplification theorem, is 1):
- ``sqrt``: the square root of A (Fichtenberger, Henzinger, Upadhyay 2023, Thm 1),
  c_k = binom(2k, k) / 4^k, truncated to b bands and renormalised;
- ``optimal``: c minimising the prefix-sum loss ||A C^{-1}||_F^2 (their Eq. 4 with the
  max-column-norm sensitivity 1) by L-BFGS (``scipy.optimize``) from the ``sqrt`` start.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

STRATEGIES = ("optimal", "sqrt")


def sqrt_coefficients(bands: int) -> np.ndarray:
    """Return binom(2k, k) / 4^k for k < bands, renormalised to unit L2 norm."""
    from scipy.special import comb  # here: every config imports this module, few use it

    k = np.arange(bands)
    coefs = comb(2 * k, k, exact=False) / 4.0**k
    return coefs / np.linalg.norm(coefs)


def _lfilter(b, a, x: np.ndarray) -> np.ndarray:
    """``scipy.signal.lfilter``, imported on first use: scipy.signal is most of a second of
    start-up, and every run imports this module (docs/engine.md, start-up)."""
    from scipy import signal

    return signal.lfilter(b, a, x)


def inverse_coefficients(coefs: np.ndarray, n: int) -> np.ndarray:
    """Return d with C^{-1} = Toeplitz(d) (n x n): the recursion d = C^{-1} e_0 (an IIR filter)."""
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return _lfilter([1.0], np.asarray(coefs, dtype=np.float64), impulse)


def toeplitz_matrix(coefs: np.ndarray, n: int) -> np.ndarray:
    """Return the dense n x n lower-triangular banded Toeplitz matrix of ``coefs``."""
    out = np.zeros((n, n))
    for k, c in enumerate(coefs[:n]):
        out += c * np.eye(n, k=-k)
    return out


def prefix_sum_loss(coefs: np.ndarray, n: int) -> float:
    """Return ||A C^{-1}||_F^2 * max_j ||C e_j||^2 for the n x n prefix-sum workload A.

    A C^{-1} is lower-triangular Toeplitz with coefficients e = cumsum(d), so the Frobenius
    norm is sum_k (n - k) e_k^2 (O(n b) instead of a dense solve).
    """
    coefs = np.asarray(coefs, dtype=np.float64)
    e = np.cumsum(inverse_coefficients(coefs, n))
    return float(np.sum((n - np.arange(n)) * e**2) * np.sum(coefs**2))


def _log_loss_and_grad(x: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    """Return log ||A C^{-1}||_F^2 at c = x / ||x|| and its gradient in x.

    The log keeps L-BFGS's steps in scale (the loss grows like n^2); an unstable C^{-1}
    (the filter's poles outside the unit circle) returns +inf, which the line search backs
    off from.
    """
    norm = np.linalg.norm(x)
    c = x / norm
    with np.errstate(all="ignore"):
        d = inverse_coefficients(c, n)
        weights = n - np.arange(n)
        e = np.cumsum(d)
        loss = float(np.sum(weights * e**2))
        if not np.isfinite(loss) or loss <= 0:
            return math.inf, np.zeros_like(x)
        grad_d = np.cumsum((2.0 * weights * e)[::-1])[::-1]  # dL/dd_k = sum_{i>=k} 2 w_i e_i
        u = _lfilter([1.0], c, grad_d[::-1])[::-1]  # C^{-T} grad_d
    # d(C^{-1} e_0)/dc_j = -C^{-1} S_j d, S_j the shift by j rows
    grad_c = np.array([-np.dot(u[j:], d[: n - j]) for j in range(len(c))])
    grad_x = (grad_c - c * np.dot(c, grad_c)) / norm  # through c = x / ||x||
    return math.log(loss), grad_x / loss


def optimal_coefficients(bands: int, n: int, max_iter: int = 500) -> np.ndarray:
    """Return unit-norm c (b bands) minimising ||A C^{-1}||_F^2 for n steps, by L-BFGS.

    Starts at ``sqrt_coefficients`` and keeps it if the optimiser does not improve on it.
    """
    from scipy import optimize  # only the optimised strategy needs it

    start = sqrt_coefficients(bands)
    if bands == 1:
        return start
    # x = 30 c: L-BFGS's first trial step has unit length, which at ||x|| = 1 would rotate c
    # far into the unstable region; the loss is invariant to ||x||
    result = optimize.minimize(_log_loss_and_grad, 30.0 * start, args=(n,), jac=True,
                               method="L-BFGS-B",
                               options={"maxiter": max_iter, "gtol": 1e-12, "ftol": 1e-13})
    best = np.asarray(result.x) / np.linalg.norm(result.x)
    if best[0] < 0:  # C and -C give the same loss; keep c_0 > 0
        best = -best
    return best if prefix_sum_loss(best, n) <= prefix_sum_loss(start, n) else start


def strategy_coefficients(strategy: str, bands: int, n: int) -> np.ndarray:
    """Return the unit-norm Toeplitz coefficients of ``strategy`` for n steps."""
    if strategy == "sqrt":
        return sqrt_coefficients(bands)
    if strategy == "optimal":
        return optimal_coefficients(bands, n)
    raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")


def amplified_equivalent(sample_rate: float, steps: int, bands: int) -> tuple[float, int]:
    """Return (b q, ceil(T / b)): the DP-SGD that BandMF with cyclic Poisson sampling matches.

    Choquette-Choo et al. 2023, Thm 4: b-banded C with columns of norm <= 1, data split into
    b fixed partitions, step t Poisson-samples partition t mod b at rate b q: as private as
    DP-SGD with the same noise multiplier, rate b q and ceil(T / b) steps.
    """
    return bands * sample_rate, math.ceil(steps / bands)


def expected_error_table(dataset_size: int, batch_size: int, steps: int,
                         epsilons: list[float], bands: list[int], delta: float,
                         accountant: str = "prv") -> list[dict[str, float]]:
    """Return, per (epsilon, b), sigma(b) and sigma(b)^2 ||A C_b^{-1}||_F^2 / T per strategy.

    sigma(b) is calibrated for the amplified DP-SGD equivalent (rate b B / N, ceil(T / b)
    steps); the product is the expected squared error per step of the noisy prefix sums of
    gradients, which the BandMF paper (Sec. 5) minimises over b. It reads no data.
    """
    from dpbench.privacy.calibration import calibrate_noise_multiplier

    rows = []
    for eps in epsilons:
        for b in bands:
            if b * batch_size > dataset_size or b > steps:
                continue
            rate, equivalent_steps = amplified_equivalent(batch_size / dataset_size, steps, b)
            sigma, _ = calibrate_noise_multiplier(eps, delta, rate, equivalent_steps, accountant)
            row = {"epsilon": eps, "bands": b, "sigma": sigma}
            for strategy in STRATEGIES:
                coefs = strategy_coefficients(strategy, b, steps)
                row[strategy] = sigma**2 * prefix_sum_loss(coefs, steps) / steps
            rows.append(row)
    return rows


def noise_memory_bytes(bands: int, numel: int, element_size: int = 4) -> int:
    """Return the bytes the noise recursion keeps: b - 1 past vectors plus the current one."""
    return bands * numel * element_size


class BandedNoiseShaper:
    """Turns i.i.d. Gaussian noise z_t into w_t = (C^{-1} z)_t, one step at a time.

    Keeps the last b - 1 vectors x_t = (C_T^{-1} z)_t of the Toeplitz recursion (memory b x
    params). With ``total_steps`` = n known, C's columns are normalised to unit norm for the
    n x n matrix (only the last b - 1 columns change; C^{-1} = D C_T^{-1} with D the column
    norms, as jax_privacy's ``column_normalize_for_n``). With b = 1 (c = [1]) it returns z_t
    unchanged, so the mechanism is DP-SGD's bit for bit.
    """

    def __init__(self, coefs: np.ndarray, total_steps: int | None = None) -> None:
        self.coefs = [float(c) for c in coefs]
        self.total_steps = total_steps
        self.step = 0
        self.history: list[list[torch.Tensor]] = []  # x_{t-1}, x_{t-2}, ... (at most b - 1)

    @property
    def bands(self) -> int:
        return len(self.coefs)

    def row_scale(self, step: int) -> float:
        """Return the norm of column ``step`` of the n x n Toeplitz C (1 when n is unknown)."""
        if self.total_steps is None or self.total_steps - step >= self.bands:
            return 1.0
        kept = self.coefs[: max(self.total_steps - step, 1)]
        return math.sqrt(sum(c * c for c in kept))

    def __call__(self, noise: list[torch.Tensor]) -> list[torch.Tensor]:
        """Return w_t for this step's noise z_t (one tensor per parameter) and advance."""
        xs, out = [], []
        scale = self.row_scale(self.step)
        for i, z in enumerate(noise):
            x = z
            for j, past in enumerate(self.history, start=1):
                x = x - self.coefs[j] * past[i]
            if self.coefs[0] != 1.0:
                x = x / self.coefs[0]
            xs.append(x)
            out.append(x if scale == 1.0 else x * scale)
        if self.bands > 1:
            self.history = [xs, *self.history][: self.bands - 1]
        self.step += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"coefs": list(self.coefs), "step": self.step,
                "history": [[t.cpu() for t in h] for h in self.history]}

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        if [float(c) for c in state["coefs"]] != self.coefs:
            raise ValueError("the checkpoint's banded strategy differs from this run's")
        self.step = int(state["step"])
        self.history = [[t.to(device) if device is not None else t for t in h]
                        for h in state["history"]]

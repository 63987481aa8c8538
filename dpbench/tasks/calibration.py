"""Calibration of predictive probabilities: NLL, ECE (equal-width bins), Brier score, bins.

ECE follows Guo et al., "On Calibration of Modern Neural Networks" (ICML 2017), eq. 3:
``ECE = sum_k (n_k / n) |acc(B_k) - conf(B_k)|`` over 15 equal-width confidence bins, binned
exactly as torchmetrics' ``multiclass_calibration_error`` (norm l1; a test checks equality):
importing torchmetrics pulls in transformers and matplotlib, seconds of start-up for every
run. The multiclass Brier score is
Brier (1950): ``mean_i sum_c (p_ic - 1[y_i = c])^2``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ECE_BINS = 15


def expected_calibration_error(probs: torch.Tensor, y: torch.Tensor,
                               n_bins: int = ECE_BINS) -> float:
    """Return the top-1 ECE (Guo et al. 2017, eq. 3) of ``probs`` [n, classes] for labels ``y``.

    sum_k (n_k / n) |acc_k - conf_k| = sum_k |sum_{i in B_k} (correct_i - conf_i)| / n, with
    torchmetrics' bins: ``bucketize(conf, linspace(0, 1, n_bins + 1), right=True) - 1``.
    """
    conf, pred = probs.float().max(dim=1)
    if conf.numel() == 0:
        return 0.0
    gap = (pred == y).float() - conf
    edges = torch.linspace(0, 1, n_bins + 1, device=conf.device)
    index = torch.bucketize(conf, edges, right=True) - 1
    per_bin = torch.zeros(n_bins + 1, device=conf.device).scatter_add_(0, index, gap)
    return float(per_bin.abs().sum() / conf.numel())


def brier_score(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Return the multiclass Brier score mean_i sum_c (p_ic - 1[y_i = c])^2 (Brier 1950)."""
    onehot = F.one_hot(y, num_classes=probs.shape[1]).to(probs.dtype)
    return float((probs - onehot).pow(2).sum(dim=1).mean())


def reliability_bins(probs: torch.Tensor, y: torch.Tensor,
                     n_bins: int = ECE_BINS) -> dict[str, list[float]]:
    """Return per-bin mean confidence, accuracy and count of the top-1 prediction.

    Bins are [k/n_bins, (k+1)/n_bins) (the last one closed), as for the ECE; empty bins hold
    NaN confidence and accuracy. Post-processing of the test predictions only.
    """
    conf, pred = probs.max(dim=1)
    correct = (pred == y).to(probs.dtype)
    index = (conf * n_bins).floor().long().clamp(0, n_bins - 1)
    count = torch.zeros(n_bins, dtype=probs.dtype).scatter_add_(0, index, torch.ones_like(conf))
    conf_sum = torch.zeros(n_bins, dtype=probs.dtype).scatter_add_(0, index, conf)
    acc_sum = torch.zeros(n_bins, dtype=probs.dtype).scatter_add_(0, index, correct)
    safe = count.clamp(min=1)
    nan = torch.full_like(count, float("nan"))
    return {
        "confidence": torch.where(count > 0, conf_sum / safe, nan).tolist(),
        "accuracy": torch.where(count > 0, acc_sum / safe, nan).tolist(),
        "count": count.tolist(),
    }


def calibration_metrics(log_probs: torch.Tensor, y: torch.Tensor) -> dict[str, object]:
    """Return NLL, ECE (15 bins), Brier score and the reliability bins of ``log_probs``."""
    probs = log_probs.exp()
    bins = reliability_bins(probs, y)
    return {
        "nll": float(F.nll_loss(log_probs, y)),
        "ece": expected_calibration_error(probs, y),
        "brier": brier_score(probs, y),
        "reliability_confidence": bins["confidence"],
        "reliability_accuracy": bins["accuracy"],
        "reliability_count": bins["count"],
    }

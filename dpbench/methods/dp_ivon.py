"""DP-IVON-Gradsq: IVON on the DP-SGD release with a noise-corrected squared-gradient curvature.

See docs/ivon.md. Per step: sample theta = m + e / sqrt(N (h + delta)) (stage 2),
per-example gradients at theta, clip and add noise (the loop: one Gaussian release, exactly as
DP-SGD), then, as post-processing of the released g_dp:

    v_hat = max(g_dp^2 - sigma^2 C^2 / B^2, 0),   f = N v_hat
    h <- beta2 h + (1-beta2) f + 0.5 (1-beta2)^2 (h - f)^2 / (h + delta)
    g_m <- beta1 g_m + (1-beta1) g_dp
    m <- m - lr (h0 + delta) (g_m / (1 - beta1^t) + delta m) / (h + delta)

sigma^2 C^2 / B^2 is ``ctx.noise_std ** 2`` (the loop's per-coordinate noise variance of g_dp,
with the expected B). Ablations: ``correction=false`` (v_hat = g_dp^2) and ``hess=reparam``
(the naive DP-IVON: IVON's g_dp (theta - m) / sigma_v^2 on the noisy gradient). With
``mc_samples`` S > 1 the per-example gradients of the S samples are averaged before clipping,
so the privacy cost is unchanged.
"""

from __future__ import annotations

import dataclasses

from dpbench.method_settings.dp_ivon import DPIVONSettings
from dpbench.methods import register_method
from dpbench.methods.ivon import IVON

#: IVON's posterior sampling (stage 2) and update (stage 8, evaluation) on the DP release
DP_IVON = register_method(dataclasses.replace(IVON, name="dp_ivon", settings=DPIVONSettings(),
                                              private=True))

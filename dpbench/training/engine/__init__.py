"""The per-example engines behind one protocol (``protocol``; docs/engine.md).

``bookkeeping`` (``bk``: clipped sums from one backward per point, ``rules`` per
layer), ``materialised`` (Opacus ``hooks`` / ``functorch``: per-example gradients), ``ghost``
(Opacus ghost clipping), ``choice`` (what ``trainer.grad_sample_mode`` builds, ``auto``
included) and ``check`` (the per-run check against plain autograd, before any release).
"""

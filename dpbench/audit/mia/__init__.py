"""Membership inference on trained models: the population split, the attacks, their metrics.

``dpbench-mia`` (``cli.py``) trains a target and reference models through the loop on random
halves of a pool and scores members against non-members with LOSS, LiRA and RMIA
(docs/empirical-privacy.md).
"""

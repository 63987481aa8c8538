"""What engine tests share: the single evaluation point theta of most methods."""

from dpbench.methods.base import EvalPoint

#: the protocol's ``points`` for a method that evaluates theta alone (weight 1, no offset)
ONE_POINT = [EvalPoint()]

"""Rank 0's word to the other ranks of a ``torchrun`` job: train, already done, or refused
(docs/distributed.md)."""

from __future__ import annotations

from dpbench.training.distributed import Collective


class StartSignal:
    """Rank 0 tells the other ranks, once, whether to train: GO, DONE (already completed) or
    REFUSED (it stopped before training and said why). A no-op in a 1-process run."""

    GO, DONE, REFUSED = 0, 1, 2

    def __init__(self, collective: Collective) -> None:
        self.collective, self.sent = collective, False

    def send(self, code: int) -> None:
        if self.sent or not self.collective.distributed:
            return
        self.sent = True
        self.collective.bytes_from_main(bytes([code]))

    def receive(self) -> int:
        return self.collective.bytes_from_main(b"")[0]

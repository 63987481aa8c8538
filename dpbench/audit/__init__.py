"""Empirical privacy audits: a lower bound on epsilon from canaries inserted into one run
(``dpbench.audit.bounds``), and membership inference (``dpbench.audit.mia``).

The package imports nothing itself: ``dpbench-audit --help`` and ``dpbench-mia --help`` need
neither scipy nor the training loop."""

"""``python -m dpbench`` is the ``dpbench`` command."""

from dpbench.cli import main

main()

"""``python -m dpbench`` from a folder others can write to: do not import from that folder.

``python -m`` puts the current folder first on ``sys.path`` (the console scripts do not).
Anything there is then importable: a ``hydra_plugins/`` package, which Hydra's plugin
discovery imports module by module on every run, or a ``*.dist-info`` whose entry points name
a module there. ``drop_start_folder`` removes that entry, unless dpbench itself was imported
from it (a checkout run from its root). ``python -P`` (Python 3.11+) does the same for the
whole interpreter. See docs/reliability-bad-input.md.
"""

from __future__ import annotations

import os
import sys


def drop_start_folder() -> bool:
    """Remove the current folder from the front of ``sys.path`` unless the dpbench package
    lives there; return whether it was removed."""
    if not sys.path:
        return False
    first = os.path.abspath(sys.path[0] or os.curdir)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if first != os.path.abspath(os.getcwd()) or first == package_root:
        return False
    del sys.path[0]
    return True

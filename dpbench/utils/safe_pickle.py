"""Read pickled data files (CIFAR's ``data_batch`` format) without running their code.

``pickle.load`` calls whatever a file names, so an outside file could run code. This
unpickler builds only plain containers, numbers, strings and NumPy arrays: it resolves the
few NumPy globals an array needs and refuses every other global with a one-line error.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

#: the only globals a pickled NumPy array needs (numpy 1.x and 2.x module names)
ALLOWED_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),  # protocol 2 stores an array's bytes as a latin-1 string
})


class UnsafePickleError(pickle.UnpicklingError):
    """The file names a global outside ``ALLOWED_GLOBALS``; nothing of it was run."""


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickleError(f"refusing to unpickle {module}.{name}: only NumPy arrays, "
                                "numbers, strings and containers are read")


def load_arrays(path: str | Path, encoding: str = "latin1") -> Any:
    """Return the object pickled in ``path``, built from the allow-listed types only."""
    with open(path, "rb") as f:
        return _ArraysOnly(f, encoding=encoding).load()

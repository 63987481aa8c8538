"""Atomic checkpoints holding every piece of state a resumed run needs, loaded without pickle code.

A checkpoint holds only tensors, numbers, strings, ``None`` and lists/tuples/dicts of them
(``to_plain`` converts the one NumPy value dpbench keeps, the global RNG state, and refuses
anything else at save time). Loading uses ``torch.load(weights_only=True)``: PyTorch's
restricted unpickler builds those types and nothing else, so a crafted ``checkpoint.pt`` (or a
results folder someone shared) cannot run code, and it is read before the fingerprint check
without risk. ``SAFE_GLOBALS`` is the explicit allow-list beyond PyTorch's defaults (empty:
dpbench saves no other type).
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpbench.errors import DPBenchError
from dpbench.utils.mac import write_authenticated
from dpbench.utils.safe_json import UnsafeFile, read_bytes

CHECKPOINT_NAME = "checkpoint.pt"
#: the largest checkpoint a run reads back (weights, optimiser state and RNG states)
MAX_CHECKPOINT_BYTES = 16 * 2**30
#: types a checkpoint may hold beyond PyTorch's weights-only defaults (tensors, containers)
SAFE_GLOBALS: list[Any] = []
_PLAIN = (torch.Tensor, torch.Size, int, float, str, bool, bytes, type(None))


class CheckpointError(DPBenchError):
    """A checkpoint cannot be read: unreadable, corrupt or truncated, or holds unsafe objects."""


def rng_state() -> dict[str, Any]:
    """Return the global RNG states as plain values (the NumPy key array as an int64 tensor)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"bit_generator": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss),
                       "cached_gaussian": float(cached)},
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    npy = state["numpy"]
    np.random.set_state((npy["bit_generator"], npy["keys"].numpy().astype(np.uint32),
                         npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def to_plain(obj: Any, where: str = "state") -> Any:
    """Return ``obj`` with NumPy scalars as Python numbers; raise TypeError on any other type.

    Only what ``torch.load(weights_only=True)`` rebuilds may go into a checkpoint.
    """
    if isinstance(obj, dict):
        return {k: to_plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, _PLAIN):
        return obj
    raise TypeError(f"checkpoint {where} is a {type(obj).__name__}: save tensors, numbers, "
                    "strings and lists/dicts of them (state_dict() of the owning object)")


def state_bytes(state: dict[str, Any]) -> bytes:
    """Return ``state`` serialised as a checkpoint is (plain values only, see ``to_plain``)."""
    buffer = io.BytesIO()
    torch.save(to_plain(state), buffer)
    return buffer.getvalue()


def state_from_bytes(data: bytes) -> dict[str, Any]:
    """Return the state ``state_bytes`` wrote, loaded without running code (weights only)."""
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (a kill leaves the previous checkpoint intact)."""
    write_authenticated(path, state_bytes(state))


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """Return the checkpoint at ``path`` (None if there is none), loaded without running code.

    Raise CheckpointError (one line) if it cannot be read, is corrupt or truncated, or holds
    objects outside the allow-list (a pickle payload is refused, never run).
    """
    data = read_checkpoint_bytes(path)
    return None if data is None else load_checkpoint_bytes(data, path)


def read_checkpoint_bytes(path: Path) -> bytes | None:
    """Return the bytes of the regular file ``path`` (None if there is none): never through a
    link, never blocking on a FIFO or device, at most ``MAX_CHECKPOINT_BYTES``."""
    try:
        return read_bytes(path, MAX_CHECKPOINT_BYTES, follow_links=False)
    except FileNotFoundError:
        return None
    except UnsafeFile as err:
        raise CheckpointError(f"cannot resume from the checkpoint: {err}; move it away to "
                              "start afresh") from None
    except OSError as err:
        raise CheckpointError(f"cannot read the checkpoint {path}: {err.strerror or err} "
                              "(a link or unreadable file); move it away to start afresh"
                              ) from None


def load_checkpoint_bytes(data: bytes, path: Path) -> dict[str, Any]:
    """Return the checkpoint in ``data`` (read from ``path``), loaded without running code;
    CheckpointError (one line) naming ``path`` if it is corrupt or holds unsafe objects."""
    try:
        state = state_from_bytes(data)
    except Exception as err:  # noqa: BLE001 - torch raises many types on a damaged file
        refused = next((line.strip() for line in str(err).splitlines() if "GLOBAL" in line),
                       None)
        if refused is not None:
            raise CheckpointError(
                f"refusing to load {path}: it holds Python objects outside dpbench's allow-list "
                f"({refused.rstrip('.')}); another program (or an older dpbench) wrote it, and "
                "loading it could run code") from None
        raise CheckpointError(f"the checkpoint {path} is corrupt or truncated "
                              f"({type(err).__name__}); delete it or use a new "
                              "hydra.run.dir") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"the checkpoint {path} is not a dpbench checkpoint (it holds a "
                              f"{type(state).__name__}, not a dict)")
    return state

"""CIFAR-100 through torchvision (FIBER's fine-tuning benchmark): users' machines only.

No small offline copy exists (docs/data.md), so the builder reads torchvision's layout under
``paths.data_root`` (``cifar-100-python``) or downloads it when ``download`` is true, and
otherwise raises a ``DataError`` that says where it looked. Normalisation uses fixed public
constants (the usual CIFAR-100 channel statistics), never statistics of the private data.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import TaskData, resolve_data_root, subset_indices
from dpbench.errors import DataError
from dpbench.utils.safe_pickle import UnsafePickleError, load_arrays

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


def _normalise(x_uint8: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CIFAR100_MEAN).view(-1, 1, 1)
    std = torch.tensor(CIFAR100_STD).view(-1, 1, 1)
    return (x_uint8.float() / 255.0 - mean) / std


def _load_split(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (uint8 images [N, 3, 32, 32], fine labels) of ``split`` read without pickle code."""
    batch = load_arrays(folder / split)
    x = torch.as_tensor(np.asarray(batch["data"], dtype=np.uint8)).reshape(-1, 3, 32, 32)
    return x.contiguous(), torch.as_tensor(batch["fine_labels"], dtype=torch.long)


def _ensure_files(target: Path, download: bool) -> Path:
    """Return the ``cifar-100-python`` folder under ``target``, downloading it if allowed."""
    from torchvision.datasets import CIFAR100
    from torchvision.datasets.utils import check_integrity, download_and_extract_archive

    folder = target / CIFAR100.base_folder
    files = [*CIFAR100.train_list, *CIFAR100.test_list]
    present = all((folder / name).is_file() for name, _ in files)
    if not present and download:
        try:
            download_and_extract_archive(CIFAR100.url, str(target), filename=CIFAR100.filename,
                                         md5=CIFAR100.tgz_md5)
        except OSError as err:  # no network
            raise DataError(f"CIFAR-100 is not under {target} and could not be downloaded "
                            f"({err}); this preset is for machines with internet access or "
                            "a local copy (paths.data_root)") from err
    if not all((folder / name).is_file() for name, _ in files):
        raise DataError(f"CIFAR-100 not found under {target} and dataset.download is false; "
                        "set paths.data_root to a folder holding cifar-100-python")
    if download and not all(check_integrity(str(folder / name), md5) for name, md5 in files):
        raise DataError(f"CIFAR-100 under {target} is corrupt after the download; remove it "
                        "and retry")
    return folder


@register_dataset("cifar100")
def build_cifar100(root=None, download: bool = True, train_subset: int | None = None) -> TaskData:
    """Return CIFAR-100 (50000/10000, official split) normalised with public constants.

    The batch files are pickles: they are read with an unpickler that builds NumPy arrays
    and containers only (``dpbench.utils.safe_pickle``), never with ``pickle.load``.
    """
    root = resolve_data_root(root)
    target = Path(root) if root is not None else Path.home() / ".cache" / "dpbench" / "data"
    folder = _ensure_files(target, download)
    try:
        (xtr, ytr), (xte, yte) = _load_split(folder, "train"), _load_split(folder, "test")
        meta = load_arrays(folder / "meta") if (folder / "meta").is_file() else {}
    except UnsafePickleError as err:
        raise DataError(f"CIFAR-100 under {folder}: {err}") from None
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError) as err:
        raise DataError(f"CIFAR-100 under {folder} is corrupt or truncated "
                        f"({type(err).__name__}: {err}); remove it and retry") from None
    classes = list(meta.get("fine_label_names") or [str(i) for i in range(100)])
    keep = subset_indices(len(ytr), train_subset)
    notes = [f"training on a fixed subset of {len(keep)} examples"] if train_subset else []
    return TaskData(name="cifar100", task="classification",
                    train=TensorDataset(_normalise(xtr[keep]), ytr[keep]),
                    test=TensorDataset(_normalise(xte), yte), num_classes=100,
                    input_shape=(3, 32, 32), class_names=classes, notes=notes)

"""CIFAR-100 through torchvision (FIBER's fine-tuning benchmark): users' machines only.

No small offline copy exists (docs/data.md), so the builder reads torchvision's layout under
``paths.data_root`` (``cifar-100-python``) or downloads it when ``download`` is true, and
otherwise raises a ``DataError`` that says where it looked. Normalisation uses fixed public
constants (the usual CIFAR-100 channel statistics), never statistics of the private data.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import TaskData, resolve_data_root, subset_indices
from dpbench.errors import DataError

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


def _normalise(x_uint8: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CIFAR100_MEAN).view(-1, 1, 1)
    std = torch.tensor(CIFAR100_STD).view(-1, 1, 1)
    return (x_uint8.float() / 255.0 - mean) / std


@register_dataset("cifar100")
def build_cifar100(root=None, download: bool = True, train_subset: int | None = None,
                   **_: object) -> TaskData:
    """Return CIFAR-100 (50000/10000, official split) normalised with public constants."""
    from torchvision.datasets import CIFAR100

    root = resolve_data_root(root)
    target = root if root is not None else Path.home() / ".cache" / "dpbench" / "data"
    splits = []
    for train in (True, False):
        try:
            ds = CIFAR100(str(target), train=train, download=download)
        except RuntimeError as err:  # "Dataset not found or corrupted"
            if download:  # downloaded, but the archive failed its checksum
                raise DataError(f"CIFAR-100 under {target} is corrupt after the download "
                                f"({err}); remove it and retry") from err
            raise DataError(f"CIFAR-100 not found under {target} and dataset.download is "
                            "false; set paths.data_root to a folder holding "
                            "cifar-100-python") from err
        except OSError as err:  # no network
            raise DataError(f"CIFAR-100 is not under {target} and could not be downloaded "
                            f"({err}); this preset is for machines "
                            "with internet access or a local copy (paths.data_root)") from err
        x = torch.as_tensor(ds.data).permute(0, 3, 1, 2).contiguous()
        splits.append((x, torch.as_tensor(ds.targets, dtype=torch.long), ds.classes))
    (xtr, ytr, classes), (xte, yte, _) = splits
    keep = subset_indices(len(ytr), train_subset)
    notes = [f"training on a fixed subset of {len(keep)} examples"] if train_subset else []
    return TaskData(name="cifar100", task="classification",
                    train=TensorDataset(_normalise(xtr[keep]), ytr[keep]),
                    test=TensorDataset(_normalise(xte), yte), num_classes=100,
                    input_shape=(3, 32, 32), class_names=list(classes), notes=notes)

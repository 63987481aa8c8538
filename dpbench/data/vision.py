"""MNIST, Fashion-MNIST and CIFAR-10 through torchvision, with offline fallbacks.

Order of preference for each data set, given ``root`` (``paths.data_root``):
1. torchvision's own layout under root (``MNIST/raw``, ``FashionMNIST/raw``,
   ``cifar-10-batches-py``): the official train/test split;
2. the small offline copies of docs/data.md (MNIST 10k test set, 1000 Fashion-MNIST
   images, CIFAR-10 test JPEGs): a fixed 80/20 split of what is there, recorded in the run's
   ``data_notes``;
3. torchvision's download (users' machines) when ``download`` is true.
Normalisation uses fixed public constants, never statistics of the private data.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import (
    TaskData,
    fixed_split,
    read_failed,
    resolve_data_root,
    subset_indices,
)
from dpbench.errors import DataError

log = logging.getLogger(__name__)

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
FMNIST_MEAN, FMNIST_STD = 0.2860, 0.3530
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]
FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot"]


def _normalise(x_uint8: torch.Tensor, mean, std) -> torch.Tensor:
    x = x_uint8.float() / 255.0
    mean_t = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return (x - mean_t) / std_t


def _torchvision_split(cls, root: Path | None, download: bool):
    """Return ((x_train, y_train), (x_test, y_test)) as uint8/long tensors, or None."""
    if root is None and not download:
        return None
    target = root if root is not None else Path.home() / ".cache" / "dpbench" / "data"
    try:
        out = []
        for train in (True, False):
            ds = cls(str(target), train=train, download=download)
            data = ds.data if isinstance(ds.data, torch.Tensor) else torch.as_tensor(ds.data)
            out.append((data, torch.as_tensor(ds.targets, dtype=torch.long)))
        return out
    except RuntimeError as err:  # "Dataset not found or corrupted", or "Error downloading"
        if download:
            raise DataError(
                f"{cls.__name__} is not under {target} and the download failed ({err}); "
                "check the network, or set paths.data_root (or DPBENCH_DATA_ROOT) to a folder "
                "that holds it") from err
        log.info("torchvision %s not found under %s: %s", cls.__name__, target, err)
        return None
    except OSError as err:  # no network
        raise DataError(
            f"{cls.__name__} is not under {target} and could not be downloaded ({err}); "
            "set paths.data_root (or DPBENCH_DATA_ROOT) to a folder that holds it"
        ) from err


def _read_idx_gz(path: Path) -> torch.Tensor:
    from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

    try:
        with tempfile.NamedTemporaryFile(suffix=".idx") as tmp:
            with gzip.open(path, "rb") as src:
                shutil.copyfileobj(src, tmp)
            tmp.flush()
            return read_sn3_pascalvincent_tensor(tmp.name, strict=False)
    except (OSError, EOFError, ValueError, RuntimeError) as err:
        raise read_failed(path, err) from err


def _fallback(x: torch.Tensor, y: torch.Tensor, what: str):
    tr, te = fixed_split(len(y), 0.8)
    note = (f"{what}: the official training set is absent, so this run trains on a fixed "
            f"80% split ({len(tr)} examples) and tests on the other {len(te)}")
    log.warning(note)
    return (x[tr], y[tr]), (x[te], y[te]), note


def _task(name, train, test, mean, std, classes, notes, train_subset):
    (xtr, ytr), (xte, yte) = train, test
    if xtr.dim() == 3:
        xtr, xte = xtr.unsqueeze(1), xte.unsqueeze(1)
    keep = subset_indices(len(ytr), train_subset)
    xtr, ytr = xtr[keep], ytr[keep]
    if train_subset is not None:
        notes = notes + [f"training on a fixed subset of {len(ytr)} examples"]
    return TaskData(
        name=name, task="classification",
        train=TensorDataset(_normalise(xtr, mean, std), ytr),
        test=TensorDataset(_normalise(xte, mean, std), yte),
        num_classes=len(classes), input_shape=tuple(xtr.shape[1:]), class_names=classes,
        notes=notes,
    )


def _missing(name: str, root: Path | None) -> DataError:
    where = f"under {root}" if root else "(no data root set)"
    return DataError(f"{name} not found {where} and download is off; set paths.data_root "
                     "(or DPBENCH_DATA_ROOT) or allow dataset.download=true")


@register_dataset("mnist")
def build_mnist(root=None, download: bool = True, train_subset: int | None = None) -> TaskData:
    """Return MNIST normalised with the public constants (0.1307, 0.3081)."""
    from torchvision.datasets import MNIST

    root = resolve_data_root(root)
    notes: list[str] = []
    split = _torchvision_split(MNIST, root, download=False)
    if split is None and root is not None and (root / "mnist").is_dir():
        x = _read_idx_gz(root / "mnist" / "t10k-images-idx3-ubyte.gz")
        y = _read_idx_gz(root / "mnist" / "t10k-labels-idx1-ubyte.gz").long()
        if len(x) != len(y):
            raise DataError(f"MNIST under {root}: {len(x)} images but {len(y)} labels")
        tr, te, note = _fallback(x, y, "MNIST")
        split, notes = (tr, te), [note]
    if split is None and download:
        split = _torchvision_split(MNIST, root, download=True)
    if split is None:
        raise _missing("MNIST", root)
    return _task("mnist", split[0], split[1], (MNIST_MEAN,), (MNIST_STD,),
                 [str(i) for i in range(10)], notes, train_subset)


@register_dataset("fashion_mnist")
def build_fashion_mnist(root=None, download: bool = True,
                        train_subset: int | None = None) -> TaskData:
    """Return Fashion-MNIST normalised with the public constants (0.2860, 0.3530)."""
    from torchvision.datasets import FashionMNIST

    root = resolve_data_root(root)
    notes: list[str] = []
    split = _torchvision_split(FashionMNIST, root, download=False)
    csv = root / "fashion-mnist" / "fashion-mnist_test.csv" if root else None
    if split is None and csv is not None and csv.is_file():
        import pandas as pd

        try:
            frame = pd.read_csv(csv)
            y = torch.tensor(frame["label"].to_numpy(), dtype=torch.long)
            pixels = frame.drop(columns="label").to_numpy(dtype=np.uint8)
            x = torch.from_numpy(pixels.reshape(-1, 28, 28).copy())
        except Exception as err:
            raise read_failed(csv, err) from err
        tr, te, note = _fallback(x, y, "Fashion-MNIST (1000-image CSV cut)")
        split, notes = (tr, te), [note]
    if split is None and download:
        split = _torchvision_split(FashionMNIST, root, download=True)
    if split is None:
        raise _missing("Fashion-MNIST", root)
    return _task("fashion_mnist", split[0], split[1], (FMNIST_MEAN,), (FMNIST_STD,),
                 FMNIST_CLASSES, notes, train_subset)


def _read_cifar_jpegs(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from PIL import Image

    images, labels = [], []
    try:
        with tarfile.open(path) as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
            for m in members:
                label = CIFAR10_CLASSES.index(m.name.split("/")[-2])
                with Image.open(tar.extractfile(m)) as img:
                    images.append(np.asarray(img.convert("RGB")))
                labels.append(label)
    except (OSError, EOFError, tarfile.TarError, ValueError) as err:
        raise read_failed(path, err) from err
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    return x, torch.tensor(labels, dtype=torch.long)


@register_dataset("cifar10")
def build_cifar10(root=None, download: bool = True, train_subset: int | None = None) -> TaskData:
    """Return CIFAR-10 normalised with the public per-channel constants."""
    from torchvision.datasets import CIFAR10

    root = resolve_data_root(root)
    notes: list[str] = []
    split = _torchvision_split(CIFAR10, root, download=False)
    if split is not None:
        split = [(x.permute(0, 3, 1, 2).contiguous(), y) for x, y in split]
    tar = root / "cifar10" / "cifar10-test-jpg.tar.gz" if root else None
    if split is None and tar is not None and tar.is_file():
        x, y = _read_cifar_jpegs(tar)
        tr, te, note = _fallback(x, y, "CIFAR-10 (test-set JPEGs)")
        split, notes = (tr, te), [note]
    if split is None and download:
        split = _torchvision_split(CIFAR10, root, download=True)
        if split is not None:
            split = [(x.permute(0, 3, 1, 2).contiguous(), y) for x, y in split]
    if split is None:
        raise _missing("CIFAR-10", root)
    return _task("cifar10", split[0], split[1], CIFAR10_MEAN, CIFAR10_STD, CIFAR10_CLASSES,
                 notes, train_subset)

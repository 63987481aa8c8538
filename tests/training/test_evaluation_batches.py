"""``batches.evaluation_batches``: an evaluation reads the very batches ``DataLoader`` yields.

Slicing a ``TensorDataset``'s tensors (through any ``Subset``s) must give exactly the tensors
the loader's example-by-example fetch and ``default_collate`` give, batch by batch: the
same values, dtypes and shapes, in order, re-iterable.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from dpbench.training.batches import SlicedBatches, evaluation_batches, tensor_rows


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(37, 1, 3, 3, generator=g),
                         torch.randint(0, 5, (37,), generator=g),
                         torch.arange(37, dtype=torch.float64))


@pytest.mark.parametrize("view", ["tensors", "subset", "subset_of_subset", "empty"])
@pytest.mark.parametrize("size", [1, 8, 37, 64])
def test_sliced_batches_are_the_loaders_batches(view, size):
    data = _data()
    dataset = {"tensors": data, "subset": Subset(data, [5, 3, 30, 0, 7, 7, 12]),
               "subset_of_subset": Subset(Subset(data, list(range(36, 0, -2))), [4, 0, 9, 2]),
               "empty": Subset(data, [])}[view]
    ours = evaluation_batches(dataset, size)
    assert isinstance(ours, SlicedBatches)
    theirs = list(DataLoader(dataset, batch_size=size)) if len(dataset) else []
    for _ in range(2):  # re-iterable
        mine = list(ours)
        assert len(mine) == len(theirs) == len(ours)
        for a, b in zip(mine, theirs):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def test_other_data_sets_keep_their_loader():
    class Listed(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return torch.tensor([float(i)]), i

    assert tensor_rows(Listed()) is None
    assert isinstance(evaluation_batches(Listed(), 2), DataLoader)

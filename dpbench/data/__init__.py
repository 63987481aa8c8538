"""Data set registry: ``@register_dataset("name")`` builders return a :class:`TaskData`."""

from __future__ import annotations

from dpbench.data.base import TaskData, fixed_split, resolve_data_root
from dpbench.registry import Registry

DATASETS: Registry = Registry("dataset", entry_point_group="dpbench.datasets",
                              builtin_package=__name__, config_group="dataset", framework_keys=())
register_dataset = DATASETS.register
get_dataset_builder = DATASETS.get
dataset_names = DATASETS.names

__all__ = ["DATASETS", "TaskData", "dataset_names", "fixed_split", "get_dataset_builder",
           "register_dataset", "resolve_data_root"]

"""Data set registry: ``@register_dataset("name")`` builders return a :class:`TaskData`."""

from __future__ import annotations

from dpbench.data.base import TaskData, fixed_split, resolve_data_root
from dpbench.data.users import USER_KEYS
from dpbench.registry import Registry

#: the user partition's keys (``data/users.py``) are the framework's: no builder receives them
DATASETS: Registry = Registry("dataset", entry_point_group="dpbench.datasets",
                              builtin_package=__name__, config_group="dataset",
                              framework_keys=USER_KEYS)
register_dataset = DATASETS.register
get_dataset_builder = DATASETS.get
dataset_names = DATASETS.names

__all__ = ["DATASETS", "TaskData", "dataset_names", "fixed_split", "get_dataset_builder",
           "register_dataset", "resolve_data_root"]

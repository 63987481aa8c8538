"""Task registry: a task gives the loop its per-example loss and evaluation metrics."""

from __future__ import annotations

from dpbench.registry import Registry
from dpbench.tasks.base import Task

TASKS: Registry = Registry("task", entry_point_group="dpbench.tasks", builtin_package=__name__)
register_task = TASKS.register
get_task = TASKS.get

__all__ = ["TASKS", "Task", "get_task", "register_task"]

"""``experiment.load_data``: a data set of tensors is read once per process for one setting.

A sweep's seeds and an MIA cell's models of one data set share its read-only tensors; each
call still gets its own ``TaskData`` (lists, ``extras``), so what one run adds (its users)
never reaches another, and other settings load their own data.
"""

from __future__ import annotations

from dpbench.experiment import load_data
from tests.helpers.config import compose_config


def test_one_setting_reads_the_tensors_once_and_each_run_gets_its_own_record():
    first, second = (load_data(compose_config("seed=0")), load_data(compose_config("seed=1")))
    assert first is not second
    assert first.train.tensors[0] is second.train.tensors[0]  # the same read-only tensors
    assert first.test.tensors[1] is second.test.tensors[1]
    first.extras["users"] = "mine"
    first.notes.append("a note")
    assert "users" not in second.extras and not second.notes
    other = load_data(compose_config("dataset.train_fraction=0.5"))
    assert len(other.train) != len(first.train)  # another setting: its own data
    assert other.train.tensors[0] is not first.train.tensors[0]

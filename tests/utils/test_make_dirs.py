"""``utils.io.make_dirs``: the folders a command creates, and a race with another process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpbench.utils.io import make_dirs, remove_created


def test_returns_the_folders_it_created_top_first(tmp_path):
    created = make_dirs(tmp_path / "a" / "b" / "c")
    assert created == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    remove_created(created)
    assert not (tmp_path / "a").exists()


def test_a_folder_made_meanwhile_by_another_process_is_used_not_claimed(tmp_path, monkeypatch):
    """Every torchrun rank creates the same run folder: the one that loses the race to a
    folder must go on (not exit 'File exists') and must not count it as its own."""
    target = tmp_path / "run" / "two"
    real_mkdir = Path.mkdir

    def racing_mkdir(self, *args, **kwargs):
        if self == target:
            real_mkdir(self)  # the other rank got there between the probe and our mkdir
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    created = make_dirs(target)
    assert target.is_dir()
    assert created == [tmp_path / "run"]


def test_a_planted_link_in_the_race_is_refused(tmp_path, monkeypatch):
    target, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    real_mkdir = Path.mkdir

    def planting_mkdir(self, *args, **kwargs):
        if self == target:
            os.symlink(elsewhere, target)
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", planting_mkdir)
    with pytest.raises(FileExistsError):
        make_dirs(target / "inner")

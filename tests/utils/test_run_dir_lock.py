"""The run-folder lock (``dpbench.utils.lock``, on filelock): exclusive, its holder's PID in the
message, a planted link refused without touching its target, only its own file removed."""

from __future__ import annotations

import os

import pytest

from dpbench.utils.lock import LOCK_NAME, RunDirBusy, RunDirLock


def test_a_second_lock_names_the_holder_and_the_file_goes_on_release(tmp_path):
    with RunDirLock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text() == str(os.getpid())
        with pytest.raises(RunDirBusy, match=rf"{tmp_path} is in use by another dpbench run "
                                             rf"\(pid {os.getpid()}\); wait for it"):
            RunDirLock(tmp_path).acquire()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target", ["victim", "missing"])
def test_a_planted_link_is_refused_and_its_target_untouched(tmp_path, target):
    victim = tmp_path / target
    if target == "victim":
        victim.write_text("years of work")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_NAME).symlink_to(victim)
    with pytest.raises(RunDirBusy, match="is a symbolic link, not a dpbench lock; remove it"):
        RunDirLock(run_dir).acquire()
    assert (run_dir / LOCK_NAME).is_symlink()  # not the lock's to delete
    if target == "victim":
        assert victim.read_text() == "years of work"
    else:
        assert not victim.exists()  # a dangling link creates nothing


def test_a_stale_lock_file_is_taken_over(tmp_path):
    (tmp_path / LOCK_NAME).write_text("999999")  # left by a process that is gone
    with RunDirLock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text() == str(os.getpid())
    assert not (tmp_path / LOCK_NAME).exists()


def test_release_removes_only_the_file_it_locked(tmp_path):
    lock = RunDirLock(tmp_path).acquire()
    (tmp_path / LOCK_NAME).unlink()
    (tmp_path / LOCK_NAME).write_text("someone else's")
    lock.release()
    lock.release()  # idempotent
    assert (tmp_path / LOCK_NAME).read_text() == "someone else's"

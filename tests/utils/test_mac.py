"""``utils.mac``: a file and its sidecar MAC are two renames; a kill between them must leave a
pair that verifies, and nothing else may verify."""

from __future__ import annotations

import pytest

from dpbench.utils import mac
from dpbench.utils.mac import Unauthenticated, mac_of, verify_mac, write_authenticated


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("DPBENCH_MAC_KEY", "k" * 32)


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs."""


def _kill_at_write(monkeypatch, n: int) -> None:
    """Make the n-th atomic write (1-based) of ``write_authenticated`` never happen."""
    real, calls = mac.atomic_write_bytes, []

    def dying(path, data, durable=True):
        calls.append(path)
        if len(calls) == n:
            raise _Killed
        real(path, data, durable=durable)

    monkeypatch.setattr(mac, "atomic_write_bytes", dying)


@pytest.mark.parametrize("killed_at", [1, 2, 3], ids=["before-sidecar", "before-file",
                                                       "before-last-sidecar"])
def test_a_kill_at_any_write_leaves_a_file_that_verifies(tmp_path, monkeypatch, killed_at):
    path = tmp_path / "checkpoint.pt"
    write_authenticated(path, b"step 1")
    _kill_at_write(monkeypatch, killed_at)
    with pytest.raises(_Killed):
        write_authenticated(path, b"step 2")
    data = path.read_bytes()
    assert data == (b"step 1" if killed_at <= 2 else b"step 2")
    verify_mac(path, data, "the checkpoint")


def test_the_first_write_killed_before_the_file_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    _kill_at_write(monkeypatch, 2)
    with pytest.raises(_Killed):
        write_authenticated(path, b"step 1")
    assert not path.exists()  # a resume starts afresh; nothing unauthenticated is left


def test_after_a_whole_write_only_the_new_bytes_verify(tmp_path):
    path = tmp_path / "checkpoint.pt"
    write_authenticated(path, b"step 1")
    write_authenticated(path, b"step 2")
    assert path.with_name("checkpoint.pt.mac").read_text() == mac_of(b"step 2") + "\n"
    verify_mac(path, b"step 2", "the checkpoint")
    with pytest.raises(Unauthenticated, match="does not match"):
        verify_mac(path, b"step 1", "the checkpoint")  # the previous bytes: refused again


def test_an_edited_file_or_a_foreign_line_does_not_verify(tmp_path):
    path = tmp_path / "results.json"
    write_authenticated(path, b"epsilon 3")
    with pytest.raises(Unauthenticated, match="does not match"):
        verify_mac(path, b"epsilon 0", "the record")
    sidecar = path.with_name("results.json.mac")
    sidecar.write_text(mac_of(b"epsilon 3") + "\n" + mac_of(b"epsilon 0", b"x" * 32) + "\n")
    with pytest.raises(Unauthenticated, match="does not match"):
        verify_mac(path, b"epsilon 0", "the record")  # a MAC under another key
    sidecar.write_text("\n".join([mac_of(b"a"), mac_of(b"b"), mac_of(b"epsilon 0")]) + "\n")
    with pytest.raises(Unauthenticated, match="does not match"):
        verify_mac(path, b"epsilon 0", "the record")  # only two lines are read


def test_only_the_writes_a_crash_needs_are_forced_to_disk(tmp_path, monkeypatch):
    """A replacing write forces the sidecar naming both MACs and the file to disk, not the
    sidecar's last rewrite (its loss leaves the sidecar naming both); a write of a record the
    run supersedes (``durable=False``) forces nothing."""
    real, forced = mac.atomic_write_bytes, []

    def counted(path, data, durable=True):
        forced.append(durable)
        real(path, data, durable=durable)

    monkeypatch.setattr(mac, "atomic_write_bytes", counted)
    path = tmp_path / "record.json"
    mac.write_authenticated(path, b"first")
    mac.write_authenticated(path, b"second")
    assert forced == [True, True, True, True, False]
    forced.clear()
    mac.write_authenticated(path, b"running", durable=False)
    assert forced == [False, False, False]
    assert path.read_bytes() == b"running"
    verify_mac(path, b"running", "the record")

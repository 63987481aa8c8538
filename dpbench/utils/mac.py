"""Authenticate what a run resumes: HMAC-SHA256 of a file's bytes with a per-user key.

A checkpoint and a results.json are written with a sidecar ``<name>.mac`` holding
``hmac-sha256:<hex>`` of the file's exact bytes (RFC 2104, Python's ``hmac``). The key lives
outside every shared folder:

- ``DPBENCH_MAC_KEY``: the key itself (e.g. set by a cluster's job environment), or
- ``DPBENCH_MAC_KEY_FILE``: a file holding it, or by default
- ``$XDG_CONFIG_HOME/dpbench/mac.key`` (``~/.config/dpbench/mac.key``), created on first use
  with 32 random bytes and permissions 0600.

A key file that others may read or write is refused. The key is the user's, never a run's: a
console script calls ``freeze_key`` at start-up, before Hydra composes, and from then on the
key read there is used whatever a job's environment says later (and the command-line guard
refuses any ``hydra.job.env_set`` of these variables). ``trainer.resume=true`` resumes only a
file whose MAC verifies with this key (docs/reliability-bad-input.md, "Trust model").

A file and its sidecar are two renames, so a kill between them must not leave a pair that
fails: ``write_authenticated`` first writes a sidecar naming the new bytes' MAC and the
previous one, then replaces the file, then drops the previous MAC; a sidecar of at most two
lines verifies if either line matches.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from dpbench.errors import ConfigError
from dpbench.utils.io import atomic_write_bytes

log = logging.getLogger(__name__)

KEY_ENV, KEY_FILE_ENV = "DPBENCH_MAC_KEY", "DPBENCH_MAC_KEY_FILE"
MAC_SUFFIX = ".mac"
_PREFIX = "hmac-sha256:"
#: a sidecar is at most two short lines (the new MAC and, while a file is replaced, the
#: previous one); anything larger is not one
_MAX_MAC_BYTES = 256
_MAX_MAC_LINES = 2


class Unauthenticated(ConfigError):
    """A file to resume has no MAC, or one that does not verify with this user's key."""


#: the key read at start-up (``freeze_key``): its bytes, or the ConfigError reading it gave
_FROZEN: bytes | ConfigError | None = None


def default_key_path() -> Path:
    """Return ``$XDG_CONFIG_HOME/dpbench/mac.key`` (``~/.config`` when unset)."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "dpbench" / "mac.key"


def freeze_key(create: bool = True) -> bytes:
    """Read this user's MAC key once, now (a console script's start, before Hydra composes
    or a job's ``env_set`` runs), and use it for the rest of the process; ConfigError (one
    line naming the variable and the cause) when there is no usable key."""
    global _FROZEN
    try:
        _FROZEN = _read_key(create)
    except ConfigError as err:
        _FROZEN = err
        raise
    return _FROZEN


def thaw_key() -> None:
    """Forget the key ``freeze_key`` read: the next ``mac_key`` reads the environment again.
    For in-process callers that run several console scripts' mains in one process (tests);
    a console script freezes once and never thaws."""
    global _FROZEN
    _FROZEN = None


def _read_key_file(path: Path, create: bool) -> bytes:
    """Return the key in ``path``, creating it (0600, 32 random bytes) if allowed and absent."""
    if create and not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as err:
            raise ConfigError(f"XDG_CONFIG_HOME: cannot create the folder of the MAC key "
                              f"{path.parent} ({err.strerror or err}); set XDG_CONFIG_HOME to a "
                              f"folder you can write, or {KEY_ENV} / {KEY_FILE_ENV}") from None
        # written whole under a temporary name, then linked: a concurrent reader never sees
        # an empty key, and of two processes creating it one wins (the other reads it)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as err:
            raise ConfigError(f"XDG_CONFIG_HOME: cannot create the MAC key {path} "
                              f"({err.strerror or err})") from None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process created it first: read theirs
        finally:
            tmp.unlink(missing_ok=True)
    try:
        # never blocks: a FIFO in place of the key is refused below, not waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise ConfigError(f"{KEY_FILE_ENV}: cannot read the MAC key {path} "
                          f"({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{KEY_FILE_ENV}: the MAC key {path} is not a regular file")
        if info.st_mode & 0o077:
            raise ConfigError(f"{KEY_FILE_ENV}: the MAC key {path} may be read or written by "
                              f"others (mode {stat.S_IMODE(info.st_mode):o}); chmod 600 it")
        key = f.read(4096).strip()
    if len(key) < 16:
        raise ConfigError(f"{KEY_FILE_ENV}: the MAC key {path} is shorter than 16 bytes")
    return key


def mac_key(create: bool = True) -> bytes:
    """Return this user's MAC key (``DPBENCH_MAC_KEY``, ``DPBENCH_MAC_KEY_FILE`` or the
    default file, created on first use when ``create``); ConfigError naming the variable.
    After ``freeze_key`` the key read then (or its error), whatever the environment says."""
    if isinstance(_FROZEN, ConfigError):
        raise _FROZEN
    if _FROZEN is not None:
        return _FROZEN
    return _read_key(create)


def _read_key(create: bool) -> bytes:
    value = os.environ.get(KEY_ENV)
    if value:
        if len(value) < 16:
            raise ConfigError(f"{KEY_ENV} is {len(value)} characters long, shorter than the "
                              "16 a MAC key needs (or unset it to use the key file)")
        return value.encode()
    named = os.environ.get(KEY_FILE_ENV)
    return _read_key_file(Path(named).expanduser(), create=False) if named else (
        _read_key_file(default_key_path(), create=create))


def mac_of(data: bytes, key: bytes | None = None) -> str:
    """Return ``hmac-sha256:<hex>`` of ``data`` under ``key`` (this user's by default)."""
    digest = hmac.new(mac_key() if key is None else key, data, hashlib.sha256).hexdigest()
    return _PREFIX + digest


def mac_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + MAC_SUFFIX)


def write_mac(path: str | os.PathLike, data: bytes) -> None:
    """Write the sidecar MAC of ``data`` (the bytes just written to ``path``), atomically.

    Without a usable key the file stays unauthenticated (logged): the run goes on, and only
    resuming it is refused.
    """
    try:
        _write_sidecar(path, [mac_of(data)])
    except ConfigError as err:
        log.warning("%s is written without a MAC (%s): it cannot be resumed", path, err)


def _write_sidecar(path: str | os.PathLike, macs: list[str], durable: bool = True) -> None:
    """Write ``macs`` (one a line) to the sidecar of ``path`` atomically (a failure logged)."""
    try:
        atomic_write_bytes(mac_path(path), "".join(f"{m}\n" for m in macs).encode(),
                           durable=durable)
    except OSError as err:
        log.warning("%s is written without a MAC (%s): it cannot be resumed", path, err)


def write_authenticated(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically with its sidecar MAC, so that a kill at any
    point leaves a file whose sidecar verifies it: the sidecar names the new MAC (and the
    previous file's) before the file is replaced, and the new one alone after.

    The last rewrite of the sidecar is never forced to disk: lost in a crash, it leaves the
    durable sidecar naming both MACs, which verifies the file as well (the new one, or the
    previous one the run wrote itself). ``durable=False`` (a record superseded within the
    run: ``results.json`` while running) forces none of it to disk (``atomic_write_bytes``)."""
    try:
        new = mac_of(data)
    except ConfigError as err:
        log.warning("%s is written without a MAC (%s): it cannot be resumed", path, err)
        atomic_write_bytes(path, data, durable=durable)
        return
    previous = [m for m in (_stored_macs(mac_path(path), missing_ok=True) or [])[:1]
                if m != new]
    _write_sidecar(path, [new, *previous], durable=durable)
    atomic_write_bytes(path, data, durable=durable)
    if previous:
        _write_sidecar(path, [new], durable=False)


def _stored_macs(sidecar: Path, missing_ok: bool = False) -> list[str] | None:
    """Return the MAC lines of ``sidecar`` (at most two), read without following a link or
    blocking on a FIFO; None for one that is not a regular file, [] for a missing one
    (``missing_ok``). Raises ``OSError`` when it cannot be read."""
    try:
        fd = os.open(sidecar, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        if missing_ok:
            return []
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        text = f.read(_MAX_MAC_BYTES).decode("ascii", "replace")
    return [line.strip() for line in text.splitlines()[:_MAX_MAC_LINES]
            if line.strip().startswith(_PREFIX)]


def verify_mac(path: str | os.PathLike, data: bytes, what: str) -> None:
    """Raise Unauthenticated (one line, saying how to start afresh) unless the sidecar MAC of
    ``path`` verifies ``data`` (the bytes read from it) with this user's key."""
    sidecar = mac_path(path)
    afresh = (f"move {Path(path).name} away (or use a new hydra.run.dir) to start afresh, or "
              "resume only runs written with your own key")
    try:
        stored = _stored_macs(sidecar)
    except FileNotFoundError:
        raise Unauthenticated(f"refusing to resume {what} {path}: it has no MAC "
                              f"({sidecar.name}), so dpbench cannot tell that you wrote it; "
                              f"{afresh}") from None
    except OSError as err:
        raise Unauthenticated(f"refusing to resume {what} {path}: cannot read its MAC "
                              f"{sidecar} ({err.strerror or err}); {afresh}") from None
    if stored is None:
        raise Unauthenticated(f"refusing to resume {what} {path}: its MAC {sidecar} is "
                              f"not a regular file; {afresh}")
    expected = mac_of(data, mac_key(create=False))
    if not any(hmac.compare_digest(line, expected) for line in stored):
        raise Unauthenticated(f"refusing to resume {what} {path}: its MAC does not match "
                              "(it was changed after dpbench wrote it, or written with "
                              f"another key); {afresh}")


def is_authentic(path: str | os.PathLike, data: bytes) -> bool:
    """Return whether ``data`` (read from ``path``) carries a MAC that verifies with this
    user's key; False when there is no key (none is created) or no readable MAC."""
    try:
        verify_mac(path, data, "the file")
    except ConfigError:
        return False
    return True

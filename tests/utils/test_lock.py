"""requirements.lock pins every dependency pyproject.toml names, inside its range.

``make setup`` installs the lock; a dependency added to pyproject.toml without ``make lock``
would be missing from a fresh set-up, and a range narrowed past the pin would be ignored.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the lock is resolved on 3.11

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("dev", "llm")  # what make setup installs


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if match:
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = list(project["dependencies"])
    for extra in EXTRAS:
        names += project["optional-dependencies"][extra]
    return [Requirement(r) for r in names]


def test_the_lock_pins_every_dependency_within_its_range():
    pins = _pins()
    assert len(pins) > 50 and "torch" in pins
    for req in _requirements():
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is in pyproject.toml but not in requirements.lock: " \
                             "run make lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {req.name}=={pins[name]} outside {req.specifier}: "
            "run make lock")


def test_the_lock_holds_the_pinned_torch():
    assert _pins()["torch"] == "2.14.1" and _pins()["torchvision"] == "0.29.1"

"""The privacy unit's keys (``privacy.unit``, ``privacy.user_strategy``,
``privacy.max_examples_per_user``) and the user partition's (``dataset.users`` ...): typed,
checked in one line naming the key, mirrored in conf/, and invisible to earlier runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpbench.config.schema import PrivacyConfig
from dpbench.data.users import USER_KEYS, UsersConfig
from dpbench.errors import ConfigError
from dpbench.privacy import user_level as ul
from dpbench.spec import build_spec, fingerprint
from dpbench.utils.conf import ADDED_DEFAULTS, CONF_DIR
from tests.helpers.config import compose_config


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def test_privacy_unit_defaults_to_example_and_the_added_defaults_are_the_schemas():
    config = PrivacyConfig()
    assert (config.unit, config.user_strategy, config.max_examples_per_user) == (
        ul.DEFAULT_UNIT, ul.DEFAULT_STRATEGY, ul.DEFAULT_MAX_EXAMPLES_PER_USER)
    privacy = _defaults(PrivacyConfig)
    assert ADDED_DEFAULTS["privacy"] == {k: privacy[k] for k in ADDED_DEFAULTS["privacy"]}
    users = _defaults(UsersConfig)
    assert ADDED_DEFAULTS["dataset"] == users and tuple(users) == USER_KEYS


@pytest.mark.parametrize("kwargs,key", [
    ({"unit": "household"}, "privacy.unit"),
    ({"user_strategy": "fedavg"}, "privacy.user_strategy"),
    ({"max_examples_per_user": 0}, "privacy.max_examples_per_user"),
    ({"max_examples_per_user": ul.MAX_EXAMPLES_PER_USER + 1}, "privacy.max_examples_per_user"),
])
def test_privacy_unit_keys_are_refused_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError) as err:
        PrivacyConfig(**kwargs)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_conf_mirrors_the_schemas():
    eps3 = OmegaConf.load(Path(CONF_DIR) / "privacy" / "eps3.yaml")
    privacy = _defaults(PrivacyConfig)
    for key in ("unit", "user_strategy", "max_examples_per_user"):
        assert eps3[key] == privacy[key]
    users = _defaults(UsersConfig)
    for path in sorted((Path(CONF_DIR) / "dataset").glob("*.yaml")):
        node = OmegaConf.load(path)
        if "defaults" in node:  # a variant: inherits its base's keys
            continue
        assert {k: node[k] for k in USER_KEYS} == users, path.name


def test_composed_configs_carry_the_keys_and_earlier_fingerprints_do_not_change():
    for dataset in ("digits", "etth2"):
        cfg = compose_config(f"dataset={dataset}")
        assert cfg.dataset.users == "synthetic" and cfg.privacy.unit == "example"
        # a run recorded before these keys existed has the same fingerprint (safe resume)
        old = OmegaConf.to_container(cfg, resolve=False)
        for key in USER_KEYS:
            del old["dataset"][key]
        for key in ("unit", "user_strategy", "max_examples_per_user"):
            del old["privacy"][key]
        assert fingerprint(OmegaConf.create(old)) == fingerprint(cfg)
    changed = compose_config("dataset.num_users=7")
    assert fingerprint(changed) != fingerprint(compose_config())


def test_user_unit_is_refused_before_any_data_is_read():
    spec = build_spec(compose_config("privacy.user_strategy=els", "dataset.num_users=5"))
    assert spec.privacy.unit == "example"  # read only under privacy.unit=user
    with pytest.raises(ConfigError, match=r"^privacy\.accountant=rdp has no accounting for "
                                          r"privacy\.user_strategy=els"):
        build_spec(compose_config("privacy.unit=user", "privacy.user_strategy=els",
                                  "privacy.accountant=rdp"))
    with pytest.raises(ConfigError, match=r"^trainer\.sampler=shuffle has no user-level"):
        build_spec(compose_config("privacy.unit=user", "trainer.sampler=shuffle"))
    assert build_spec(compose_config("privacy.unit=user")).privacy.unit == "user"
    with pytest.raises(ConfigError, match=r"^method=dpadam is not verified under "
                                          r"privacy\.unit=user"):
        build_spec(compose_config("privacy.unit=user", "method=dpadam"))
    for mode in ("bk", "ghost"):  # every engine clips per user (training/engine/per_user.py)
        build_spec(compose_config("privacy.unit=user", f"trainer.grad_sample_mode={mode}"))
    with pytest.raises(ConfigError, match=r"^dataset\.users must be one of"):
        build_spec(compose_config("dataset.users=households"))


@pytest.mark.integration
@pytest.mark.processes
@pytest.mark.parametrize("overrides,message", [
    (["privacy.unit=user", "method=dpadam"],
     "method=dpadam is not verified under privacy.unit=user"),
    (["privacy.unit=user", "privacy.user_strategy=els", "privacy.accountant=prv"],
     "privacy.accountant=prv has no accounting for privacy.user_strategy=els"),
    (["privacy.unit=household"], "privacy.unit must be one of example, user"),
    (["dataset.num_users=0"], "dataset.num_users must be an integer in"),
])
def test_the_cli_refuses_in_one_line_and_leaves_nothing_behind(overrides, message, tmp_path):
    """``dpbench`` as a user runs it: a fresh process, outside the repository."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(Path(sys.executable).parent / "dpbench"), "logger=none",
                           "trainer.progress=false", *overrides], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if message in line]
    assert len(errors) == 1, done.stderr[-2000:]
    assert not any(tmp_path.rglob("results.json")) and not any(tmp_path.rglob("*.pt"))
    runs = tmp_path / "outputs" / "runs"
    assert not runs.exists() or not any(p.is_file() for p in runs.rglob("*"))

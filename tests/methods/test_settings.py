"""Method settings are defined once (a dataclass per method) and refused before training."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dpbench.cli import hydra_main
from dpbench.errors import ConfigError
from dpbench.experiment import build_method, build_trainer
from dpbench.methods import get_method, method_names
from dpbench.utils.conf import CONF_DIR
from tests.helpers.cli import run_cli
from tests.helpers.config import compose_config

METHODS = method_names()
WITH_YAML = [m for m in METHODS if (Path(CONF_DIR) / "method" / f"{m}.yaml").is_file()]

#: (method, key, value out of range)
OUT_OF_RANGE = [
    ("adaclip", "target_quantile", 1.5), ("adaclip", "sigma_b", -1.0),
    ("autoclip", "stability", 0.0), ("bounded_adaclip", "clip_floor", -1.0),
    ("disk", "kappa", 0.0), ("disk", "gamma", -1.0), ("dp_adaln", "c_max", -1.0),
    ("fiber", "omega", 2.0), ("fiber", "filter", "kalman"), ("ivon", "mc_samples", 0),
    ("dp_ivon", "eval_samples", -1), ("spectral_denoise", "kappa", 0.0),
    ("spectral_denoise", "targets", "everything"),
]
#: a value of the wrong type for each field type (strings accept anything)
WRONG_TYPE = {float: "abc", int: "1.5", bool: "maybe"}


def _settings_keys_read(method) -> set[str]:
    """Return the keys the method's code reads as ``self.settings.<key>`` (the whole MRO of
    its mechanism and its update)."""
    keys: set[str] = set()
    for klass in {*method.mechanism_cls.__mro__, *method.update_cls.__mro__}:
        if not klass.__module__.startswith("dpbench.methods"):
            continue
        tree = ast.parse(inspect.getsource(klass))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "settings"):
                keys.add(node.attr)
    return keys


@pytest.mark.parametrize("name", METHODS)
def test_every_method_has_a_settings_dataclass(name):
    method = get_method(name)
    assert dataclasses.is_dataclass(method.settings_cls), f"{name}: settings is no dataclass"
    assert method.settings_cls.__dataclass_params__.frozen, f"{name}: settings not frozen"
    defaults = dataclasses.asdict(method.settings_cls())
    assert method.settings_defaults() == defaults == dataclasses.asdict(method.settings)
    assert _settings_keys_read(method) <= set(defaults), (
        f"{name} reads settings its dataclass does not define")


@pytest.mark.parametrize("name", WITH_YAML)
def test_composed_settings_are_the_dataclass_and_what_the_method_reads(name):
    cls = get_method(name)
    cfg = compose_config(f"method={name}")
    assert OmegaConf.get_type(cfg.method.settings) is cls.settings_cls  # typed at composition
    composed = OmegaConf.to_object(cfg.method.settings)
    assert build_method(cfg).settings == composed
    # the YAML only says what differs from the dataclass's defaults
    raw = yaml.safe_load((Path(CONF_DIR) / "method" / f"{name}.yaml").read_text())
    defaults = dataclasses.asdict(cls.settings_cls())
    restated = {k: v for k, v in (raw.get("settings") or {}).items() if defaults.get(k) == v}
    assert not restated, f"conf/method/{name}.yaml restates defaults {restated}"


def _first_typed_field(name: str) -> list[tuple[str, str, str]]:
    """Return [(name, key, a value of the wrong type)] for the method's first typed field."""
    for f in dataclasses.fields(get_method(name).settings_cls):
        for typ, bad in WRONG_TYPE.items():
            if f.type in (typ, typ.__name__):
                return [(name, f.name, bad)]
    return []


@pytest.mark.parametrize("name,key,bad", [c for m in WITH_YAML for c in _first_typed_field(m)])
def test_wrong_type_fails_at_composition_naming_the_key(name, key, bad):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(f"method={name}", f"method.settings.{key}={bad}")
    chain = f"{err.value} {err.value.__cause__}"
    assert f"method.settings.{key}" in chain


@pytest.mark.parametrize("name,key,value", OUT_OF_RANGE)
def test_out_of_range_is_one_line_naming_the_key_before_data(name, key, value, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data was loaded before the settings were checked")

    monkeypatch.setattr("dpbench.experiment.get_dataset_builder", no_data)
    cfg = compose_config(f"method={name}", f"method.settings.{key}={value}")
    with pytest.raises(ConfigError) as err:
        build_trainer(cfg, None)
    message = str(err.value)
    assert f"method.settings.{key}" in message and "\n" not in message


def test_python_construction_is_checked_the_same_way():
    fiber = get_method("fiber")
    assert fiber.configured(omega=1).settings.omega == 1.0  # converted like a composed value
    with pytest.raises(ConfigError, match=r"method\.settings\.omega: .*Float"):
        fiber.configured(omega="abc")
    with pytest.raises(ConfigError, match=r"has no setting\(s\) \['nosuch'\]"):
        fiber.configured(nosuch=1)


def test_settings_are_the_frozen_dataclass_itself():
    settings = get_method("disk").configured(kappa=0.5).settings
    assert type(settings).__name__ == "DiSKSettings" and settings.kappa == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.kappa = 1.0  # type: ignore[misc]


def test_cli_refuses_out_of_range_setting_in_one_line(monkeypatch, tmp_path, capfd):
    run_dir = tmp_path / "run"
    code = run_cli(hydra_main, ["method=fiber", "method.settings.omega=2",
                                  f"hydra.run.dir={run_dir}"], monkeypatch)
    err = capfd.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == ["dpbench: error: method.settings.omega must be in (0, 1] "
                                "(got 2.0)"], err
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_the_settings_registry_holds_each_built_in_methods_dataclass():
    """One source: every built-in method's record holds the dataclass registered under its
    name in ``dpbench.method_settings`` (the torch-free module composing reads), and each
    ``conf/method/<name>.yaml`` has both modules."""
    from dpbench.method_settings import SETTINGS, settings_class
    from dpbench.methods import METHODS as REGISTRY

    builtin = [n for n in REGISTRY.builtin_names()  # less any a test registered
               if get_method(n).mechanism_cls.__module__.startswith("dpbench.methods")]
    assert set(builtin) <= set(SETTINGS.builtin_names())
    for name in SETTINGS.builtin_names():
        assert get_method(name).settings_cls is settings_class(name), name
        assert get_method(name).settings == SETTINGS.get(name), name
    package = Path(__file__).resolve().parents[2] / "dpbench"
    for yaml_file in (Path(CONF_DIR) / "method").glob("*.yaml"):
        if yaml_file.stem != "plugin":
            assert (package / "method_settings" / yaml_file.name).with_suffix(".py").is_file()
            assert (package / "methods" / yaml_file.name).with_suffix(".py").is_file()


def test_a_method_name_given_settings_twice_is_refused():
    from dpbench.method_settings import SETTINGS, register_settings
    from dpbench.method_settings.dpsgd import DPSGDSettings

    SETTINGS.load_builtins()
    with pytest.raises(ValueError, match="already registered"):
        register_settings("dpsgd")(DPSGDSettings)
    with pytest.raises(TypeError, match="frozen dataclass"):
        register_settings("not_frozen")(dataclasses.make_dataclass("Open", [("x", int, 0)]))
    assert "not_frozen" not in SETTINGS.builtin_names()

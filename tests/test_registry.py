"""Registries refuse duplicates, list known names, and load outside plugins by entry point."""

from __future__ import annotations

import sys
import textwrap

import pytest

from dpbench.errors import ConfigError
from dpbench.methods import METHODS, DPMethod, get_method, method_names, register_method
from tests.helpers.config import compose_config, run_config


def test_duplicate_name_is_rejected():
    method_names()  # built-ins loaded
    with pytest.raises(ValueError, match="already registered"):
        register_method(DPMethod("dpsgd"))


def test_unknown_name_lists_known():
    with pytest.raises(ConfigError, match="registered: .*dpsgd"):
        get_method("no_such_method")


def test_builtin_methods_registered():
    assert {"nonprivate", "dpsgd", "dpadam", "dpadamw"} <= set(method_names())


def test_third_party_method_via_entry_point(tmp_path, monkeypatch):
    """A toy outside package registers through the ``dpbench.methods`` entry-point group."""
    (tmp_path / "toy_dpbench_plugin.py").write_text(textwrap.dedent('''
        from dpbench.methods.base import DPMethod, Update

        class HalfUpdate(Update):
            """Halves the released gradient (post-processing)."""
            def postprocess(self, grads, ctx):
                return [0.5 * g for g in grads]

        #: DP-SGD whose update halves the released gradient
        HALF_STEP = DPMethod("toy_half", update_cls=HalfUpdate)
    '''))
    dist = tmp_path / "toy_dpbench_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-dpbench-plugin\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[dpbench.methods]\ntoy_half = toy_dpbench_plugin:HALF_STEP\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(METHODS, "_plugins_loaded", False)
    try:
        method = get_method("toy_half")
        assert method.update_cls.__name__ == "HalfUpdate" and "toy_half" in method_names()
        cfg = compose_config("method=plugin", "method.name=toy_half", "trainer.epochs=1")
        result = run_config(cfg)
        assert result["epsilon"] <= 3.0 and result["method_summary"]
    finally:
        METHODS._entries.pop("toy_half", None)
        sys.modules.pop("toy_dpbench_plugin", None)

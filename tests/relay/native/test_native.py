"""The native core's switch: in CI every extension must be built and in use (a build that silently
fell back to Python would hide a 5x slowdown), and GPU_RELAY_NATIVE=0 turns all of it off."""

from __future__ import annotations

import logging
import os

import pytest
from prometheus_client import CollectorRegistry

from relay import __version__, native
from relay.common.metrics import RelayMetrics


def test_in_ci_every_native_module_is_built_unless_turned_off() -> None:
    if native.disabled():
        pytest.skip("GPU_RELAY_NATIVE=0: this run is the pure-Python reference")
    if not os.environ.get("CI"):
        pytest.skip("outside CI a checkout may lack a compiler")
    ok, why = native.status()
    assert ok, why


@pytest.mark.parametrize("value", ["0", "false", "NO", " off "])
def test_the_switch_turns_every_native_module_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(native.ENV, value)
    assert native.disabled()
    assert all(native.load(n) is None for n in native.MODULES)
    ok, why = native.status()
    assert not ok and native.ENV in why


def test_python_fallback_is_one_warning_and_build_info_says_native_false(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(native.ENV, "0")
    with caplog.at_level(logging.WARNING, logger="relay.native"):
        assert native.warn_if_python() is False
    assert len(caplog.records) == 1 and native.ENV in caplog.text
    registry = CollectorRegistry()
    RelayMetrics(registry)
    assert registry.get_sample_value("gpu_relay_build_info", {"version": __version__, "native": "false"}) == 1


def test_a_module_that_is_not_built_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setattr(native, "MODULES", ("no_such_core",))
    ok, why = native.status()
    assert not ok
    assert "relay.native._no_such_core" in why and "scripts/setup.sh" in why

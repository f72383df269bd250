"""deploy/examples/relay.yaml stays a complete, valid example of the relay config."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.cli import main
from relay.config import ConfigError, load_config
from relay.relabel import process

EXAMPLE = Path(__file__).parent.parent / "deploy" / "examples" / "relay.yaml"
ENV = {"AMP_WORKSPACE_ID": "ws-0123", "POD_NAME": "prometheus-0", "AWS_REGION": "eu-west-1"}


def test_example_loads_with_its_environment_and_no_warnings() -> None:
    config = load_config(EXAMPLE, env=ENV)
    assert config.warnings == ()
    assert config.server.listen == "127.0.0.1:9201"  # the write endpoint stays on loopback
    assert config.server.telemetry_listen == ":9202"
    assert dict(config.external_labels) == {"cluster": "gpu-prod", "__replica__": "prometheus-0"}
    (amp,) = config.destinations
    assert amp.url == "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-0123/api/v1/remote_write"
    assert amp.sigv4 is not None and (amp.sigv4.region, amp.sigv4.role_arn) == ("eu-west-1", None)
    assert process((("__name__", "DCGM_FI_DEV_GPU_UTIL"),), amp.write_relabel_configs) is not None
    assert process((("__name__", "DCGM_FI_DEV_SM_CLOCK"),), amp.write_relabel_configs) is None


def test_example_defaults_region_and_cluster() -> None:
    config = load_config(EXAMPLE, env={"AMP_WORKSPACE_ID": "ws-1", "POD_NAME": "p", "CLUSTER": "c2"})
    assert config.destinations[0].sigv4 is not None and config.destinations[0].sigv4.region == "us-east-1"
    assert dict(config.external_labels)["cluster"] == "c2"


def test_example_without_its_workspace_or_pod_name_is_refused_with_the_lines() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, env={})
    text = EXAMPLE.read_text().splitlines()
    lines = {e.line: e.message.split(" is not set")[0] for e in info.value.errors}
    assert lines == {
        text.index("  __replica__: '${POD_NAME}'") + 1: "environment variable POD_NAME",
        next(i for i, t in enumerate(text, 1) if "${AMP_WORKSPACE_ID}" in t and "url:" in t):
        "environment variable AMP_WORKSPACE_ID",
    }


def test_check_config_accepts_the_example(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert "OK: 1 destination (amp)" in capsys.readouterr().out

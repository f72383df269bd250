"""deploy/examples/relay.yaml stays a complete, valid example of the relay config."""

from __future__ import annotations

import pytest

from relay.config.config import ConfigError, load_config
from relay.control.cli import main
from relay.rules.relabel import process
from tests.helpers import REPO_ROOT

EXAMPLE = REPO_ROOT / "deploy" / "examples" / "relay.yaml"
URL = "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-0123/api/v1/remote_write"
ENV = {"AMP_REMOTE_WRITE_URL": URL, "POD_NAME": "prometheus-1", "AWS_REGION": "eu-west-1", "CLUSTER_NAME": "c2"}


def test_example_loads_with_its_environment_and_no_warnings() -> None:
    config = load_config(EXAMPLE, env=ENV)
    assert config.warnings == ()
    assert config.server.listen == "127.0.0.1:9201"  # the write endpoint stays on loopback
    assert config.server.telemetry_listen == ":9202"
    assert dict(config.external_labels) == {"cluster": "c2", "__replica__": "prometheus-1"}
    (amp,) = config.destinations
    assert amp.url == URL
    assert amp.sigv4 is not None and (amp.sigv4.region, amp.sigv4.role_arn) == ("eu-west-1", None)
    assert process((("__name__", "DCGM_FI_DEV_GPU_UTIL"),), amp.write_relabel_configs) is not None
    assert process((("__name__", "DCGM_FI_DEV_SM_CLOCK"),), amp.write_relabel_configs) is None


def test_example_checks_as_it_is_with_its_defaults() -> None:
    config = load_config(EXAMPLE, env={})
    assert dict(config.external_labels) == {"cluster": "gpu-prod", "__replica__": "prometheus-0"}
    assert config.destinations[0].sigv4 is not None and config.destinations[0].sigv4.region == "us-east-1"


def test_example_refuses_a_region_that_is_not_the_workspace_s() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, env={"AMP_REMOTE_WRITE_URL": URL})
    (issue,) = info.value.errors
    assert issue.path == "destinations[0].sigv4.region"
    assert issue.message == '"us-east-1" does not match the region of the AMP URL ("eu-west-1")'


def test_check_config_accepts_the_example(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert "OK: 1 destination (amp)" in capsys.readouterr().out

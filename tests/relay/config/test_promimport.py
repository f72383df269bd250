"""import-prometheus on real Prometheus config files, checked both ways: the relay part by our
check-config, the Prometheus part spliced back into the original and checked by the real promtool."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from relay.config.config import load_config
from relay.config.promimport import ImportError_, import_prometheus, variables
from relay.control.cli import main
from relay.rules.relabel import RelabelConfig, parse_relabel_configs, process
from tests.helpers import REPO_ROOT, TEST_DATA, require_binary

PROM = TEST_DATA / "prometheus"
FILES = sorted(PROM.glob("*.yml"))
ENV = {"POD_NAME": "prometheus-0", "AWS_REGION": "eu-west-1"}


def promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    return subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)


def run_import(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[str, str, str]:
    assert main(["import-prometheus", str(path)]) == 0
    out, err = capsys.readouterr()
    relay, sep, prometheus = out.partition("\n---\n")
    assert sep, out
    return relay + "\n", prometheus, err


def splice(original: Path, prometheus_part: str, into: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(original.read_text())
    doc["remote_write"] = yaml.safe_load(prometheus_part)["remote_write"]
    into.write_text(yaml.safe_dump(doc, sort_keys=False))
    return into


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_the_test_files_are_real_prometheus_configs(path: Path) -> None:
    proc = promtool_check(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_import_gives_a_relay_config_check_config_accepts_and_a_prometheus_entry_promtool_accepts(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    relay_text, prometheus_part, _ = run_import(capsys, path)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    relay_file = tmp_path / "relay.yaml"
    relay_file.write_text(relay_text.replace("/var/lib/gpu-relay", str(tmp_path / "queue")))
    assert main(["check-config", str(relay_file)]) == 0, capsys.readouterr().err
    assert ": OK: " in capsys.readouterr().out
    spliced = splice(path, prometheus_part, tmp_path / "prometheus.yml")
    proc = promtool_check(spliced)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = yaml.safe_load(spliced.read_text())["remote_write"]
    assert (entry["url"], entry["name"]) == ("http://127.0.0.1:9201/api/v1/write", "gpu-relay")


def test_seed_block_keeps_its_amp_url_region_keep_rule_and_external_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    relay_text, prometheus_part, err = run_import(capsys, PROM / "seed.yml")
    (tmp_path / "relay.yaml").write_text(relay_text)
    config = load_config(tmp_path / "relay.yaml")
    assert config.external_labels == (("cluster", "gpu-prod"),)
    (amp,) = config.destinations
    assert amp.name == "amp"  # an unnamed AMP entry gets a name to read in logs
    assert amp.url == "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-EXAMPLE/api/v1/remote_write"
    assert amp.sigv4 is not None and amp.sigv4.region == "us-east-1"
    assert (amp.queue.max_shards, amp.queue.max_samples_per_send) == (200, 1000)
    assert process((("__name__", "DCGM_FI_DEV_GPU_UTIL"),), amp.write_relabel_configs) is not None
    assert process((("__name__", "DCGM_FI_DEV_SM_CLOCK"),), amp.write_relabel_configs) is None
    assert "queue_config.capacity: not honoured" in err  # said, not silently dropped
    # Prometheus sends the relay only what the keep rule lets through
    (entry,) = yaml.safe_load(prometheus_part)["remote_write"]
    (keep,) = entry["write_relabel_configs"]
    assert (keep["action"], keep["source_labels"]) == ("keep", ["__name__"])
    assert process((("__name__", "DCGM_FI_DEV_XID_ERRORS"),), load_rules(keep)) is not None
    assert process((("__name__", "go_goroutines"),), load_rules(keep)) is None


def load_rules(rule: dict[str, Any]) -> tuple[RelabelConfig, ...]:
    return parse_relabel_configs([rule])


def test_two_backends_keep_templates_auth_and_environment_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    relay_text, prometheus_part, err = run_import(capsys, PROM / "two-backends.yml")
    assert "environment variables POD_NAME, AWS_REGION" in err
    assert variables(relay_text) == ["POD_NAME", "AWS_REGION"]
    (tmp_path / "relay.yaml").write_text(relay_text)
    config = load_config(tmp_path / "relay.yaml", env=ENV)
    assert dict(config.external_labels) == {"cluster": "gpu-eu", "__replica__": "prometheus-0", "region": "eu-west-1"}
    amp, vm = config.destinations
    assert amp.name == "amp-eu"  # "amp.eu" is not a relay name: dots become "-"
    assert amp.sigv4 is not None and amp.sigv4.role_arn == "arn:aws:iam::111122223333:role/amp-writer"
    assert (amp.queue.timeout, amp.queue.max_shards, amp.queue.min_backoff, amp.queue.max_backoff) == (20, 50, 0.1, 30)
    # the ${1} template survived the relay's own ${VAR} expansion
    series = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("instance", "node-7:9400"))
    assert process(series, amp.write_relabel_configs) == (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("node", "node-7"))
    auth = "Basic " + base64.b64encode(b"writer:not-a-real-password").decode()
    assert dict(vm.headers) == {"X-Scope-OrgID": "gpu", "Authorization": auth}
    # no common keep rule: Prometheus sends everything; exemplars carry over
    (entry,) = yaml.safe_load(prometheus_part)["remote_write"]
    assert "write_relabel_configs" not in entry and entry["send_exemplars"] is True


def test_an_entry_already_pointing_at_the_relay_is_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    relay_text, _, err = run_import(capsys, PROM / "already-relayed.yml")
    assert "remote_write[0] already writes to the relay (http://127.0.0.1:9201/api/v1/write): left out" in err
    assert [e["name"] for e in yaml.safe_load(relay_text)["remote_write"]] == ["amp"]


def test_output_file_gets_the_relay_config_and_stdout_the_prometheus_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "relay.yaml"
    assert main(["import-prometheus", str(PROM / "seed.yml"), "-o", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out)["remote_write"][0]["url"] == "http://127.0.0.1:9201/api/v1/write"
    assert load_config(out_file).destinations[0].sigv4 is not None


def test_the_header_sends_dry_run_and_the_relay_s_own_keys_to_the_doc_section_that_explains_the_move() -> None:
    """A remote_write entry cannot take dry_run (unknown key): the header must say to move the entry,
    and name a section the reference really has."""
    header = [ln for ln in import_prometheus(PROM / "seed.yml").relay_config.splitlines() if ln.startswith("#")]
    text = " ".join(ln.lstrip("# ") for ln in header)
    assert "move the entry to destinations:" in text
    section = re.search(r'"([^"]+)" in docs/relay-config\.md', text)
    assert section is not None, text
    doc = (REPO_ROOT / "docs" / "relay-config.md").read_text(encoding="utf-8")
    assert f"### {section.group(1)}\n" in doc


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("global: {}\n", "no remote_write entry to import"),
        ("remote_write: [{name: x}]\n", "remote_write[0]: expected a mapping with a url"),
        ("remote_write: {url: x}\n", "remote_write: expected a list"),
        ("- a\n", "not a Prometheus config"),
        ("remote_write: [\n", "invalid YAML"),
    ],
)
def test_unusable_prometheus_configs_fail_with_a_message(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    with pytest.raises(ImportError_, match=message.replace("[", r"\[").replace("]", r"\]")):
        import_prometheus(path)
    assert main(["import-prometheus", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"gpu-relay import-prometheus: {path}")


def test_a_missing_file_fails_with_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import-prometheus", str(tmp_path / "nope.yml")]) == 1
    assert "nope.yml: cannot read: No such file or directory" in capsys.readouterr().err


def test_dollars_in_copied_values_round_trip_through_the_relay_s_expansion(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(
        "remote_write:\n  - url: http://h:1/w\n    write_relabel_configs:\n"
        "      - {source_labels: [a], regex: '(.*)', target_label: b, replacement: '$$x-${1}-$1'}\n"
    )
    imported = import_prometheus(path)
    (tmp_path / "relay.yaml").write_text(imported.relay_config)
    (d,) = load_config(tmp_path / "relay.yaml", env={}).destinations
    assert d.write_relabel_configs[0].replacement == "$$x-${1}-$1"


def test_unnamed_amp_entries_get_names_that_do_not_clash(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    url = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-{}/api/v1/remote_write"
    path.write_text(
        f"remote_write:\n  - url: {url.format(1)}\n  - url: {url.format(2)}\n    name: amp\n"
        f"  - url: {url.format(3)}\n  - url: http://h:1/w\n"
    )
    entries = yaml.safe_load(import_prometheus(path).relay_config)["remote_write"]
    assert [e.get("name") for e in entries] == ["amp-2", "amp", "amp-3", None]


def test_names_that_collide_once_made_relay_names_stay_distinct(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(
        "remote_write:\n  - {url: 'http://h:1/a', name: amp.eu}\n  - {url: 'http://h:1/b', name: amp-eu}\n"
        "  - {url: 'http://h:1/c', name: amp/eu}\n"
    )
    imported = import_prometheus(path)
    assert [e["name"] for e in yaml.safe_load(imported.relay_config)["remote_write"]] == ["amp-eu-2", "amp-eu",
                                                                                           "amp-eu-3"]  # fmt: skip
    (tmp_path / "relay.yaml").write_text(imported.relay_config)
    assert len(load_config(tmp_path / "relay.yaml", env={}).destinations) == 3


def test_credentials_copied_in_clear_are_named_on_stderr_never_printed_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(
        "remote_write:\n"
        "  - url: https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write\n"
        "    sigv4: {region: us-east-1, access_key: AKIAEXAMPLE, secret_key: s3cr3t-key}\n"
        "  - url: http://h:1/w\n    basic_auth: {username: u, password: pa55word}\n"
        "  - url: http://h:2/w\n    authorization: {credentials: t0ken}\n"
        "  - url: http://h:3/w\n    bearer_token: b3arer\n    headers: {X-Api-Key: k3y}\n"
        "  - url: http://h:4/w\n    basic_auth: {username: u, password: '${PASSWORD}'}\n"
    )
    assert import_prometheus(path).credentials == (
        "remote_write[0].sigv4.secret_key", "remote_write[1].basic_auth.password",
        "remote_write[2].authorization.credentials", "remote_write[3].bearer_token",
        "remote_write[4].basic_auth.password",  # Prometheus does not expand it: "${PASSWORD}" is the password
    )  # fmt: skip
    assert main(["import-prometheus", str(path), "-o", str(tmp_path / "relay.yaml")]) == 0
    out, err = capsys.readouterr()
    assert "credentials copied in clear from" in err and "remote_write[3].bearer_token" in err
    assert not any(s in err + out for s in ("s3cr3t-key", "pa55word", "t0ken", "b3arer"))
    assert "s3cr3t-key" in (tmp_path / "relay.yaml").read_text()  # the config needs it to work


def test_an_entry_left_out_as_the_relay_s_own_does_not_change_the_keep_rule(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(
        "remote_write:\n  - url: http://127.0.0.1:9201/api/v1/write/\n"
        "  - url: http://h:1/w\n    write_relabel_configs: [{source_labels: [__name__], regex: 'DCGM_.*', "
        "action: keep}]\n"
    )
    imported = import_prometheus(path)
    assert imported.skipped and "left out" in imported.skipped[0]
    (entry,) = yaml.safe_load(imported.prometheus_entry)["remote_write"]
    assert entry["write_relabel_configs"] == [{"source_labels": ["__name__"], "regex": "(?:DCGM_.*)", "action": "keep"}]


@pytest.mark.parametrize(
    ("url", "listen"),
    [("http://localhost/api/v1/write", "localhost:80"), ("http://[::1]:9301/api/v1/write", "[::1]:9301")],
)
def test_relay_url_gives_the_relay_s_listen_address(url: str, listen: str) -> None:
    imported = import_prometheus(PROM / "seed.yml", relay_url=url)
    assert yaml.safe_load(imported.relay_config)["server"]["listen"] == listen


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://127.0.0.1:9201/api/v1/write", "the relay serves plain http"),
        ("http://127.0.0.1:9201/write", 'the relay receives on the path "/api/v1/write"'),
        ("127.0.0.1:9201", "the relay serves plain http"),
        ("http://127.0.0.1:x/api/v1/write", "invalid"),
    ],
)
def test_a_relay_url_the_relay_cannot_serve_is_refused(url: str, message: str) -> None:
    with pytest.raises(ImportError_, match=f"--relay-url {re.escape(url)}: .*{re.escape(message)}"):
        import_prometheus(PROM / "seed.yml", relay_url=url)

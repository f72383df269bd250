from __future__ import annotations

import base64

import pytest

from relay.config import promremote
from relay.config.config import ConfigError, DestinationConfig, QueueConfig, SigV4Config, parse_config
from relay.config.promremote import default_name
from relay.rules.relabel import process

AMP = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"
LOCAL = "http://127.0.0.1:9/w"

# Prometheus's own syntax, every key the issue names, as a user pastes it from prometheus.yml.
FULL = f"""\
remote_write:
  - url: {AMP}
    name: amp
    remote_timeout: 20s
    headers: {{X-Team: gpu}}
    write_relabel_configs:
      - source_labels: [__name__]
        regex: DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED
        action: keep
    sigv4:
      region: us-east-1
      access_key: AKIAEXAMPLE
      secret_key: s3cr3t
      profile: prod
      role_arn: arn:aws:iam::123456789012:role/amp-writer
    queue_config:
      capacity: 2500
      max_shards: 200
      min_shards: 1
      max_samples_per_send: 1000
      batch_send_deadline: 5s
      min_backoff: 30ms
      max_backoff: 10s
      retry_on_http_429: true
    metadata_config:
      send: false
      send_interval: 1m
"""


def test_a_full_prometheus_remote_write_entry_maps_onto_a_destination() -> None:
    config = parse_config(FULL)
    (amp,) = config.destinations
    assert amp.name == "amp" and amp.url == AMP
    assert dict(amp.headers) == {"X-Team": "gpu"}
    assert amp.sigv4 == SigV4Config(
        "us-east-1", "arn:aws:iam::123456789012:role/amp-writer", None, "prod", "aps", "AKIAEXAMPLE", "s3cr3t"
    )
    assert amp.queue == QueueConfig(1000, 5.0, 200, 0.03, 10.0, 3600.0, 1024**3, 20.0, min_shards=1)
    assert amp.send_metadata is False
    keep = amp.write_relabel_configs
    assert process((("__name__", "DCGM_FI_DEV_GPU_UTIL"),), keep) is not None
    assert process((("__name__", "DCGM_FI_DEV_SM_CLOCK"),), keep) is None


def test_keys_the_relay_cannot_honour_are_warnings_naming_them() -> None:
    warnings = parse_config(FULL).warnings
    assert warnings == (
        "relay.yaml:17: remote_write[0].queue_config.capacity: not honoured: the relay's queue is on disk, "
        "bounded by max_disk (1GiB; to change it, move the entry to destinations: and set queue.max_disk, "
        "see docs/relay-config.md)",
        "relay.yaml:27: remote_write[0].metadata_config.send_interval: not honoured: the relay forwards "
        "metadata when Prometheus sends it",
    )


@pytest.mark.parametrize(
    ("entry", "warning"),
    [
        ("    oauth2: {client_id: c}\n", "remote_write[0].oauth2: not honoured: the relay signs"),
        ("    basic_auth: {username: u, password_file: /p}\n", "basic_auth.password_file: not honoured"),
        ("    tls_config: {insecure_skip_verify: true}\n", "remote_write[0].tls_config: not honoured"),
        ("    send_native_histograms: false\n", "remote_write[0].send_native_histograms: not honoured"),
        ("    protobuf_message: io.prometheus.write.v2.Request\n", "remote_write[0].protobuf_message: not honoured"),
        ("    queue_config: {retry_on_http_429: false}\n", "queue_config.retry_on_http_429: not honoured"),
        ("    queue_config: {sample_age_limit: 0s}\n", "queue_config.sample_age_limit: 0 (no limit) is not"),
        ("    sigv4: {region: us-east-1, use_fips_sts_endpoint: true}\n", "sigv4.use_fips_sts_endpoint: not honoured"),
        ("    metadata_config: {max_samples_per_send: 10}\n", "metadata_config.max_samples_per_send: not honoured"),
    ],
)
def test_each_known_but_unsupported_key_warns(entry: str, warning: str) -> None:
    config = parse_config(f"remote_write:\n  - url: {LOCAL}\n" + entry)  # not AMP: unsigned is fine there
    assert len(config.warnings) == 1 and warning in config.warnings[0]
    assert config.warnings[0].startswith("relay.yaml:3: ")


@pytest.mark.parametrize(
    "entry",
    [
        "    send_exemplars: true\n",
        "    send_native_histograms: true\n",
        "    protobuf_message: prometheus.WriteRequest\n",
        "    queue_config: {retry_on_http_429: true}\n",
        "    follow_redirects: false\n",
    ],
)
def test_a_value_the_relay_already_follows_does_not_warn(entry: str) -> None:
    assert parse_config(f"remote_write:\n  - url: {LOCAL}\n" + entry).warnings == ()


def test_sample_age_limit_and_remote_timeout_map_to_the_relay_s_names() -> None:
    text = f"remote_write:\n  - url: {AMP}\n    remote_timeout: 1m\n    queue_config: {{sample_age_limit: 10m}}\n"
    (d,) = parse_config(text).destinations
    assert (d.queue.timeout, d.queue.max_sample_age) == (60.0, 600.0)


def test_sigv4_region_defaults_to_the_amp_url_s_region() -> None:
    text = f"remote_write:\n  - url: {AMP}\n    sigv4: {{}}\n"
    (d,) = parse_config(text).destinations
    assert d.sigv4 == SigV4Config("us-east-1")


def test_missing_name_gets_rw_and_a_hash_of_the_url() -> None:
    (d,) = parse_config(f"remote_write:\n  - url: {AMP}\n").destinations
    assert d.name == default_name(AMP) and len(d.name) == len("rw-") + 6
    assert d.name == parse_config(f"remote_write:\n  - url: {AMP}\n    remote_timeout: 5s\n").destinations[0].name


def test_absent_keys_take_the_relay_s_defaults() -> None:
    (d,) = parse_config("remote_write:\n  - url: http://127.0.0.1:9/w\n").destinations
    assert d == DestinationConfig(default_name("http://127.0.0.1:9/w"), "http://127.0.0.1:9/w")


def test_remote_write_and_destinations_are_listed_in_file_order() -> None:
    text = (
        "destinations:\n  - name: local\n    url: http://127.0.0.1:9/w\n    dry_run: true\n"
        f"remote_write:\n  - url: {AMP}\n    name: amp\n    sigv4: {{region: us-east-1}}\n"
    )
    assert [d.name for d in parse_config(text).destinations] == ["local", "amp"]
    text = f"remote_write:\n  - {{url: '{AMP}', name: amp}}\ndestinations:\n  - {{name: b, url: 'http://h:1/w'}}\n"
    assert [d.name for d in parse_config(text).destinations] == ["amp", "b"]


BAD = {
    "unknown key": (
        f"remote_write:\n  - url: {AMP}\n    prune_labels: [pod]\n",
        ["relay.yaml:3: remote_write[0].prune_labels: unknown key (valid: url, name, remote_timeout, headers, "],
    ),
    "unknown queue_config key": (
        f"remote_write:\n  - url: {AMP}\n    queue_config: {{max_disk: 1GiB}}\n",
        ["relay.yaml:3: remote_write[0].queue_config.max_disk: unknown key (valid: max_shards, "],
    ),
    "service is the relay's name, service_name Prometheus's": (
        f"remote_write:\n  - url: {AMP}\n    sigv4: {{region: us-east-1, service: aps}}\n",
        ["relay.yaml:3: remote_write[0].sigv4.service: unknown key (valid: region, access_key, "],
    ),
    "names unique across remote_write and destinations": (
        "destinations:\n  - {name: amp, url: 'http://h:1/w'}\n"
        f"remote_write:\n  - {{url: '{AMP}', name: amp}}\n",
        ['relay.yaml:4: remote_write[0].name: duplicate name "amp" (first at line 2)'],
    ),
    "two unnamed entries with the same URL": (
        f"remote_write:\n  - url: {AMP}\n  - url: {AMP}\n",
        [f'relay.yaml:3: remote_write[1].name: duplicate name "{default_name(AMP)}" (first at line 2)'],
    ),
    "null entry": ("remote_write:\n  - null\n", ["relay.yaml:2: remote_write[0]: empty or null remote write"]),
    "missing url": ("remote_write:\n  - name: a\n", ["relay.yaml:2: remote_write[0].url: missing required key"]),
    "bad durations and a zero backoff": (
        f"remote_write:\n  - url: {AMP}\n    remote_timeout: 5q\n    queue_config: {{min_backoff: 0s}}\n",
        [
            'relay.yaml:3: remote_write[0].remote_timeout: invalid duration "5q"',
            "relay.yaml:4: remote_write[0].queue_config.min_backoff: must be greater than 0",
        ],
    ),
    "no region for a URL that is not AMP": (
        "remote_write:\n  - url: http://h:1/w\n    sigv4: {profile: p}\n",
        ["relay.yaml:3: remote_write[0].sigv4.region: missing required key"],
    ),
    "region differs from the AMP URL": (
        f"remote_write:\n  - url: {AMP}\n    sigv4: {{region: eu-west-1}}\n",
        ['relay.yaml:3: remote_write[0].sigv4.region: "eu-west-1" does not match the region of the AMP URL'],
    ),
    "authorization header": (
        f"remote_write:\n  - url: {AMP}\n    sigv4: {{}}\n    headers: {{Authorization: x}}\n",
        ["relay.yaml:4: remote_write[0].headers.Authorization: reserved header when sigv4 is set"],
    ),
}


@pytest.mark.parametrize(("text", "prefixes"), BAD.values(), ids=BAD.keys())
def test_bad_remote_write_entries_are_errors_with_line_and_path(text: str, prefixes: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    lines = str(info.value).splitlines()
    assert len(lines) == len(prefixes), lines
    for line, prefix in zip(lines, prefixes, strict=True):
        assert line.startswith(prefix), line


@pytest.mark.parametrize(
    ("entry", "header"),
    [
        ("    basic_auth: {username: u, password: p}\n", "Basic dTpw"),
        ("    authorization: {credentials: t0k}\n", "Bearer t0k"),
        ("    authorization: {type: Token, credentials: t0k}\n", "Token t0k"),
        ("    bearer_token: t0k\n", "Bearer t0k"),
    ],
)
def test_prometheus_http_auth_becomes_the_authorization_header(entry: str, header: str) -> None:
    config = parse_config("remote_write:\n  - url: http://127.0.0.1:9/w\n    headers: {X-A: b}\n" + entry)
    assert dict(config.destinations[0].headers) == {"X-A": "b", "Authorization": header}
    assert header.split()[-1] not in repr(config.warnings)


def test_two_kinds_of_auth_are_refused_as_prometheus_refuses_them() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"remote_write:\n  - url: {AMP}\n    sigv4: {{}}\n    bearer_token: t\n")
    assert str(info.value) == (
        "relay.yaml:4: remote_write[0].bearer_token: at most one of basic_auth, authorization, bearer_token and "
        "sigv4 may be set (got bearer_token, sigv4)"
    )


def test_credentials_never_appear_in_the_config_s_repr() -> None:
    config = parse_config(
        "remote_write:\n  - url: http://127.0.0.1:9/w\n    basic_auth: {username: u, password: hunter2}\n"
        f"  - url: {AMP}\n    sigv4: {{access_key: AKIAEXAMPLE, secret_key: s3cr3t}}\n"
    )
    text = repr(config)
    assert "hunter2" not in text and base64.b64encode(b"u:hunter2").decode() not in text
    assert "s3cr3t" not in text


# Keys of Prometheus 3.x (config/config.go RemoteWriteConfig, prometheus/common HTTPClientConfig,
# prometheus/sigv4 SigV4Config) that the relay first refused as unknown.
def test_sigv4_external_id_and_service_name_are_prometheus_keys_and_honoured() -> None:
    text = (
        f"remote_write:\n  - url: {AMP}\n    sigv4:\n      role_arn: arn:aws:iam::123456789012:role/w\n"
        "      external_id: team-gpu\n      service_name: aps\n"
    )
    config = parse_config(text)
    (d,) = config.destinations
    assert d.sigv4 == SigV4Config("us-east-1", "arn:aws:iam::123456789012:role/w", "team-gpu", service="aps")
    assert config.warnings == ()


def test_sigv4_service_name_other_than_aps_is_what_requests_are_signed_for() -> None:
    (d,) = parse_config("remote_write:\n  - url: http://127.0.0.1:9/w\n    sigv4: {region: eu-west-1, "
                        "service_name: execute-api}\n").destinations  # fmt: skip
    assert d.sigv4 is not None and d.sigv4.service == "execute-api"


def test_sigv4_external_id_without_role_arn_is_refused_with_its_line() -> None:
    with pytest.raises(ConfigError, match=r"relay.yaml:3: remote_write\[0\].sigv4.external_id: requires role_arn"):
        parse_config(f"remote_write:\n  - url: {AMP}\n    sigv4: {{external_id: x}}\n")


def test_sigv4_service_is_not_a_prometheus_key() -> None:
    with pytest.raises(ConfigError, match=r"remote_write\[0\].sigv4.service: unknown key"):
        parse_config(f"remote_write:\n  - url: {AMP}\n    sigv4: {{service: aps}}\n")


@pytest.mark.parametrize(
    ("entry", "warning"),
    [
        ("    failed_request_logging: true\n", "remote_write[0].failed_request_logging: not honoured"),
        ("    basic_auth: {username: u, password_ref: p}\n", "basic_auth.password_ref: not honoured"),
        ("    basic_auth: {username_ref: u, password: p}\n", "basic_auth.username_ref: not honoured"),
        ("    authorization: {credentials_ref: c}\n", "authorization.credentials_ref: not honoured"),
    ],
)
def test_newer_prometheus_keys_warn_instead_of_failing(entry: str, warning: str) -> None:
    config = parse_config("remote_write:\n  - url: http://127.0.0.1:9/w\n" + entry)
    assert len(config.warnings) == 1 and warning in config.warnings[0]


def test_failed_request_logging_off_does_not_warn() -> None:
    assert parse_config(f"remote_write:\n  - url: {LOCAL}\n    failed_request_logging: false\n").warnings == ()


def test_two_unnamed_entries_to_the_same_url_get_distinct_names_as_prometheus_allows() -> None:
    keep = "    write_relabel_configs: [{source_labels: [__name__], regex: up, action: keep}]\n"
    text = f"remote_write:\n  - url: {AMP}\n  - url: {AMP}\n{keep}  - url: {AMP}\n    name: mine\n"
    names = [d.name for d in parse_config(text).destinations]
    assert names == [default_name(AMP), default_name(AMP) + "-2", "mine"]


def test_an_unnamed_entry_does_not_take_the_name_another_entry_gives_itself() -> None:
    text = f"remote_write:\n  - url: {AMP}\n  - url: http://127.0.0.1:9/w\n    name: {default_name(AMP)}\n"
    names = [d.name for d in parse_config(text).destinations]
    assert names == [default_name(AMP) + "-2", default_name(AMP)]


def test_an_explicit_duplicate_name_is_still_refused() -> None:
    text = f"remote_write:\n  - url: {AMP}\n    name: a\n  - url: http://127.0.0.1:9/w\n    name: a\n"
    message = r'relay.yaml:5: remote_write\[1\].name: duplicate name "a" \(first at line 3\)'
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


@pytest.mark.parametrize(
    ("text", "warning"),
    [
        (f"remote_write:\n  - url: {AMP}\n", "relay.yaml:2: remote_write[0].url: an AMP URL without sigv4: AMP "
         "answers 403 to unsigned requests (add sigv4: {})"),
        (f"remote_write:\n  - url: {AMP}\n    sigv4:\n", "relay.yaml:2: remote_write[0].url: an AMP URL without sigv4"),
        (f"destinations:\n  - name: a\n    url: {AMP}\n", "relay.yaml:3: destinations[0].url: an AMP URL without "
         "sigv4: AMP answers 403 to unsigned requests (add sigv4: {region: us-east-1})"),
    ],
)  # fmt: skip
def test_an_amp_url_without_sigv4_is_a_warning(text: str, warning: str) -> None:
    (found,) = parse_config(text).warnings
    assert found.startswith(warning)


def test_an_amp_url_with_sigv4_or_a_url_elsewhere_does_not_warn() -> None:
    text = f"remote_write:\n  - url: {AMP}\n    sigv4: {{}}\n  - url: http://127.0.0.1:9/w\n"
    assert parse_config(text).warnings == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("remote_write: []\n", "relay.yaml:1: remote_write: at least one destination is required"),
        ("remote_write:\n", "relay.yaml:1: remote_write: at least one destination is required"),
        ("destinations:\n", "relay.yaml:1: destinations: at least one destination is required"),
        ("destinations: []\nremote_write: []\n", "relay.yaml:1: destinations: at least one destination is required"),
    ],
)
def test_a_config_without_any_destination_is_refused_rather_than_acking_writes_to_nowhere(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert str(info.value).splitlines() == [message]


def test_an_empty_destinations_list_is_fine_beside_a_remote_write_entry() -> None:
    (d,) = parse_config(f"destinations: []\nremote_write:\n  - url: {LOCAL}\n").destinations
    assert d.url == LOCAL


# Every key of Prometheus 3.x's RemoteWriteConfig (config/config.go), HTTPClientConfig
# (prometheus/common config/http_config.go), QueueConfig, MetadataConfig and SigV4Config
# (prometheus/sigv4), set to a value the relay does not already follow, in one paste.
EVERY_KEY = f"""\
remote_write:
  - url: {AMP}
    name: amp
    remote_timeout: 20s
    headers: {{X-Team: gpu}}
    write_relabel_configs: [{{source_labels: [__name__], regex: 'DCGM_.*', action: keep}}]
    send_exemplars: false
    send_native_histograms: false
    round_robin_dns: true
    protobuf_message: io.prometheus.write.v2.Request
    failed_request_logging: true
    tls_config: {{insecure_skip_verify: true}}
    proxy_url: http://proxy:3128
    no_proxy: 10.0.0.0/8
    proxy_connect_header: {{X-P: [v]}}
    follow_redirects: true
    enable_http2: true
    http_headers: {{X-H: {{values: [v]}}}}
    queue_config:
      capacity: 2500
      max_shards: 20
      min_shards: 2
      max_samples_per_send: 500
      batch_send_deadline: 2s
      min_backoff: 50ms
      max_backoff: 10s
      retry_on_http_429: false
      sample_age_limit: 30m
    metadata_config: {{send: false, send_interval: 2m, max_samples_per_send: 100}}
    sigv4:
      region: us-east-1
      access_key: AKIAEXAMPLE
      secret_key: s3cr3t
      profile: prod
      role_arn: arn:aws:iam::123456789012:role/amp-writer
      external_id: gpu
      use_fips_sts_endpoint: true
      service_name: aps
  - {{url: 'http://127.0.0.1:9/a', proxy_from_environment: true, oauth2: {{client_id: c, token_url: 'http://t'}}}}
  - {{url: 'http://127.0.0.1:9/b', azuread: {{cloud: AzurePublic}}}}
  - {{url: 'http://127.0.0.1:9/c', google_iam: {{credentials_file: /c.json}}}}
  - {{url: 'http://127.0.0.1:9/d', bearer_token_file: /t}}
  - {{url: 'http://127.0.0.1:9/e', basic_auth: {{username_file: /u, password_file: /p}}}}
  - {{url: 'http://127.0.0.1:9/f', authorization: {{type: Bearer, credentials_file: /c}}}}
"""
HONOURED_HERE = {"url", "name", "remote_timeout", "headers", "write_relabel_configs", "queue_config",
                 "metadata_config", "sigv4", "basic_auth", "authorization"}  # fmt: skip


def test_every_prometheus_remote_write_key_is_honoured_or_warned_never_an_error() -> None:
    config = parse_config(EVERY_KEY)
    amp = config.destinations[0]
    assert amp.queue == QueueConfig(500, 2.0, 20, 0.05, 10.0, 1800.0, 1024**3, 20.0, min_shards=2)
    assert amp.sigv4 == SigV4Config("us-east-1", "arn:aws:iam::123456789012:role/amp-writer", "gpu", "prod", "aps",
                                    "AKIAEXAMPLE", "s3cr3t")  # fmt: skip
    assert (amp.send_metadata, dict(amp.headers)) == (False, {"X-Team": "gpu"})
    warned = {w.split(": ")[1] for w in config.warnings}
    top = {k for k in promremote.HONOURED + tuple(promremote.NOT_HONOURED) if k not in HONOURED_HERE}
    expected = {f"remote_write[0].{k}" for k in top if k not in
                ("oauth2", "azuread", "google_iam", "bearer_token_file", "proxy_from_environment", "bearer_token")}
    expected |= {f"remote_write[0].queue_config.{k}" for k in promremote.QUEUE_NOT_HONOURED}
    expected |= {f"remote_write[0].metadata_config.{k}" for k in promremote.METADATA_NOT_HONOURED}
    expected |= {"remote_write[0].sigv4.use_fips_sts_endpoint", "remote_write[1].proxy_from_environment",
                 "remote_write[1].oauth2", "remote_write[2].azuread", "remote_write[3].google_iam",
                 "remote_write[4].bearer_token_file", "remote_write[5].basic_auth.username_file",
                 "remote_write[5].basic_auth.password_file", "remote_write[6].authorization.credentials_file"}
    assert warned == expected

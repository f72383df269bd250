from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from relay.config.config import (
    AggregateConfig,
    Config,
    ConfigError,
    ConfigIssue,
    DestinationConfig,
    LimitsConfig,
    QueueConfig,
    ScrapeConfig,
    ServerConfig,
    SigV4Config,
    load_config,
    parse_config,
)
from relay.rules.relabel import process
from tests.helpers import TEST_DATA

DATA = TEST_DATA / "configs"
D = "destinations:\n  - name: a\n    url: http://127.0.0.1:9/w\n"  # lines 1-3; a destination's keys follow
QUEUE_KEYS = (
    "max_samples_per_send, batch_send_deadline, max_shards, min_shards, min_backoff, max_backoff, max_sample_age, "
    "max_disk, timeout, on_auth_error"
)

# (yaml text, every error str(ConfigError) must list, in line order)
BAD_CONFIGS = {
    "unknown top-level key": (
        "serverx: {}\n" + D,
        [
            "relay.yaml:1: serverx: unknown key "
            "(valid: server, external_labels, global, storage, scrape, remote_write, destinations)"
        ],
    ),
    "unknown key in server": (
        "server:\n  lisen: x\n" + D,
        [
            "relay.yaml:2: server.lisen: unknown key (valid: listen, max_request_bytes, telemetry_listen, "
            "max_concurrent_requests, read_timeout, idle_timeout, enable_lifecycle, decision_cache)"
        ],
    ),
    "unknown key in a destination's queue": (
        D + "    queue:\n      max_backof: 5s\n",
        [f"relay.yaml:5: destinations[0].queue.max_backof: unknown key (valid: {QUEUE_KEYS})"],
    ),
    "unknown key in sigv4": (
        D + "    sigv4: {region: us-east-1, secret: x}\n",
        [
            "relay.yaml:4: destinations[0].sigv4.secret: unknown key "
            "(valid: region, role_arn, external_id, profile, service, access_key, secret_key)"
        ],
    ),
    "unknown key in a static_config": (
        "scrape:\n  - job_name: j\n    static_configs:\n      - targets: ['h:1']\n        labels: {a: b}\n"
        + D,
        ["relay.yaml:5: scrape[0].static_configs[0].labels: unknown key (valid: targets)"],
    ),
    "bad duration": (
        D + "    queue:\n      max_backoff: 5q\n",
        ['relay.yaml:5: destinations[0].queue.max_backoff: invalid duration "5q"'],
    ),
    "duration without a unit": (
        D + "    queue: {timeout: 30}\n",
        ['relay.yaml:4: destinations[0].queue.timeout: invalid duration "30"'],
    ),
    "duration of the wrong type": (
        D + "    queue: {timeout: [30s]}\n",
        ['relay.yaml:4: destinations[0].queue.timeout: expected a duration like "30s", got a list'],
    ),
    "bad size": (
        "server:\n  max_request_bytes: 32MiBs\n" + D,
        [
            'relay.yaml:2: server.max_request_bytes: invalid size "32MiBs" '
            "(unknown unit 'MiBs'; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)"
        ],
    ),
    "zero size": (
        D + "    queue: {max_disk: 0GiB}\n",
        ["relay.yaml:4: destinations[0].queue.max_disk: must be greater than 0"],
    ),
    "list where a string belongs": (
        "destinations:\n  - name: [a]\n    url: http://x/\n",
        ["relay.yaml:2: destinations[0].name: expected a string, got a list"],
    ),
    "string where a list belongs": (
        D + "    prune_labels: pod\n",
        ["relay.yaml:4: destinations[0].prune_labels: expected a list, got a string"],
    ),
    "mapping where a list belongs": (
        "destinations: {name: a}\n",
        ["relay.yaml:1: destinations: expected a list, got a mapping"],
    ),
    "null label value": (
        "external_labels: {a: }\n" + D,
        ["relay.yaml:1: external_labels.a: expected a string, got null"],
    ),
    "zero integer": (
        D + "    queue: {max_shards: 0}\n",
        ["relay.yaml:4: destinations[0].queue.max_shards: must be a positive integer, got 0"],
    ),
    "string where an integer belongs": (
        D + "    queue: {max_shards: eight}\n",
        ["relay.yaml:4: destinations[0].queue.max_shards: expected an integer, got a string"],
    ),
    "not a boolean": (
        D + "    dry_run: maybe\n",
        ["relay.yaml:4: destinations[0].dry_run: expected true or false, got a string"],
    ),
    "limits": (
        D + "    limits: {max_series: -1, max_series_per_metric: 1.5, window: 0s}\n",
        [
            "relay.yaml:4: destinations[0].limits.max_series: must be a positive integer, got -1",
            "relay.yaml:4: destinations[0].limits.max_series_per_metric: expected an integer, got a number",
            "relay.yaml:4: destinations[0].limits.window: must be greater than 0",
        ],
    ),
    "no destinations key": (
        "server: {}\n",
        ["relay.yaml:1: destinations: missing required key (or remote_write)"],
    ),
    "empty destinations": (
        "destinations: []\n",
        ["relay.yaml:1: destinations: at least one destination is required"],
    ),
    "missing name and url": (
        "destinations:\n  - dry_run: true\n",
        [
            "relay.yaml:2: destinations[0].name: missing required key",
            "relay.yaml:2: destinations[0].url: missing required key",
        ],
    ),
    "duplicate destination names": (
        D + "  - name: a\n    url: http://x/\n",
        ['relay.yaml:4: destinations[1].name: duplicate name "a" (first at line 2)'],
    ),
    "bad name and url scheme": (
        "destinations:\n  - name: a b\n    url: ftp://x/\n",
        [
            'relay.yaml:2: destinations[0].name: invalid name "a b": use letters, digits, "_" and "-" only',
            'relay.yaml:3: destinations[0].url: URL scheme must be http or https, got "ftp"',
        ],
    ),
    "url without host": (
        "destinations:\n  - name: a\n    url: http:///x\n",
        ["relay.yaml:3: destinations[0].url: URL has no host"],
    ),
    "url with bad port": (
        "destinations:\n  - name: a\n    url: http://h:99999/x\n",
        ["relay.yaml:3: destinations[0].url: invalid URL: Port out of range 0-65535"],
    ),
    "sigv4 without region": (
        D + "    sigv4: {profile: p}\n",
        ["relay.yaml:4: destinations[0].sigv4.region: missing required key"],
    ),
    "sigv4 external_id without role_arn, bad role": (
        D + "    sigv4: {region: us-east-1, external_id: x}\n  - name: b\n    url: http://h/\n"
        "    sigv4: {region: US East, role_arn: 'role/x'}\n",
        [
            "relay.yaml:4: destinations[0].sigv4.external_id: requires role_arn",
            'relay.yaml:7: destinations[1].sigv4.region: invalid region "US East"',
            "relay.yaml:7: destinations[1].sigv4.role_arn: must be an IAM role ARN "
            '("arn:aws:iam::<account>:role/<name>")',
        ],
    ),
    "reserved headers": (
        D + "    sigv4: {region: us-east-1}\n    headers:\n      Authorization: x\n      content-type: y\n"
        "      X-Scope-OrgID: ok\n      'bad header': z\n",
        [
            "relay.yaml:6: destinations[0].headers.Authorization: "
            "reserved header when sigv4 is set: the relay sets it",
            "relay.yaml:7: destinations[0].headers.content-type: reserved header: the relay sets it",
            "relay.yaml:9: destinations[0].headers.bad header: invalid header name",
        ],
    ),
    "aggregate with both without and by": (
        D
        + "    aggregate:\n      - match: up\n        without: [a]\n        by: [b]\n        interval: 30s\n"
        "        outputs: [sum]\n",
        ["relay.yaml:5: destinations[0].aggregate[0]: set exactly one of without or by"],
    ),
    "aggregate with neither, zero interval, bad outputs": (
        D + "    aggregate:\n      - match: up\n        interval: 0s\n        outputs: [median, sum, sum]\n",
        [
            "relay.yaml:5: destinations[0].aggregate[0]: set exactly one of without or by",
            "relay.yaml:6: destinations[0].aggregate[0].interval: must be greater than 0",
            'relay.yaml:7: destinations[0].aggregate[0].outputs[0]: unknown output "median" '
            "(valid: sum, avg, min, max, count_series, last, total)",
            'relay.yaml:7: destinations[0].aggregate[0].outputs[2]: duplicate output "sum"',
        ],
    ),
    "aggregate with a bad selector, empty by and outputs": (
        D
        + "    aggregate:\n      - match: 'up{'\n        by: []\n"
        + "        interval: 30s\n        outputs: []\n",
        [
            "relay.yaml:5: destinations[0].aggregate[0].match: "
            "invalid selector: expected '}' (at position 3)",
            "relay.yaml:6: destinations[0].aggregate[0].by: must list at least one label",
            "relay.yaml:8: destinations[0].aggregate[0].outputs: must list at least one output",
        ],
    ),
    "aggregate missing keys, without __name__": (
        D + "    aggregate:\n      - without: [__name__]\n",
        [
            "relay.yaml:5: destinations[0].aggregate[0].match: missing required key",
            "relay.yaml:5: destinations[0].aggregate[0].without[0]: the metric name is always kept",
            "relay.yaml:5: destinations[0].aggregate[0].interval: missing required key",
            "relay.yaml:5: destinations[0].aggregate[0].outputs: missing required key",
        ],
    ),
    "min_backoff above max_backoff": (
        D + "    queue:\n      min_backoff: 10s\n      max_backoff: 5s\n",
        ["relay.yaml:5: destinations[0].queue.min_backoff: must not be greater than max_backoff"],
    ),
    "prune __name__ and an invalid label": (
        D + "    prune_labels: [pod, __name__, a-b]\n",
        [
            "relay.yaml:4: destinations[0].prune_labels[1]: __name__ cannot be pruned",
            'relay.yaml:4: destinations[0].prune_labels[2]: invalid label name "a-b"',
        ],
    ),
    "external labels": (
        "external_labels:\n  __x: y\n  a-b: c\n  ok: ''\n" + D,
        [
            'relay.yaml:2: external_labels.__x: label names starting with "__" are reserved: "__x"',
            'relay.yaml:3: external_labels.a-b: invalid label name "a-b"',
            "relay.yaml:4: external_labels.ok: empty value (an empty label value means no label)",
        ],
    ),
    "global relabel error on its line": (
        "global:\n  relabel_configs:\n    - action: keep\n      regex: '('\n" + D,
        ['relay.yaml:4: global.relabel_configs[0].regex: error parsing regexp "(": missing ): ^(?s:()$'],
    ),
    "write relabel error names the rule": (
        D
        + "    write_relabel_configs:\n      - {source_labels: [a], regex: x, action: keep}\n"
        + "      - action: replace\n",
        [
            "relay.yaml:6: destinations[0].write_relabel_configs[1].target_label: "
            "relabel configuration for replace action requires 'target_label' value",
        ],
    ),
    "write relabel rule that is not a mapping": (
        D + "    write_relabel_configs: [keep]\n",
        ["relay.yaml:4: destinations[0].write_relabel_configs[0]: expected a mapping, got a string"],
    ),
    "yaml syntax error": (
        "server:\n  listen: [\n" + D,
        ["relay.yaml:4: invalid YAML: expected the node content, but found '-'"],
    ),
    "yaml tab indentation": (
        "server:\n\tlisten: x\n",
        ["relay.yaml:2: invalid YAML: found character '\\t' that cannot start any token"],
    ),
    "duplicate key": (
        "server:\n  listen: 1.2.3.4:2\n  listen: 3.4.5.6:4\n" + D,
        ["relay.yaml:3: server.listen: duplicate key (first at line 2)"],
    ),
    "bad listen address": (
        "server: {listen: localhost}\n" + D,
        ['relay.yaml:1: server.listen: expected "host:port", got "localhost"'],
    ),
    "scrape": (
        "scrape:\n  - job_name: j\n    scrape_interval: 5s\n    scrape_timeout: 10s\n    scheme: ftp\n"
        "    metrics_path: metrics\n    static_configs: [{targets: ['localhost', 'h:1']}]\n  - job_name: j\n"
        + D,
        [
            "relay.yaml:4: scrape[0].scrape_timeout: must not be greater than scrape_interval",
            'relay.yaml:5: scrape[0].scheme: must be "http" or "https", got "ftp"',
            'relay.yaml:6: scrape[0].metrics_path: must start with "/"',
            'relay.yaml:7: scrape[0].static_configs[0].targets[0]: expected "host:port", got "localhost"',
            'relay.yaml:8: scrape[1].job_name: duplicate job_name "j" (first at line 2)',
        ],
    ),
    "empty strings": (
        "storage: {path: ''}\nscrape: [{job_name: ''}]\ndestinations:\n  - name: ''\n    url: ''\n"
        "    sigv4: {region: ''}\n    aggregate: [{match: '', by: [a], interval: 1s, outputs: [sum]}]\n",
        [
            "relay.yaml:1: storage.path: must not be empty",
            "relay.yaml:2: scrape[0].job_name: must not be empty",
            'relay.yaml:4: destinations[0].name: invalid name "": use letters, digits, "_" and "-" only',
            'relay.yaml:5: destinations[0].url: URL scheme must be http or https, got ""',
            'relay.yaml:6: destinations[0].sigv4.region: invalid region ""',
            "relay.yaml:7: destinations[0].aggregate[0].match: "
            "invalid selector: empty selector (at position 0)",
        ],
    ),
    "null required string": (
        "destinations:\n  - name:\n    url: http://h/\n",
        ["relay.yaml:2: destinations[0].name: expected a string, got null"],
    ),
    "non-string key": (
        "server: {[a]: 1}\n" + D,
        ["relay.yaml:1: server: keys must be strings, got a list"],
    ),
    # issue 8, defect 13: backoffs must be > 0
    "zero backoffs": (
        D + "    queue: {min_backoff: 0s, max_backoff: 0ms}\n",
        [
            "relay.yaml:4: destinations[0].queue.min_backoff: must be greater than 0",
            "relay.yaml:4: destinations[0].queue.max_backoff: must be greater than 0",
        ],
    ),
    "min_backoff above the default max_backoff": (
        D + "    queue: {min_backoff: 6s}\n",
        ["relay.yaml:4: destinations[0].queue.min_backoff: must not be greater than max_backoff"],
    ),
    # issue 8, defect 16: a null relabel rule is refused, in every relabel list
    "null write relabel rule": (
        D + "    write_relabel_configs: [null]\n",
        ["relay.yaml:4: destinations[0].write_relabel_configs[0]: empty or null relabeling rule"],
    ),
    "null entry among good write relabel rules": (
        D + "    write_relabel_configs:\n      - {source_labels: [a], regex: x, action: keep}\n      -\n",
        ["relay.yaml:6: destinations[0].write_relabel_configs[1]: empty or null relabeling rule"],
    ),
    "null global relabel rule": (
        "global:\n  relabel_configs:\n    - ~\n" + D,
        ["relay.yaml:3: global.relabel_configs[0]: empty or null relabeling rule"],
    ),
    "null remote_write relabel rule": (
        "remote_write:\n  - url: http://127.0.0.1:9/w\n    write_relabel_configs: [null]\n",
        ["relay.yaml:3: remote_write[0].write_relabel_configs[0]: empty or null relabeling rule"],
    ),
    # interface 4: the server's new fields
    "server limits and timeouts": (
        "server: {telemetry_listen: 'localhost', max_concurrent_requests: 0, read_timeout: 0s, "
        "idle_timeout: 2x, enable_lifecycle: yes-please}\n" + D,
        [
            'relay.yaml:1: server.telemetry_listen: expected "host:port", got "localhost"',
            "relay.yaml:1: server.max_concurrent_requests: must be a positive integer, got 0",
            "relay.yaml:1: server.read_timeout: must be greater than 0",
            'relay.yaml:1: server.idle_timeout: invalid duration "2x"',
            "relay.yaml:1: server.enable_lifecycle: expected true or false, got a string",
        ],
    ),
    "telemetry on the write address": (
        "server: {listen: '127.0.0.1:9201', telemetry_listen: '127.0.0.1:9201'}\n" + D,
        [
            "relay.yaml:1: server.telemetry_listen: must differ from listen "
            "(leave it out to serve telemetry on the write listener)"
        ],
    ),
    "bracketed IPv6 listen without its closing bracket": (
        "server: {listen: '[::1:9201'}\n" + D,
        ['relay.yaml:1: server.listen: expected "host:port", got "[::1:9201"'],
    ),
    "send_metadata not a boolean": (
        D + "    send_metadata: sometimes\n",
        ["relay.yaml:4: destinations[0].send_metadata: expected true or false, got a string"],
    ),
    "sigv4 access_key without secret_key": (
        D + "    sigv4: {region: us-east-1, access_key: AKIAEXAMPLE}\n",
        ["relay.yaml:4: destinations[0].sigv4.secret_key: set both access_key and secret_key, or neither"],
    ),
    # issue 10: __replica__ is allowed, other reserved names are not
    "reserved external label other than __replica__": (
        "external_labels: {__replica__: a, __name__: b, __replica: c}\n" + D,
        [
            'relay.yaml:1: external_labels.__name__: label names starting with "__" are reserved: "__name__"',
            'relay.yaml:1: external_labels.__replica: label names starting with "__" are reserved: "__replica"',
        ],
    ),
    # check-config's offline URL checks (issue 8): AMP region and trailing "/"
    "AMP URL region differs from sigv4.region": (
        "destinations:\n  - name: amp\n"
        "    url: https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write\n"
        "    sigv4:\n      region: us-east-1\n",
        [
            'relay.yaml:5: destinations[0].sigv4.region: "us-east-1" does not match the region of the '
            'AMP URL ("eu-west-1")'
        ],
    ),
    "AMP URL ending in a slash": (
        "destinations:\n  - name: amp\n"
        "    url: https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write/\n"
        "    sigv4: {region: us-east-1}\n",
        [
            'relay.yaml:3: destinations[0].url: must not end in "/" '
            '(AMP answers 403 "Missing Authentication Token")'
        ],
    ),
    "top level is a list": ("- a\n", ["relay.yaml:1: expected a mapping, got a list"]),
    "empty file": ("", ["relay.yaml:1: empty config: at least one destination is required"]),
    "two documents": (D + "---\n" + D, ["relay.yaml:4: invalid YAML: but found another document"]),
}


@pytest.mark.parametrize(("text", "expected"), BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_config_reports_every_error_with_file_line_and_path(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert str(info.value).splitlines() == expected
    assert [str(issue) for issue in info.value.errors] == expected


def test_config_error_is_a_value_error_carrying_issues() -> None:
    with pytest.raises(ValueError) as info:
        parse_config(D + "    queue:\n      max_backoff: 5q\n", "relay.yaml")
    assert isinstance(info.value, ConfigError)
    assert info.value.errors == [
        ConfigIssue("relay.yaml", 5, "destinations[0].queue.max_backoff", 'invalid duration "5q"')
    ]
    assert str(info.value) == 'relay.yaml:5: destinations[0].queue.max_backoff: invalid duration "5q"'


def test_load_config_reports_all_errors_of_a_file_sorted_by_line() -> None:
    path = DATA / "many-errors.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = [(e.line, e.path) for e in info.value.errors]
    assert lines == [
        (4, "server.max_request_bytes"),
        (5, "external_labels.__reserved"),
        (10, "destinations[0].headers.Authorization"),
        (12, "destinations[0].queue.max_backoff"),
        (13, "destinations[0].queue.max_shard"),
        (14, "destinations[1].name"),
        (15, "destinations[1].url"),
        (16, "destinations[1].prune_labels[0]"),
    ]
    assert all(e.file == str(path) for e in info.value.errors)


def test_errors_never_echo_header_values() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(DATA / "many-errors.yaml")
    assert "secret" not in str(info.value)


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(DATA / "syntax-error.yaml")
    (issue,) = info.value.errors
    assert issue.line == 3
    assert issue.message.startswith("invalid YAML: ")


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(info.value) == f"{missing}: cannot read the config: No such file or directory"


def test_design_example_loads_with_every_field(tmp_path: Path) -> None:
    config = load_config(DATA / "design-example.yaml")
    assert config.server == ServerConfig("127.0.0.1:9201", 32 * 1024**2)
    assert config.external_labels == (("cluster", "gpu-prod"),)
    assert config.global_relabel == ()
    assert config.storage_path == Path("/var/lib/gpu-relay")
    assert config.scrape == (ScrapeConfig("gpu", 15.0, 10.0, ("127.0.0.1:9400",), "/metrics", "http"),)
    assert config.source == str(DATA / "design-example.yaml")
    (amp,) = config.destinations
    assert amp.name == "amp"
    assert (
        amp.url == "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-EXAMPLE/api/v1/remote_write"
    )
    assert amp.sigv4 == SigV4Config(region="us-east-1")
    assert dict(amp.headers) == {}
    assert len(amp.write_relabel_configs) == 1
    util = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"))
    assert process(util, amp.write_relabel_configs) == util
    assert process((("__name__", "DCGM_FI_DEV_SM_CLOCK"),), amp.write_relabel_configs) is None
    assert amp.prune_labels == ("pci_bus_id", "DCGM_FI_DRIVER_VERSION")
    assert amp.aggregate == (
        AggregateConfig('{__name__=~"DCGM_FI_DEV_.*"}', ("pod", "container"), (), 30.0, ("avg", "max")),
    )
    assert amp.limits == LimitsConfig(2_000_000, 100_000, 3600.0)
    assert amp.queue == QueueConfig(1000, 5.0, 8, 0.03, 5.0, 3600.0, 1024**3, 30.0)
    assert amp.dry_run is False


def test_minimal_config_takes_every_default() -> None:
    config = parse_config("destinations: [{name: d, url: 'http://127.0.0.1:1/w'}]\n")
    assert config == Config(
        destinations=(DestinationConfig("d", "http://127.0.0.1:1/w"),), source="relay.yaml"
    )
    assert config.server.listen == "127.0.0.1:9201"
    assert config.destinations[0].queue == QueueConfig()
    assert QueueConfig().min_backoff == 0.03 and QueueConfig().max_disk == 1024**3


def test_null_sections_mean_defaults() -> None:
    config = parse_config("server:\nglobal:\nexternal_labels:\nscrape:\n" + D + "    sigv4:\n    headers:\n")
    assert config.server == ServerConfig()
    assert config.destinations[0].sigv4 is None
    assert config.scrape == ()


def test_scrape_timeout_defaults_to_at_most_the_interval() -> None:
    config = parse_config("scrape:\n  - {job_name: fast, scrape_interval: 5s}\n  - {job_name: slow}\n" + D)
    assert [(s.scrape_interval, s.scrape_timeout) for s in config.scrape] == [(5.0, 5.0), (15.0, 10.0)]


def test_aggregate_by_keeps_without_empty() -> None:
    config = parse_config(
        D + "    aggregate: [{match: up, by: [gpu], interval: 1m, outputs: [sum, total]}]\n"
    )
    assert config.destinations[0].aggregate == (AggregateConfig("up", (), ("gpu",), 60.0, ("sum", "total")),)


def test_yaml_anchors_and_merge_keys_are_supported() -> None:
    text = (
        "destinations:\n"
        "  - name: a\n    url: http://h/a\n    queue: &q {max_shards: 2, max_backoff: 1m}\n"
        "  - name: b\n    url: http://h/b\n    queue: {<<: *q, max_shards: 4}\n"
    )
    a, b = parse_config(text).destinations
    assert (a.queue.max_shards, a.queue.max_backoff) == (2, 60.0)
    assert (b.queue.max_shards, b.queue.max_backoff) == (4, 60.0)


def test_headers_are_read_only_and_authorization_is_allowed_without_sigv4() -> None:
    config = parse_config(D + "    headers: {Authorization: Bearer t, X-Scope-OrgID: gpu}\n")
    headers = config.destinations[0].headers
    assert dict(headers) == {"Authorization": "Bearer t", "X-Scope-OrgID": "gpu"}
    with pytest.raises(TypeError):
        headers["X"] = "y"  # type: ignore[index]


def test_sigv4_optional_fields() -> None:
    text = D + (
        "    sigv4: {region: us-west-2, role_arn: 'arn:aws:iam::123456789012:role/w', external_id: e, "
        "profile: p, service: aps}\n"
    )
    sigv4 = parse_config(text).destinations[0].sigv4
    assert sigv4 == SigV4Config("us-west-2", "arn:aws:iam::123456789012:role/w", "e", "p", "aps")


def test_config_is_frozen() -> None:
    config = parse_config(D)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.destinations[0].name = "x"  # type: ignore[misc]


def test_equal_files_give_equal_configs(tmp_path: Path) -> None:
    copy = tmp_path / "relay.yaml"
    shutil.copy(DATA / "two-destinations.yaml", copy)
    a = load_config(DATA / "two-destinations.yaml")
    b = load_config(copy)
    assert dataclasses.replace(a, source="x") == dataclasses.replace(b, source="x")
    assert [d.name for d in a.destinations] == ["amp", "local"]
    assert a.destinations[1].queue.min_backoff == 0.01


def test_server_fields_of_interface_4_are_read() -> None:
    text = (
        "server:\n  listen: '[::1]:9201'\n  telemetry_listen: ':9202'\n  max_concurrent_requests: 8\n"
        "  read_timeout: 5s\n  idle_timeout: 1m\n  enable_lifecycle: true\n" + D
    )
    assert parse_config(text).server == ServerConfig("[::1]:9201", 32 * 1024**2, ":9202", 8, 5.0, 60.0, True)


def test_server_defaults_of_interface_4() -> None:
    server = parse_config(D).server
    assert (server.telemetry_listen, server.max_concurrent_requests) == (None, 64)
    assert (server.read_timeout, server.idle_timeout, server.enable_lifecycle) == (30.0, 120.0, False)


def test_send_metadata_defaults_to_true_and_can_be_turned_off() -> None:
    assert parse_config(D).destinations[0].send_metadata is True
    assert parse_config(D + "    send_metadata: false\n").destinations[0].send_metadata is False


def test_sigv4_static_keys_are_read_and_the_secret_is_never_shown() -> None:
    config = parse_config(D + "    sigv4: {region: us-east-1, access_key: AKIAEXAMPLE, secret_key: s3cr3t}\n")
    sigv4 = config.destinations[0].sigv4
    assert sigv4 is not None and (sigv4.access_key, sigv4.secret_key) == ("AKIAEXAMPLE", "s3cr3t")
    assert "s3cr3t" not in repr(config)


def test_replica_external_label_is_allowed_for_amp_ha_dedup() -> None:
    config = parse_config("external_labels: {cluster: prod, __replica__: prometheus-0}\n" + D)
    assert config.external_labels == (("__replica__", "prometheus-0"), ("cluster", "prod"))


def test_a_good_config_has_no_warnings() -> None:
    assert load_config(DATA / "design-example.yaml").warnings == ()


def test_a_plain_receiver_url_ending_in_a_slash_is_a_warning_not_an_error() -> None:
    config = parse_config("destinations:\n  - name: a\n    url: http://127.0.0.1:9/w/\n")
    assert config.warnings == ('relay.yaml:3: destinations[0].url: ends in "/": most receivers answer 404 for it',)


def test_null_relabel_rule_never_silently_drops_the_other_rules() -> None:
    # before: [rule, null] loaded as no rules at all, so the keep rule vanished and everything was sent
    with pytest.raises(ConfigError, match="empty or null relabeling rule"):
        parse_config(D + "    write_relabel_configs:\n      - {source_labels: [__name__], regex: x, action: keep}\n"
                     "      - null\n")


@pytest.mark.parametrize(
    ("listen", "telemetry"),
    [(":9201", "127.0.0.1:9201"), ("127.0.0.1:9201", ":9201"), ("0.0.0.0:9201", "127.0.0.1:9201"),
     ("[::]:9201", "[::1]:9201"), ("127.0.0.1:9201", "0.0.0.0:9201")],
)  # fmt: skip
def test_telemetry_listen_that_binds_the_write_port_too_is_refused(listen: str, telemetry: str) -> None:
    with pytest.raises(ConfigError, match=r"relay.yaml:1: server.telemetry_listen: must differ from listen"):
        parse_config(f"server: {{listen: '{listen}', telemetry_listen: '{telemetry}'}}\n" + D)


@pytest.mark.parametrize(
    ("listen", "telemetry"),
    [("127.0.0.1:9201", ":9202"), ("127.0.0.1:9201", "127.0.0.2:9201"), ("127.0.0.1:9201", "[::1]:9201")],
)
def test_telemetry_listen_on_another_port_or_address_is_fine(listen: str, telemetry: str) -> None:
    config = parse_config(f"server: {{listen: '{listen}', telemetry_listen: '{telemetry}'}}\n" + D)
    assert config.server.telemetry_listen == telemetry


def test_decision_cache_budget_is_a_size_with_a_default() -> None:
    """server.decision_cache bounds the per-label-set decision cache (64MiB unless set: fits a 512Mi sidecar)."""
    base = "destinations:\n  - {name: a, url: 'http://127.0.0.1:1/api/v1/write'}\n"
    assert parse_config(base).server.decision_cache == 64 * 1024 * 1024
    assert parse_config("server: {decision_cache: 1GiB}\n" + base).server.decision_cache == 1 << 30
    with pytest.raises(ConfigError, match=r"relay.yaml:1: server.decision_cache"):
        parse_config("server: {decision_cache: lots}\n" + base)

"""docs/relay-config.md documents every key of the config schema: this walks the parsers' key
tables (and checks them against the dataclasses they fill), so neither the doc nor a table can drift."""

from __future__ import annotations

import dataclasses
import re

import pytest

from relay.config import config, promremote
from relay.config import parts as config_parts
from relay.config.model import (
    AggregateConfig,
    DestinationConfig,
    LimitsConfig,
    QueueConfig,
    ScrapeConfig,
    ServerConfig,
    SigV4Config,
)
from relay.config.promremote import default_name
from relay.rules import relabel_config
from tests.helpers import REPO_ROOT, TEST_DATA

DOC = REPO_ROOT / "docs" / "relay-config.md"

SECTIONS: dict[str, tuple[str, ...]] = {
    "": config.ROOT_KEYS,
    "server.": config.SERVER_KEYS,
    "global.": ("relabel_configs",),
    "relabel_configs[].": relabel_config.FIELDS,  # one rule of any of the three relabel lists
    "storage.": ("path",),
    "scrape[].": config.SCRAPE_KEYS,
    "scrape[].static_configs[].": ("targets",),
    "destinations[].": config.DESTINATION_KEYS,
    "destinations[].sigv4.": config.SIGV4_KEYS,
    "destinations[].aggregate[].": config.AGGREGATE_KEYS,
    "destinations[].limits.": config.LIMITS_KEYS,
    "destinations[].queue.": config_parts.QUEUE_KEYS,
    "remote_write[].": promremote.HONOURED + tuple(promremote.NOT_HONOURED),
    "remote_write[].sigv4.": promremote.SIGV4_KEYS,
    "remote_write[].queue_config.": tuple(promremote.QUEUE_HONOURED) + tuple(promremote.QUEUE_NOT_HONOURED),
    "remote_write[].metadata_config.": ("send", *promremote.METADATA_NOT_HONOURED),
    "remote_write[].basic_auth.": promremote.BASIC_AUTH_KEYS,
    "remote_write[].authorization.": promremote.AUTHORIZATION_KEYS,
}
ALL_KEYS = [prefix + key for prefix, keys in SECTIONS.items() for key in keys]


def documented_rows() -> set[str]:
    """Keys of the doc's table rows: the first cell, in backticks."""
    return set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(encoding="utf-8"), flags=re.M))


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_config_key_has_a_row_in_the_reference(key: str) -> None:
    assert key in documented_rows(), f"{key} is missing from {DOC.name}"


def test_every_documented_key_exists() -> None:
    env_forms = {"${VAR}", "${VAR:-default}", "$$"}
    assert documented_rows() - set(ALL_KEYS) - env_forms == set()


def test_every_documented_row_has_type_default_and_meaning_cells() -> None:
    rows = [r for r in DOC.read_text(encoding="utf-8").splitlines() if re.match(r"^\| `[^`]+` \| ", r)]
    keys = [r for r in rows if not r.startswith(("| `${", "| `$$"))]
    assert len(keys) == len(ALL_KEYS)
    cells = [[c.strip() for c in r.strip().strip("|").split(" | ")] for r in keys]
    assert [c[0] for c in cells if len(c) != 4 or not all(c)] == []


@pytest.mark.parametrize(
    ("cls", "keys", "renamed"),
    [
        (ServerConfig, config.SERVER_KEYS, {}),
        (DestinationConfig, config.DESTINATION_KEYS, {}),
        (SigV4Config, config.SIGV4_KEYS, {}),
        (AggregateConfig, config.AGGREGATE_KEYS, {}),
        (LimitsConfig, config.LIMITS_KEYS, {}),
        (QueueConfig, config_parts.QUEUE_KEYS, {}),
        (ScrapeConfig, config.SCRAPE_KEYS, {"targets": "static_configs"}),
    ],
)
def test_key_tables_cover_every_dataclass_field(
    cls: type, keys: tuple[str, ...], renamed: dict[str, str]
) -> None:
    fields = {renamed.get(f.name, f.name) for f in dataclasses.fields(cls)}
    assert fields == set(keys)


def test_every_root_section_is_a_config_field_or_a_destination_list() -> None:
    fields = {f.name for f in dataclasses.fields(config.Config)}
    mapped = {"global": "global_relabel", "storage": "storage_path", "remote_write": "destinations"}
    assert {mapped.get(k, k) for k in config.ROOT_KEYS} <= fields


def test_the_reference_examples_parse() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 10
    whole = "\n".join(b for b in blocks if b.startswith(("server:", "global:", "scrape:")))
    dest = next(b for b in blocks if b.startswith("destinations:"))
    rw = next(b for b in blocks if b.startswith("remote_write:"))
    text = whole + dest + rw.replace("ws-0123", "ws-4567")
    parsed = config.parse_config(text.replace("${POD_NAME}", "p"), env={})
    assert [d.name for d in parsed.destinations] == ["amp", default_name("https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-4567/api/v1/remote_write")]


def test_the_moved_entry_example_is_the_seed_s_remote_write_entry_as_a_dry_run_destination() -> None:
    """The doc says how to move a pasted entry to destinations: (for dry_run, prune_labels...); its
    example, the seed's AMP entry moved, must be the same destination as the pasted one, dry run aside."""
    from relay.config.promimport import import_prometheus

    seed = TEST_DATA / "prometheus" / "seed.yml"
    pasted = config.parse_config(import_prometheus(seed).relay_config, env={}).destinations
    text = DOC.read_text(encoding="utf-8")
    heading = "### Moving a `remote_write` entry to `destinations:`"
    assert heading in text
    block = re.findall(r"```yaml\n(.*?)```", text.split(heading, 1)[1], flags=re.S)[0]
    moved = config.parse_config(block, env={})
    assert moved.warnings == ()  # nothing left that the relay does not honour
    assert [d.dry_run for d in moved.destinations] == [True]
    assert [dataclasses.replace(d, dry_run=False) for d in moved.destinations] == list(pasted)


def test_relabel_rule_keys_are_the_fields_of_the_rule_model() -> None:
    fields = {f.name for f in dataclasses.fields(relabel_config.RelabelConfig) if f.init}  # not the caches
    assert set(relabel_config.FIELDS) == fields

"""``gpu-relay import-prometheus prometheus.yml``: move Prometheus's remote_write behind the relay.

It reads prometheus.yml's ``remote_write`` or the prometheus-operator's camelCase form (a
kube-prometheus-stack values file, a Prometheus resource, a bare list: :mod:`relay.config.operator`),
and prints the entry for Prometheus in the form it came in.

From a Prometheus config it builds
- a relay config: ``external_labels`` from ``global.external_labels`` and every ``remote_write``
  entry as it is (the relay reads Prometheus's syntax; what it cannot honour it warns about), an
  unnamed AMP entry named ``amp`` and a name the relay cannot use made of its letters, digits and ``-``; and
- the one ``remote_write`` entry Prometheus keeps, pointing at the relay. When every original entry
  starts with a ``keep`` on ``__name__``, that entry keeps the union of their regexes, so Prometheus
  sends the relay only what some destination wants; ``send_exemplars`` / ``send_native_histograms``
  carry over when any original entry set them.

Credentials are copied as they are (the relay needs them); :attr:`Imported.credentials` names
each one so that the CLI can say so without printing it.

``$`` in copied values is written ``$$``, so the relay's ``${VAR}`` expansion gives back exactly
Prometheus's text; relabel rules are copied as they are (the relay never expands them either); in
external label values Prometheus's own ``$VAR`` / ``${VAR}`` stay variables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from relay.config import operator as operator_form
from relay.config.envexpand import RULE_KEYS
from relay.config.parts import DEST_NAME_RE, amp_region

RELAY_WRITE_URL = "http://127.0.0.1:9201/api/v1/write"
ENTRY_NAME = "gpu-relay"
_OS_EXPAND = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)|\$")


class ImportError_(ValueError):
    """The Prometheus config cannot be imported; the message names the file (and line when known)."""


@dataclass(frozen=True)
class Imported:
    relay_config: str  # YAML text, valid for check-config
    prometheus_entry: str  # YAML text: ``remote_write:`` with the one entry pointing at the relay
    skipped: tuple[str, ...]  # notes about entries left out (one already pointing at the relay)
    credentials: tuple[str, ...] = ()  # paths of the secrets copied in clear into relay_config


def import_prometheus(
    path: str | Path, relay_url: str = RELAY_WRITE_URL, storage: str = "/var/lib/gpu-relay"
) -> Imported:
    filename = str(path)
    listen = _listen_of(relay_url)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ImportError_(f"{filename}: cannot read: {reason}") from e
    try:
        doc = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark is not None else 1
        raise ImportError_(f"{filename}:{line}: invalid YAML: {e.problem}") from e
    except yaml.YAMLError as e:
        raise ImportError_(f"{filename}: invalid YAML: {e}") from e
    operator = None if isinstance(doc, dict) and "remote_write" in doc else operator_form.find_remote_write(doc)
    notes: list[str] = []
    if operator is not None:  # kube-prometheus-stack values, a Prometheus CR or a bare list: camelCase
        op_entries, op_external, where = operator
        entries_in = [operator_form.to_prometheus(e, f"{where}[{i}]", notes) for i, e in enumerate(op_entries)]
        doc = {"global": {"external_labels": op_external}, "remote_write": entries_in}
    if not isinstance(doc, dict):
        raise ImportError_(f"{filename}: not a Prometheus config (expected a mapping, or a list of remote write "
                           "entries)")
    entries = doc.get("remote_write") or []
    if not isinstance(entries, list):
        raise ImportError_(f"{filename}: remote_write: expected a list")
    originals: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    skipped: list[str] = notes
    credentials: list[str] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "url" not in entry:
            raise ImportError_(f"{filename}: remote_write[{i}]: expected a mapping with a url")
        if str(entry["url"]).rstrip("/") == relay_url.rstrip("/"):
            skipped.append(f"remote_write[{i}] already writes to the relay ({entry['url']}): left out")
            continue
        originals.append(entry)
        kept.append(_relay_entry(entry))
        credentials.extend(f"remote_write[{i}].{p}" for p in _secrets(entry))
    _unique_names(originals, kept)
    _name_amp_entries(kept)
    if not kept:
        raise ImportError_(f"{filename}: no remote_write entry to import (looked for remote_write:, "
                           "prometheus.prometheusSpec.remoteWrite, a Prometheus resource's spec.remoteWrite "
                           "and a list of entries)")
    glob = doc.get("global") or {}
    external = glob.get("external_labels") if isinstance(glob, dict) else None
    relay: dict[str, Any] = {"server": {"listen": listen}}
    if isinstance(external, dict) and external:
        relay["external_labels"] = {str(k): _Quoted(_external_value(str(v))) for k, v in external.items()}
    relay["storage"] = {"path": _escape(storage)}
    relay["remote_write"] = kept
    header = (
        f"# gpu-relay config imported from {filename} by gpu-relay import-prometheus.\n"
        "# Check it with: gpu-relay check-config <this file>. For dry_run, prune_labels, aggregate or limits,\n"
        '# move the entry to destinations: ("Moving a `remote_write` entry to `destinations:`" in\n'
        "# docs/relay-config.md). The queues are stored under storage.path (import with --storage-path DIR).\n"
    )
    entry = _prometheus_entry(entries, originals, relay_url, None if operator is None else operator[2])
    return Imported(header + _dump(relay), entry, tuple(skipped), tuple(credentials))


# (section or "", key) of the secrets of a remote_write entry (Prometheus's <secret> fields)
SECRETS = (("sigv4", "secret_key"), ("basic_auth", "password"), ("authorization", "credentials"),
           ("", "bearer_token"), ("oauth2", "client_secret"))  # fmt: skip


def _secrets(entry: dict[str, Any]) -> list[str]:
    """The paths of the non-empty secrets in an entry, as they are copied into the relay config."""
    found = []
    for section, key in SECRETS:
        holder = entry.get(section) if section else entry
        if isinstance(holder, dict) and holder.get(key) not in (None, ""):
            found.append(f"{section}.{key}" if section else key)
    return found


def _unique_names(originals: list[dict[str, Any]], kept: list[dict[str, Any]]) -> None:
    """A name made of one the relay cannot use never takes a name an entry gives itself (-2, -3...)."""
    given = {e.get("name") for e in originals}
    taken: set[Any] = set()
    for original, entry in zip(originals, kept, strict=True):
        name = entry.get("name")
        if name != original.get("name"):  # made from an unusable name
            base, n = name, 1
            while name in given or name in taken:
                n += 1
                name = f"{base}-{n}"
            entry["name"] = name
        taken.add(name)


def _relay_entry(entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: v if k in RULE_KEYS else _escaped(v) for k, v in entry.items()}
    name = out.get("name")
    if isinstance(name, str) and name and not DEST_NAME_RE.fullmatch(name):
        out["name"] = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    return out


def _name_amp_entries(entries: list[dict[str, Any]]) -> None:
    """An unnamed AMP entry is named ``amp`` (``amp-2``, ... when taken): a name to read in logs."""
    taken = {e.get("name") for e in entries}
    for entry in entries:
        if not entry.get("name") and amp_region(str(entry["url"])) is not None:
            name = next(n for n in ("amp", *(f"amp-{i}" for i in range(2, len(entries) + 2))) if n not in taken)
            entry["name"] = name
            taken.add(name)


def _prometheus_entry(originals: list[Any], imported: list[dict[str, Any]], relay_url: str,
                      operator_at: str | None = None) -> str:
    """The entry pointing at the relay: the union of the imported entries' leading keep rules (when
    each has one), and the exemplar / native histogram flags of any entry, the relay's own included.
    In the operator's camelCase, at the place the entries came from, when they came in that form."""
    entry: dict[str, Any] = {"url": relay_url, "name": ENTRY_NAME}
    regexes = [_leading_keep(e) for e in imported]
    if regexes and all(r is not None for r in regexes):
        union = "|".join(f"(?:{r})" for r in dict.fromkeys(r for r in regexes if r is not None))
        entry["write_relabel_configs"] = [{"source_labels": ["__name__"], "regex": union, "action": "keep"}]
    for flag in ("send_exemplars", "send_native_histograms"):
        if any(isinstance(e, dict) and e.get(flag) is True for e in originals):
            entry[flag] = True
    if operator_at is not None and operator_at != "the list":
        keys = operator_at.split(".")
        doc: Any = [operator_form.to_operator(entry)]
        for key in reversed(keys):
            doc = {key: doc}
        header = (
            f"# Put this in place of {operator_at} (Helm and the operator replace a list whole: this one\n"
            "# entry is the whole list): Prometheus writes to the relay, the relay does the rest.\n"
        )
        return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    if operator_at is not None:
        header = "# Put this in place of the remoteWrite list: Prometheus writes to the relay.\n"
        return header + yaml.safe_dump([operator_form.to_operator(entry)], sort_keys=False, allow_unicode=True)
    header = (
        "# Put this in prometheus.yml in place of its remote_write section: Prometheus writes to the relay,\n"
        "# the relay does the rest (rules, queues on disk, SigV4).\n"
    )
    return header + yaml.safe_dump({"remote_write": [entry]}, sort_keys=False, allow_unicode=True)


def _leading_keep(entry: dict[str, Any]) -> str | None:
    rules = entry.get("write_relabel_configs") or []
    first = rules[0] if isinstance(rules, list) and rules else None
    if not isinstance(first, dict) or str(first.get("action", "replace")).lower() != "keep":
        return None
    if first.get("source_labels") != ["__name__"] or set(first) - {"source_labels", "regex", "action"}:
        return None
    return str(first.get("regex", "(.*)"))


def _listen_of(url: str) -> str:
    """The relay's ``server.listen`` for ``--relay-url``; a URL it could not serve is refused."""
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError as e:
        raise ImportError_(f"--relay-url {url}: invalid URL: {e}") from e
    if parts.scheme != "http" or not parts.hostname:
        raise ImportError_(f"--relay-url {url}: the relay serves plain http (http://HOST:PORT/api/v1/write)")
    if parts.path != "/api/v1/write":
        raise ImportError_(f'--relay-url {url}: the relay receives on the path "/api/v1/write"')
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


def _escape(text: str) -> str:
    return text.replace("$", "$$")


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return _escape(value)
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    if isinstance(value, dict):
        return {k: _escaped(v) for k, v in value.items()}
    return value


def _external_value(value: str) -> str:
    """Prometheus expands external label values like Go's os.Expand; write them in the relay's syntax.

    Prometheus drops a label whose variable is unset; the relay refuses to start instead, so that an
    HA replica label cannot vanish unnoticed."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$$"
        name = m.group(1) or m.group(2)
        return f"${{{name}}}" if name else "$$"

    return _OS_EXPAND.sub(one, value)


class _Quoted(str):
    """A string always written in quotes (an expanded variable then stays one string)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style="'"))


def variables(text: str) -> list[str]:
    """The environment variables a relay config text uses (``${NAME}`` / ``${NAME:-default}``),
    outside the rules (whose ``$`` is the regexp's, never the environment's)."""
    names: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            names.extend(re.findall(r"(?<!\$)(?:\$\$)*\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}\n]*)?\}", value))
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for k, v in value.items():
                if k not in RULE_KEYS:
                    walk(v)

    walk(yaml.safe_load(text))
    return list(dict.fromkeys(names))


def _dump(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)

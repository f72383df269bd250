"""``${VAR}`` and ``${VAR:-default}`` in the relay config, expanded from the environment.

A value is put in after the YAML has been read, never pasted into its text: :func:`template`
replaces each ``$$`` and ``${...}`` of the file by an inert placeholder (letters and digits, valid
in every YAML context, even a flow mapping), the YAML is composed from that, and :meth:`Template.fill`
puts the values into the scalars that hold placeholders. So a value is exactly one YAML value
whatever it holds (``: ``, `` #``, quotes, brackets, line breaks), every line keeps its number, and a
variable in a comment is neither expanded nor required. An unquoted scalar is typed after filling
(``max_shards: ${SHARDS}`` is an integer, an empty value a null, i.e. the default); a quoted one
stays a string. Rules:

- ``${NAME}``: the variable's value; NAME is ``[A-Za-z_][A-Za-z0-9_]*``. Unset: an error naming the
  line (an empty value is used as is).
- ``${NAME:-default}``: the default when the variable is unset or empty (the shell's ``:-``); the
  default may hold ``$$`` and variables of its own (``${A:-${B:-x}}``), expanded only when used.
- ``${NAME`` followed by anything else (the shell's ``-``, ``:=``, ``:?``, ``:+``) is an error, not text.
- ``$$`` is a literal ``$`` (``$$$$`` for ``$$``).
- Anything else with a ``$`` is left as it is (``$1``, ``$name``, ``${1}``, an unclosed ``${``).

Where ``$`` has a meaning of its own (relabel rules and aggregate rules: the regexp's ``$1``,
``${name}``, ``$$``), the reader does not fill a scalar but restores it (:meth:`Template.restore`):
each placeholder goes back to the exact text it replaced, so those values are the file's bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ExpansionIssue:
    line: int  # 1-based
    variable: str
    message: str


@dataclass
class _Expansion:
    value: str
    issues: list[ExpansionIssue] = field(default_factory=list)
    raw: str = ""  # the text of the file it stands for


@dataclass(frozen=True)
class Template:
    """A text with a placeholder in place of each ``$$`` and ``${...}``, and what each stands for."""

    text: str
    _pattern: re.Pattern[str]
    _expansions: tuple[_Expansion, ...]

    def fill(self, text: str) -> tuple[str, list[ExpansionIssue]]:
        """``text`` (a scalar's value) with its placeholders replaced, and their problems."""
        issues: list[ExpansionIssue] = []

        def one(m: re.Match[str]) -> str:
            e = self._expansions[int(m.group(1))]
            issues.extend(e.issues)
            return e.value

        return self._pattern.sub(one, text), issues

    def restore(self, text: str) -> str:
        """``text`` with each placeholder put back as the file's text it replaced (nothing expanded)."""
        return self._pattern.sub(lambda m: self._expansions[int(m.group(1))].raw, text)

    def holds_placeholder(self, text: str) -> bool:
        return self._pattern.search(text) is not None


def template(text: str, env: Mapping[str, str]) -> Template:
    """Every ``$$`` and ``${...}`` of ``text`` expanded from ``env`` and replaced by a placeholder."""
    prefix = "GpuRelayEnv"
    while prefix in text:
        prefix += "X"
    expansions: list[_Expansion] = []
    out: list[str] = []
    line, i = 1, 0
    while (j := text.find("$", i)) >= 0:
        line += text.count("\n", i, j)
        out.append(text[i:j])
        end, expansion = _token(text, j, env, line)
        if expansion is None:
            out.append(text[j:end])
        else:
            out.append(f"{prefix}{len(expansions)}Z")
            expansion.raw = text[j:end]
            expansions.append(expansion)
        line += text.count("\n", j, end)
        i = end
    out.append(text[i:])
    return Template("".join(out), re.compile(re.escape(prefix) + r"(\d+)Z"), tuple(expansions))


def expand(text: str, env: Mapping[str, str]) -> tuple[str, list[ExpansionIssue]]:
    """The text with every variable expanded, and the problems found (unset variables, bad forms)."""
    t = template(text, env)
    return t.fill(t.text)


def _token(text: str, j: int, env: Mapping[str, str], line: int) -> tuple[int, _Expansion | None]:
    """The end of the token at ``text[j] == "$"`` and its expansion (None: the text stays as it is)."""
    if text.startswith("$$", j):
        return j + 2, _Expansion("$")
    m = _NAME.match(text, j + 2) if text.startswith("${", j) else None
    if m is None:
        return j + 1, None
    name, k = m.group(), m.end()
    if text.startswith("}", k):
        value = env.get(name)
        if value is None:
            message = f"environment variable {name} is not set (give a default: ${{{name}:-value}}; $$ is a literal $)"
            return k + 1, _Expansion("", [ExpansionIssue(line, name, message)])
        return k + 1, _Expansion(value)
    close = _closing(text, k)
    if close is None:
        return j + 1, None  # not closed on this line: not a variable
    if not text.startswith(":-", k):
        form = text[j : close + 1]
        message = f"unsupported form {form}: use ${{{name}}} or ${{{name}:-default}}"
        return close + 1, _Expansion("", [ExpansionIssue(line, name, message)])
    value = env.get(name)
    if value:
        return close + 1, _Expansion(value)
    default, issues = expand(text[k + 2 : close], env)
    return close + 1, _Expansion(default, [ExpansionIssue(line, i.variable, i.message) for i in issues])


def _closing(text: str, start: int) -> int | None:
    """The index of the ``}`` that closes a ``${`` whose body starts at ``start`` (same line only)."""
    depth, p = 0, start
    while p < len(text):
        if text.startswith("$$", p):
            p += 2
            continue
        c = text[p]
        if c == "\n":
            return None
        if text.startswith("${", p):
            depth += 1
            p += 2
            continue
        if c == "}":
            if depth == 0:
                return p
            depth -= 1
        p += 1
    return None


_RESOLVER = yaml.resolver.Resolver()


def _implicit_tag(value: str) -> str:
    """The tag YAML gives an unquoted scalar with this text (int, bool, null, str...)."""
    tag: str = _RESOLVER.resolve(ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    return tag


# Keys whose values keep Prometheus's own ``$`` (the regexp's $1, ${name}, $$): never expanded.
# The operator's camelCase spellings too, so that a pasted one gets "did you mean", not "not set".
RULE_KEYS = frozenset({"relabel_configs", "write_relabel_configs", "metric_relabel_configs", "aggregate",
                       "relabelConfigs", "writeRelabelConfigs", "metricRelabelConfigs"})  # fmt: skip


def fill_nodes(tmpl: Template, root: Node) -> list[ExpansionIssue]:
    """Put the environment's values into the scalars; an unquoted one is typed again after it.

    Under a :data:`RULE_KEYS` key a scalar gets the file's text back instead (nothing expanded,
    nothing required). Each node once (an alias shares its anchor's node); the problems of the
    placeholders used."""
    issues: list[ExpansionIssue] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, rules = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for knode, vnode in node.value:
                stack.append((knode, rules))
                key = knode.value if isinstance(knode, ScalarNode) else None
                stack.append((vnode, rules or (isinstance(key, str) and tmpl.restore(key) in RULE_KEYS)))
        elif isinstance(node, SequenceNode):
            stack.extend((n, rules) for n in node.value)
        elif isinstance(node, ScalarNode) and tmpl.holds_placeholder(node.value):
            if rules:
                node.value = _restored(tmpl, node)
                continue
            value, found = tmpl.fill(node.value)
            issues.extend(i for i in found if i not in issues)
            if node.style is None and node.tag == _implicit_tag(node.value):
                node.tag = _implicit_tag(value)
            node.value = value
    return issues


def _restored(tmpl: Template, node: ScalarNode) -> str:
    """The scalar as YAML reads the file's own text of it: its source with the placeholders put
    back, read again (quotes and escapes as written); where that source is not one scalar on its
    own, the value with the placeholders put back."""
    source = tmpl.restore(tmpl.text[node.start_mark.index : node.end_mark.index])
    try:
        again = yaml.compose(source, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        again = None
    if isinstance(again, ScalarNode) and again.style == node.style:
        return str(again.value)
    return tmpl.restore(node.value)

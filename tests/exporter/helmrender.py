"""``helm template`` for the recorded dcgm-exporter chart, without helm: a Go text/template subset.

Contract: ``render_chart(chart_dir, overrides, release=..., namespace=...)`` returns the parsed YAML
documents of every template (``templates/*.yaml``; ``_*.tpl`` only defines) with the chart's
values.yaml coalesced with ``overrides`` as Helm does (maps merge key by key, anything else
replaces, ``null`` deletes a default), and ``.Chart``/``.Release`` as Helm fills them.

What it implements is what NVIDIA's chart 4.8.2 uses, with text/template's semantics: ``{{-``/``-}}``
trimming, comments, ``if``/``else``, ``with``/``else``, ``range``, ``define``, ``$``, ``$var :=``,
pipelines and parenthesised calls; the functions ``include tpl default trunc trimSuffix contains
printf replace quote nindent indent toYaml ternary or and not join``. Anything else (another action,
function or construct) raises ``TemplateError``, so a chart that needs more fails here instead of
rendering differently from helm. Values print as helm prints them (a missing value is empty).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(ValueError):
    """A construct or function outside the subset, or a malformed template."""


# -- parsing ---------------------------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|(\()|(\))|(\|)|(:=)|([^\s()|"]+))')


@dataclass
class _Node:
    kind: str  # text, out, assign, if, with, range
    text: str = ""
    pipe: list[list[Any]] = field(default_factory=list)
    var: str = ""
    body: list[_Node] = field(default_factory=list)
    orelse: list[_Node] = field(default_factory=list)


def _tokens(src: str) -> list[Any]:
    out: list[Any] = []
    pos = 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None or m.end() == pos:
            if src[pos:].strip():
                raise TemplateError(f"cannot read {src[pos:]!r}")
            break
        pos = m.end()
        s, lp, rp, bar, assign, word = m.groups()
        if s is not None:
            out.append(("str", bytes(s[1:-1], "utf-8").decode("unicode_escape")))
        elif lp or rp or bar or assign:
            out.append(lp or rp or bar or assign)
        elif word is not None:
            out.append(("word", word))
    return out


def _pipeline(tokens: list[Any], i: int = 0, close: bool = False) -> tuple[list[list[Any]], int]:
    """Commands separated by ``|``; each command a list of operands (``("pipe", ...)`` nested)."""
    cmds: list[list[Any]] = [[]]
    while i < len(tokens):
        t = tokens[i]
        if t == ")":
            if not close:
                raise TemplateError("unbalanced )")
            return cmds, i + 1
        if t == "(":
            inner, i = _pipeline(tokens, i + 1, close=True)
            cmds[-1].append(("pipe", inner))
            continue
        if t == "|":
            cmds.append([])
        elif t == ":=":
            raise TemplateError(":= inside a pipeline")
        else:
            cmds[-1].append(t)
        i += 1
    if close:
        raise TemplateError("unbalanced (")
    return cmds, i


def _parse(src: str, defines: dict[str, list[_Node]]) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[_Node | None, list[_Node], str]] = [(None, root, "")]
    pos = 0
    pending_trim = False
    for m in _ACTION.finditer(src):
        text = src[pos:m.start()]
        if pending_trim:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        if text:
            stack[-1][1].append(_Node("text", text=text))
        pos, pending_trim = m.end(), bool(m.group(3))
        body = m.group(2).strip()
        if body.startswith("/*"):
            continue
        word, _, rest = body.partition(" ")
        rest = rest.strip()
        if word in ("if", "with", "range"):
            node = _Node(word, pipe=_pipeline(_tokens(rest))[0])
            stack[-1][1].append(node)
            stack.append((node, node.body, word))
        elif word == "define":
            name = _tokens(rest)[0][1]
            defines[name] = []
            stack.append((None, defines[name], "define"))
        elif word == "else":
            top = stack[-1][0]
            if rest or top is None or top.kind == "range":
                raise TemplateError(f"unsupported else: {body!r}")
            stack[-1] = (top, top.orelse, stack[-1][2])
        elif word == "end":
            if len(stack) == 1:
                raise TemplateError("end without a block")
            stack.pop()
        elif word.startswith("$") and rest.startswith(":="):
            stack[-1][1].append(_Node("assign", var=word, pipe=_pipeline(_tokens(rest[2:]))[0]))
        elif word in ("template", "block", "break", "continue", "else if"):
            raise TemplateError(f"unsupported action {word}")
        else:
            stack[-1][1].append(_Node("out", pipe=_pipeline(_tokens(body))[0]))
    tail = src[pos:]
    if pending_trim:
        tail = tail.lstrip()
    if tail:
        root.append(_Node("text", text=tail))
    if len(stack) != 1:
        raise TemplateError(f"{stack[-1][2]} without end")
    return root


# -- execution -------------------------------------------------------------------------------------


def _truth(v: Any) -> bool:
    return bool(v)  # false, 0, nil, "" and empty maps and lists are false, as in text/template


def _show(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        raise TemplateError(f"printing a map or list: {v!r}")
    return str(v)


def _to_yaml(v: Any) -> str:
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(n: int, s: str) -> str:
    pad = " " * int(n)
    return pad + s.replace("\n", "\n" + pad)


def _printf(fmt: str, *args: Any) -> str:
    out, parts = [], iter(args)
    for piece in re.split(r"(%[sdvq])", fmt):
        out.append(_show(next(parts)) if re.fullmatch(r"%[sdv]", piece)
                   else (_quote(next(parts)) if piece == "%q" else piece))
    return "".join(out)


def _quote(*vs: Any) -> str:
    return " ".join('"' + _show(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in vs if v is not None)


class Renderer:
    def __init__(self) -> None:
        self.defines: dict[str, list[_Node]] = {}
        self.funcs: dict[str, Callable[..., Any]] = {
            "include": lambda name, ctx: self.run(self.defines[name], ctx),
            "tpl": lambda text, ctx: self.run(_parse(text, self.defines), ctx),
            "default": lambda d, v=None: v if _truth(v) else d,
            "trunc": lambda n, s: s[: int(n)],
            "trimSuffix": lambda suf, s: s[: -len(suf)] if suf and s.endswith(suf) else s,
            "contains": lambda sub, s: sub in s,
            "printf": _printf,
            "replace": lambda old, new, s: s.replace(old, new),
            "quote": _quote,
            "nindent": lambda n, s: "\n" + _indent(n, s),
            "indent": _indent,
            "toYaml": _to_yaml,
            "ternary": lambda a, b, cond: a if _truth(cond) else b,
            "or": lambda *vs: next((v for v in vs if _truth(v)), vs[-1]),
            "and": lambda *vs: next((v for v in vs if not _truth(v)), vs[-1]),
            "not": lambda v: not _truth(v),
            "join": lambda sep, vs: sep.join(_show(v) for v in vs),
        }

    def load(self, src: str) -> list[_Node]:
        return _parse(src, self.defines)

    def run(self, nodes: list[_Node], dot: Any, root: Any = None, scope: dict[str, Any] | None = None) -> str:
        root = dot if root is None else root
        scope = {} if scope is None else scope
        out: list[str] = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "out":
                out.append(_show(self._pipe(n.pipe, dot, root, scope)))
            elif n.kind == "assign":
                scope[n.var] = self._pipe(n.pipe, dot, root, scope)
            else:
                v = self._pipe(n.pipe, dot, root, scope)
                if n.kind == "if":
                    out.append(self.run(n.body if _truth(v) else n.orelse, dot, root, scope))
                elif n.kind == "with":
                    out.append(self.run(n.body, v, root, scope) if _truth(v) else self.run(n.orelse, dot, root, scope))
                else:  # range over a list (a map ranges over its values in key order, as Go sorts keys)
                    items = [v[k] for k in sorted(v)] if isinstance(v, dict) else list(v or [])
                    out.extend(self.run(n.body, item, root, scope) for item in items)
        return "".join(out)

    def _pipe(self, cmds: list[list[Any]], dot: Any, root: Any, scope: dict[str, Any]) -> Any:
        value: Any = _NOTHING
        for cmd in cmds:
            value = self._command(cmd, dot, root, scope, value)
        return value

    def _command(self, cmd: list[Any], dot: Any, root: Any, scope: dict[str, Any], piped: Any) -> Any:
        head = cmd[0]
        if head[0] == "word" and head[1] in self.funcs:
            args = [self._operand(a, dot, root, scope) for a in cmd[1:]]
            return self.funcs[head[1]](*args, *([] if piped is _NOTHING else [piped]))
        if len(cmd) != 1 or piped is not _NOTHING:
            raise TemplateError(f"unknown function or bad command: {cmd!r}")
        return self._operand(head, dot, root, scope)

    def _operand(self, op: Any, dot: Any, root: Any, scope: dict[str, Any]) -> Any:
        kind, v = op
        if kind == "str":
            return v
        if kind == "pipe":
            return self._pipe(v, dot, root, scope)
        if v in ("true", "false"):
            return v == "true"
        if re.fullmatch(r"-?\d+", v):
            return int(v)
        if v == "nil":
            return None
        base, path = (dot, v) if v.startswith(".") else (None, v)
        if base is None:
            name, _, rest = v.partition(".")
            if name == "$":
                base = root
            elif name in scope:
                base = scope[name]
            else:
                raise TemplateError(f"unknown function or variable {v!r}")
            path = "." + rest if rest else ""
        for key in [k for k in path.split(".") if k]:
            base = base.get(key) if isinstance(base, Mapping) else None
        return base


_NOTHING = object()


def coalesce(defaults: Any, overrides: Any) -> Any:
    """Helm's values coalescing: maps merge key by key, a null override deletes the default."""
    if not isinstance(defaults, dict) or not isinstance(overrides, dict):
        return overrides
    out = dict(defaults)
    for k, v in overrides.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = coalesce(defaults.get(k), v)
    return out


def render_chart(
    chart_dir: Path, overrides: Mapping[str, Any] | None = None, *, release: str = "dcgm-exporter",
    namespace: str = "gpu-operator",
) -> list[dict[str, Any]]:
    """The chart's manifests as ``helm template <release> <chart_dir> -n <namespace> -f <overrides>``."""
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    values = coalesce(yaml.safe_load((chart_dir / "values.yaml").read_text()), dict(overrides or {}))
    ctx = {
        "Values": values,
        "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta.get("appVersion", "")},
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
    }
    r = Renderer()
    templates = sorted((chart_dir / "templates").iterdir())
    for t in templates:
        if t.name.startswith("_"):
            r.load(t.read_text())
    docs: list[dict[str, Any]] = []
    for t in templates:
        if not t.name.startswith("_") and t.suffix in (".yaml", ".yml"):
            docs.extend(d for d in yaml.safe_load_all(r.run(r.load(t.read_text()), ctx)) if d)
    return docs

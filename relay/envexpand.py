"""``${VAR}`` and ``${VAR:-default}`` in the relay config, expanded from the environment.

Expansion runs on the file's text before YAML parsing and never adds or removes a line, so every
error still names the line of the file as written. Rules:
- ``${NAME}``: the variable's value; NAME is ``[A-Za-z_][A-Za-z0-9_]*``. Unset: an error naming the
  line (an empty value is used as is).
- ``${NAME:-default}``: the default when the variable is unset or empty (the shell's ``:-``).
- ``$$`` is a literal ``$`` (write ``$${1}`` for a relabel ``${1}``, ``$$$$`` for ``$$``).
- Anything else with a ``$`` is left as it is (``$1``, ``${1}`` and ``$name`` of relabel
  replacements), and so are whole-line comments (a line whose first non-blank character is ``#``).
- A value with a line break is refused: it would move every following line.
The value is inserted as text: quote the YAML scalar around ``${VAR}`` if the value may contain
YAML syntax (``: ``, ``#``, a leading ``*``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_TOKEN = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}\n]*))?\}")


@dataclass(frozen=True)
class ExpansionIssue:
    line: int  # 1-based
    variable: str
    message: str


def expand(text: str, env: Mapping[str, str]) -> tuple[str, list[ExpansionIssue]]:
    """The text with every variable expanded, and the problems found (unset, multi-line values)."""
    issues: list[ExpansionIssue] = []
    out: list[str] = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if "$" not in line or line.lstrip().startswith("#"):
            out.append(line)
            continue

        def replace(m: re.Match[str], number: int = number) -> str:
            if m.group(0) == "$$":
                return "$"
            name, default = m.group(1), m.group(2)
            value = env.get(name)
            if default is not None and not value:
                value = default
            if value is None:
                issues.append(ExpansionIssue(number, name, f"environment variable {name} is not set "
                                             f"(give a default: ${{{name}:-value}}; $$ is a literal $)"))  # fmt: skip
                return ""
            if "\n" in value or "\r" in value:
                issues.append(ExpansionIssue(number, name, f"environment variable {name} contains a line break"))
                return ""
            return value

        out.append(_TOKEN.sub(replace, line))
    return "".join(out), issues

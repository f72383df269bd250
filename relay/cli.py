"""``gpu-relay``: run the relay, check a config, try its rules on series, show a cardinality report.

``test-rules`` reads series one per line, in the text form ``name{a="1",b="2"}`` (also
``{__name__="x",...}``, quoted UTF-8 names, and exposition lines with a trailing value and
timestamp, so ``curl :9400/metrics | gpu-relay test-rules ...`` works) or, with ``--format json``,
one JSON object of labels per line. Blank and ``#`` lines are echoed so output lines up with input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import TextIO, cast

from relay import __version__
from relay.config import Config, ConfigError, load_config
from relay.labels import METRIC_NAME, Labels, canonical, make
from relay.rules import Rules, UnknownDestinationError
from telemetry_common import logs
from telemetry_common.logs import LOG_FORMATS

_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
_NAME_CHARS = _NAME_START | frozenset("0123456789")
_LABEL_START = _NAME_START - {":"}
_LABEL_CHARS = _NAME_CHARS - {":"}
LOG_FORMAT_ENV = "GPU_RELAY_LOG_FORMAT"
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class SeriesSyntaxError(ValueError):
    """A series line that cannot be parsed; ``column`` is 1-based."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"{message} (column {column})")
        self.message = message
        self.column = column


def parse_series(text: str) -> Labels:
    """``name{a="1"}``, ``{__name__="name",a="1"}`` or ``{"utf8.name",a="1"}`` -> sorted labels.

    A trailing sample value and timestamp (an exposition line) are accepted and ignored; empty
    label values are dropped, as Prometheus does."""
    p = _Cursor(text)
    name = p.word(_NAME_START, _NAME_CHARS)
    pairs: list[tuple[str, str]] = []
    p.space()
    if p.peek() == "{":
        p.pos += 1
        while True:
            p.space()
            if p.take("}"):
                break
            at = p.pos
            if p.peek() == '"':
                label = p.quoted()
                p.space()
                if p.peek() in (",", "}"):  # a bare quoted string is the metric name
                    if name:
                        raise SeriesSyntaxError("metric name given twice", at + 1)
                    name = label
                    p.take(",")
                    continue
            else:
                label = p.word(_LABEL_START, _LABEL_CHARS)
                if not label:
                    raise SeriesSyntaxError("expected a label name", at + 1)
            p.space()
            p.expect("=")
            p.space()
            value = p.quoted()
            if label in (n for n, _ in pairs) or (label == METRIC_NAME and name):
                raise SeriesSyntaxError(f'label "{label}" given twice', at + 1)
            pairs.append((label, value))
            p.space()
            if not p.take(","):
                p.expect("}")
                break
    elif not name:
        raise SeriesSyntaxError("expected a metric name or '{'", p.pos + 1)
    _check_sample(text, p.pos)
    if name:
        pairs.append((METRIC_NAME, name))
    return make(pairs)


def _check_sample(text: str, pos: int) -> None:
    """What follows the labels may only be an exposition sample: a value and an optional timestamp."""
    rest = text[pos:].split()
    try:
        if len(rest) > 2:
            raise ValueError
        for token, kind in zip(rest, (float, int), strict=False):
            kind(token)
    except ValueError:
        raise SeriesSyntaxError("unexpected text after the series", pos + 1) from None


class _Cursor:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def space(self) -> None:
        while self.text.startswith((" ", "\t"), self.pos):
            self.pos += 1

    def take(self, c: str) -> bool:
        if self.peek() == c:
            self.pos += 1
            return True
        return False

    def expect(self, c: str) -> None:
        if not self.take(c):
            got = repr(self.peek()) if self.peek() else "end of line"
            raise SeriesSyntaxError(f"expected '{c}', got {got}", self.pos + 1)

    def word(self, start: frozenset[str], chars: frozenset[str]) -> str:
        begin = self.pos
        if self.peek() and self.peek() in start:
            while self.peek() and self.peek() in chars:
                self.pos += 1
        return self.text[begin : self.pos]

    def quoted(self) -> str:
        self.expect('"')
        out: list[str] = []
        while True:
            c = self.peek()
            if not c:
                raise SeriesSyntaxError("unterminated string", self.pos + 1)
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c == "\\":
                nxt = self.peek()
                if nxt not in _ESCAPES:
                    raise SeriesSyntaxError(r"unknown escape (use \\, \" or \n)", self.pos)
                out.append(_ESCAPES[nxt])
                self.pos += 1
            else:
                out.append(c)


def parse_json_series(text: str) -> Labels:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SeriesSyntaxError(f"invalid JSON: {e.msg}", e.colno) from None
    if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
        raise SeriesSyntaxError("expected a JSON object of string label values", 1)
    return make(obj.items())


def format_json(labels: Labels | None) -> str:
    return "null" if labels is None else json.dumps(dict(labels), ensure_ascii=False)


def explain(rules: Rules, destination: int, lines: Iterable[str], fmt: str, out: TextIO, err: TextIO) -> int:
    """Print what ``destination`` would be sent for each series line; 1 when some line is malformed."""
    parse = parse_json_series if fmt == "json" else parse_series
    render: Callable[[Labels | None], str] = (
        format_json if fmt == "json" else (lambda lb: "DROPPED" if lb is None else canonical(lb))
    )
    status = 0
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip() or line.lstrip().startswith("#"):
            out.write(line + "\n")
            continue
        try:
            labels = parse(line)
        except SeriesSyntaxError as e:
            err.write(f"<stdin>:{number}: {e}\n")
            status = 1
            continue
        out.write(render(rules.apply(destination, labels)) + "\n")
    return status


def summary(config: Config) -> str:
    """The one-line OK of check-config."""
    dests = config.destinations
    rules = sum(len(d.write_relabel_configs) for d in dests)
    aggregates = sum(len(d.aggregate) for d in dests)
    return (
        f"{config.source}: OK: {_n(len(dests), 'destination')} ({', '.join(d.name for d in dests)}); "
        f"{_n(len(config.global_relabel), 'global relabel rule')}, {_n(rules, 'write_relabel rule')}, "
        f"{_n(aggregates, 'aggregate rule')}; {_n(len(config.scrape), 'scrape job')}"
    )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _load(path: str) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as e:
        for issue in e.errors:
            print(issue, file=sys.stderr)
        return None


def _cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    print(summary(config))
    return 0


def _cmd_test_rules(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    rules = Rules(config)
    try:
        index = rules.index(args.destination) if args.destination is not None else 0
    except UnknownDestinationError as e:
        print(f"gpu-relay test-rules: {e}", file=sys.stderr)
        return 2
    return explain(rules, index, sys.stdin, args.format, sys.stdout, sys.stderr)


def _cmd_run(args: argparse.Namespace) -> int:
    daemon = importlib.import_module("relay.daemon")
    run = cast(Callable[..., int], daemon.run)
    return run(args.config, enable_lifecycle=args.enable_lifecycle, watch_interval_s=args.watch_interval)


def _cmd_report(args: argparse.Namespace) -> int:
    report = importlib.import_module("relay.report")
    fetch_and_render = cast(Callable[[str, str | None, int], str], report.fetch_and_render)
    try:
        text = fetch_and_render(args.url, args.destination, args.limit)
    except OSError as e:  # urllib's URLError and HTTPError too
        print(f"gpu-relay report: cannot get the report from {args.url}: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"gpu-relay report: {e}", file=sys.stderr)
        return 1
    print(text)
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value:g}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--version", action="version", version=f"gpu-relay {__version__}")
    levels = ("debug", "info", "warning", "error")
    common.add_argument("--log-level", choices=levels, default=argparse.SUPPRESS, help="default: info")
    common.add_argument("--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS,
                        help="text, json or logfmt (default: $GPU_RELAY_LOG_FORMAT, else text)")
    parser = argparse.ArgumentParser(
        prog="gpu-relay",
        description="Prometheus remote-write relay: rules, cardinality limits, durable queues, SigV4.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", parents=[common], help="run the relay service")
    p.add_argument("--config", required=True, help="relay.yaml")
    p.add_argument("--web.enable-lifecycle", dest="enable_lifecycle", action="store_true",
                   help="serve POST /-/reload (like Prometheus; also server.enable_lifecycle); SIGHUP always works")
    p.add_argument("--config.watch-interval", dest="watch_interval", type=_seconds, default=3.0,
                   help="seconds between checks of the config file for changes, 0: off (default: %(default)s)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "check-config", parents=[common], help="validate a config; print every error with its line"
    )
    p.add_argument("config", help="relay.yaml")
    p.set_defaults(func=_cmd_check_config)

    p = sub.add_parser(
        "test-rules",
        parents=[common],
        help="print what a destination would be sent for series read on stdin",
        description="Reads series on stdin, one per line, and prints for each what the destination would be "
        "sent after external_labels, global relabel, write_relabel_configs and prune_labels, or DROPPED.",
    )
    p.add_argument("--config", required=True, help="relay.yaml")
    p.add_argument("--destination", help="destination name (default: the first)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="input and output format")
    p.set_defaults(func=_cmd_test_rules)

    p = sub.add_parser("report", parents=[common], help="cardinality report from a running relay")
    p.add_argument("--url", default="http://127.0.0.1:9201", help="the relay (default: %(default)s)")
    p.add_argument("--destination", help="one destination (default: all)")
    p.add_argument("--limit", type=_positive_int, default=10, help="top N rows (default: %(default)s)")
    p.set_defaults(func=_cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", "info")
    fmt = getattr(args, "log_format", None) or os.environ.get(LOG_FORMAT_ENV, "").strip() or "text"
    try:
        logs.configure(fmt, level)
    except ValueError as e:
        parser.error(f"{LOG_FORMAT_ENV}: {e}")
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `gpu-relay test-rules ... | head`: quiet, as the Python docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())

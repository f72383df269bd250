"""``gpu-relay``: run the relay, check a config, try its rules on series, show a cardinality report.

``test-rules`` reads series one per line, in the text form ``name{a="1",b="2"}`` (also
``{__name__="x",...}``, quoted UTF-8 names, and exposition lines with a trailing value and
timestamp, so ``curl :9400/metrics | gpu-relay test-rules ...`` works) or, with ``--input-format
json`` (``--format`` sets both), one JSON object of labels per line, and prints each series beside
its outcome (:func:`explain`). Blank and ``#`` lines are echoed in text so output lines up with input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO, cast

from relay import __version__
from relay.common.labels import canonical
from relay.config import promimport
from relay.config.config import Config, ConfigError, load_config, parse_config
from relay.control.explain import Explainer, Outcome
from relay.control.preflight import MachineProbe
from relay.control.series_text import SeriesSyntaxError as SeriesSyntaxError
from relay.control.series_text import format_json as format_json
from relay.control.series_text import parse_json_series as parse_json_series
from relay.control.series_text import parse_series as parse_series
from relay.state.ruleset import NO_METRIC_NAME, UnknownDestinationError
from telemetry_common import logs
from telemetry_common.logs import LOG_FORMATS

LOG_FORMAT_ENV = "GPU_RELAY_LOG_FORMAT"


def explain(
    explainer: Explainer, lines: Iterable[str], input_format: str, output_format: str, out: TextIO, err: TextIO
) -> int:
    """Print, for each series read, the series and what the destination gets from it; 1 when a line
    was malformed.

    Text, one line an input line: ``<series> -> <as sent>``, ``-> DROPPED by <rule>``, ``-> DROPPED:
    no metric name``, ``-> AGGREGATED by <rule> into: <series>, ...`` or ``<line> -> ERROR: <reason>``
    (also on stderr); blank and ``#`` lines are echoed. JSON: one object a series read (blank and ``#``
    lines are not series), each with its ``line`` and ``input``: ``"result": "kept"`` with ``output``,
    ``"dropped"`` with ``by`` (the rule path), ``"aggregated"`` with ``by`` and ``into``, or ``"error"``
    with ``error`` and ``column`` (``input`` then is the line's text); nothing else on stdout."""
    parse = parse_json_series if input_format == "json" else parse_series
    status = 0
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip() or line.lstrip().startswith("#"):
            if output_format != "json":
                out.write(line + "\n")
            continue
        try:
            labels = parse(line)
        except SeriesSyntaxError as e:
            err.write(f"<stdin>:{number}: {e}\n")
            if output_format == "json":
                out.write(_json({"line": number, "input": line, "result": "error", "error": e.message,
                                 "column": e.column}) + "\n")
            else:
                out.write(f"{line} -> ERROR: {e}\n")
            status = 1
            continue
        outcome = explainer.explain(labels)
        if output_format == "json":
            out.write(_json({"line": number, "input": dict(labels), **_result(outcome)}) + "\n")
        else:
            out.write(f"{canonical(labels)} -> {_render(outcome)}\n")
    return status


def _json(obj: dict[str, object]) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _result(o: Outcome) -> dict[str, object]:
    if o.sent is not None:
        return {"result": "kept", "output": dict(o.sent)}
    if o.aggregated_by is not None:
        return {"result": "aggregated", "by": o.aggregated_by, "into": [dict(s) for s in o.aggregated_into]}
    return {"result": "dropped", "by": o.dropped_by}


def _render(o: Outcome) -> str:
    if o.sent is not None:
        return canonical(o.sent)
    if o.aggregated_by is not None:
        return f"AGGREGATED by {o.aggregated_by} into: " + ", ".join(canonical(s) for s in o.aggregated_into)
    if o.dropped_by == NO_METRIC_NAME:
        return f"DROPPED: {NO_METRIC_NAME}"
    return f"DROPPED by {o.dropped_by}"


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


def _load(path: str, probe: MachineProbe | None = None) -> Config | None:
    try:
        return load_config(path, probe=probe)
    except ConfigError as e:
        for issue in e.errors:
            print(issue, file=sys.stderr)
        return None


def _cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.config, MachineProbe())
    if config is None:
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(summary(config))
    return 0


def _cmd_test_rules(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    try:
        explainer = Explainer(config, args.destination if args.destination is not None else 0)
    except UnknownDestinationError as e:
        print(f"gpu-relay test-rules: {e}", file=sys.stderr)
        return 2
    input_format = args.input_format or args.format or "text"
    output_format = args.output_format or args.format or "text"
    return explain(explainer, sys.stdin, input_format, output_format, sys.stdout, sys.stderr)


def _cmd_import_prometheus(args: argparse.Namespace) -> int:
    try:
        imported = promimport.import_prometheus(args.prometheus_config, args.relay_url, args.storage_path)
    except promimport.ImportError_ as e:
        print(f"gpu-relay import-prometheus: {e}", file=sys.stderr)
        return 1
    for note in imported.skipped:
        print(f"gpu-relay import-prometheus: {note}", file=sys.stderr)
    if imported.credentials:
        print(f"gpu-relay import-prometheus: credentials copied in clear from {args.prometheus_config}: "
              f"{', '.join(imported.credentials)}: keep the relay config in a Secret, or write them as ${{VAR}}",
              file=sys.stderr)  # fmt: skip
    names = promimport.variables(imported.relay_config)
    if names:
        print(f"gpu-relay import-prometheus: the relay config uses environment variables {', '.join(names)}: "
              "set them where the relay runs", file=sys.stderr)  # fmt: skip
    env = {**os.environ, **{n: "x" for n in names if n not in os.environ}}
    try:  # what check-config will say about it: errors fail the import, warnings are shown
        config = parse_config(imported.relay_config, args.output or "relay.yaml", env=env)
    except ConfigError as e:
        for issue in e.errors:
            print(issue, file=sys.stderr)
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(imported.relay_config, encoding="utf-8")
        print(imported.prometheus_entry, end="")
    else:
        print(imported.relay_config + "---\n" + imported.prometheus_entry, end="")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    daemon = importlib.import_module("relay.control.daemon")
    run = cast(Callable[..., int], daemon.run)
    return run(args.config, enable_lifecycle=args.enable_lifecycle, watch_interval_s=args.watch_interval)


def _cmd_report(args: argparse.Namespace) -> int:
    report = importlib.import_module("relay.control.report")
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
        description="Reads series on stdin, one per line, and prints each series with what the destination "
        "would be sent after external_labels, global relabel, write_relabel_configs and prune_labels, or which "
        "rule DROPPED it, or the aggregate output series it feeds; a malformed line prints ERROR: <reason>. "
        "With --output-format json: one JSON object a series read (result kept, dropped, aggregated or error).",
    )
    p.add_argument("--config", required=True, help="relay.yaml")
    p.add_argument("--destination", help="destination name (default: the first)")
    formats = ("text", "json")
    p.add_argument("--input-format", choices=formats, help="series on stdin (default: text)")
    p.add_argument("--output-format", choices=formats, help="what is printed (default: text)")
    p.add_argument("--format", choices=formats, help="sets both --input-format and --output-format")
    p.set_defaults(func=_cmd_test_rules)

    p = sub.add_parser(
        "import-prometheus",
        parents=[common],
        help="relay config from a prometheus.yml's remote_write, and the entry that points Prometheus at the relay",
        description="Prints a relay config built from the file's remote_write and global.external_labels, then "
        "(after a --- line) the one remote_write entry to put back into prometheus.yml in place of its own.",
    )
    p.add_argument("prometheus_config", help="prometheus.yml")
    p.add_argument("-o", "--output", help="write the relay config to this file; print only the Prometheus entry")
    p.add_argument("--relay-url", default="http://127.0.0.1:9201/api/v1/write", help="default: %(default)s")
    p.add_argument("--storage-path", default="/var/lib/gpu-relay", help="storage.path (default: %(default)s)")
    p.set_defaults(func=_cmd_import_prometheus)

    p = sub.add_parser("report", parents=[common], help="cardinality report from a running relay")
    p.add_argument("--url", default="http://127.0.0.1:9201",
                   help="the relay's telemetry listener (default: %(default)s; where server.telemetry_listen "
                   "is set, that address, e.g. http://127.0.0.1:9202 in the sidecar)")
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

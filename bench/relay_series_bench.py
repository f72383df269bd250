"""gpu-relay per-series costs end to end: the first sight of a series, and memory per active series.

First sight in process (``in_process_table``): ``Pipeline.decide`` (the uncached path: decode, rules,
prune, AMP checks, aggregation match, output encoding and id) timed on series it has never seen, after
a warm-up on others, against a frozen copy of the reference path it replaced
(tests/relay/state/first_sight_reference.py), side by side in one run, for three rule sets (keep 4 DCGM names +
labeldrop 2; pass-through; a kube-prometheus-stack-like set) and two label-set shapes (dcgm-exporter
and kube-state-metrics). Also the whole in-process route of a request of new series minus the same
request once known (``Pipeline.route``: trackers and the decision cache included), and the memos' bytes.

First sight end to end: a fresh gpu-relay (after a warm-up on other series) gets one round in which every
series is new, then the same series again (all known); (CPU of the new round - CPU of the known
round) / series is the relay CPU a new series costs end to end (rules, caches, accounting, queue and
send included), in us per new series. Both rounds are fed until the receiver holds every sample.

Memory: one fresh pass-through gpu-relay gets distinct dcgm-like series, one sample each, all kept
and forwarded, until it has seen each size in ``sizes``; at each size (after delivery and a settle)
its VmRSS is read (the relay's quiet time, memory_trim.QUIET_S, plus a second after the last write,
once its burst trim has run). Bytes per active series = (RSS - RSS after a warm-up) / series: the relay process
as a whole, its decision cache and every other per-series structure included. The receiver
(victoria-metrics) must have created exactly that many series and stored exactly those samples.

    .venv/bin/python bench/relay_series_bench.py --first-sight   # in process only: ~1 min
    .venv/bin/python bench/relay_series_bench.py                 # first sight on 63,000 series; memory at 1M
    .venv/bin/python bench/relay_series_bench.py 1000000 2000000 5000000  # memory at 1M, 2M, 5M: ~14 min, 5 GiB
    .venv/bin/python bench/relay_series_bench.py --memory 300000   # memory only, at 300k series: ~2 min
    .venv/bin/python bench/relay_series_bench.py --memory --steady 300000   # and after the minute's upkeep: ~3 min
    .venv/bin/python bench/relay_series_bench.py --compare /work/main [--first-sight] [--repeat 2]

``--compare PATH``: the first-sight figures (in process, and end to end unless ``--first-sight``) of this
tree and of the checkout at PATH (its relay package and built extensions, run by this interpreter with
PATH first on sys.path), one worker process per tree and repeat, the trees alternating, best of
``--repeat`` (default 2): side by side in one run. No memory section.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (a --compare worker imported its tree's relay)

import snappy
from prometheus_client import CollectorRegistry

from bench.receivers import VictoriaMetrics
from bench.relay_run import KEEP4_RULES, _settled, feed, start_relay, status_kib
from bench.rw_payload import (
    ISSUE9_OTHER_PER_NODE,
    KEEP,
    PER_REQUEST,
    RW1_HEADERS,
    Series,
    build_requests,
    cluster_series,
    encode_v1,
    gpu_series,
)
from relay.common.labels import Labels
from relay.common.metrics import RelayMetrics
from relay.config.config import parse_config
from relay.ingest import wire
from relay.rules import label_codec, relabel_regexp, rule_plan
from relay.state import limits, memory_trim
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.pipeline import Pipeline
from tests.relay.state.first_sight_reference import ref_decide

HERE = Path(__file__).resolve().parents[1]
WARM_NODE = 900_000  # warm-up series come from node numbers no measured series uses
MIN_AVAILABLE_MIB = 3072  # the memory run stops growing when the machine has less available than this


def available_mib() -> float:
    """MemAvailable of the machine, from /proc/meminfo."""
    for ln in Path("/proc/meminfo").read_text().splitlines():
        if ln.startswith("MemAvailable:"):
            return int(ln.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


@dataclass
class FirstSight:
    rules: str
    series: int
    new_us: float  # relay CPU per series of the all-new round
    known_us: float  # ... of the all-known round

    @property
    def first_sight_us(self) -> float:
        return self.new_us - self.known_us


def _kept(series: Sequence[Series], keep: Sequence[str] | None) -> int:
    return len(series) if keep is None else sum(1 for s in series if dict(s)["__name__"] in keep)


# A kube-prometheus-stack-like remote-write filter: drop the heaviest families, keep what dashboards
# use, drop a few labels, derive one.
KPS_RULES = """    write_relabel_configs:
      - source_labels: [__name__]
        regex: 'apiserver_request_duration_seconds_bucket|etcd_request_duration_seconds_bucket|kube_pod_labels'
        action: drop
      - source_labels: [__name__]
        regex: '(DCGM_FI_DEV_.*|DCGM_FI_PROF_.*|kube_pod_.*|kube_node_.*|node_cpu_seconds_total|node_memory_.*)'
        action: keep
      - source_labels: [__name__]
        regex: 'kube_pod_container_status_(last_terminated|waiting)_reason'
        action: drop
      - regex: 'pci_bus_id|DCGM_FI_DRIVER_VERSION|endpoint|uid'
        action: labeldrop
      - source_labels: [namespace]
        regex: 'ml-(.*)'
        target_label: team
        replacement: '$1'
"""
RULE_SETS = (("keep4", KEEP4_RULES), ("passthrough", ""), ("kps", KPS_RULES), ("keep4+ext", KEEP4_RULES),
             ("pass+ext", ""))
# root keys of a rule set's config (in process only): "+ext" is the same rules with external_labels, as
# almost every Prometheus has (they are added to every series before its destination's rules)
ROOTS = {"keep4+ext": "external_labels: {cluster: prod}\n", "pass+ext": "external_labels: {cluster: prod}\n"}
KSM_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def ksm_series(n: int) -> list[Series]:
    """Node ``n``'s kube-state-metrics-like pod series (8 pods, 21 series each), labels sorted."""
    out: list[Series] = []
    common = {"job": "kube-state-metrics", "instance": "10.0.0.9:8080", "container": "kube-state-metrics",
              "endpoint": "http", "service": "kube-prometheus-stack-kube-state-metrics"}
    for k in range(8):
        pod = {"namespace": f"ml-team-{n % 7}", "pod": f"trainer-{n:05d}-{k}-7f9c4b6d8-x{n % 97:02d}q",
               "uid": f"{n:08x}-{k:04x}-4b2e-9a51-0c3d2e1f{n % 65536:04x}"}
        series = [{"__name__": "kube_pod_info", "node": f"ip-10-0-{n // 250}-{n % 250}",
                   "host_ip": f"10.0.{n % 250}.1", "pod_ip": f"100.64.{n % 250}.{k}", "created_by_kind": "ReplicaSet",
                   "created_by_name": f"trainer-{n:05d}-{k}-7f9c4b6d8", "priority_class": "high",
                   "host_network": "false"},
                  {"__name__": "kube_pod_labels", "label_app": "trainer"},
                  {"__name__": "kube_pod_created"}, {"__name__": "kube_pod_owner", "owner_kind": "ReplicaSet"}]
        series += [{"__name__": "kube_pod_status_phase", "phase": ph} for ph in KSM_PHASES]
        series += [{"__name__": "kube_pod_container_status_restarts_total", "container": "trainer"},
                   {"__name__": "kube_pod_container_status_running", "container": "trainer"},
                   {"__name__": "kube_pod_container_status_waiting_reason", "container": "trainer",
                    "reason": "CrashLoopBackOff"}]
        series += [{"__name__": f"kube_pod_container_resource_{kind}", "container": "trainer", "resource": res,
                    "unit": unit} for kind in ("requests", "limits")
                   for res, unit in (("cpu", "core"), ("memory", "byte"), ("nvidia_com_gpu", "integer"))]
        series += [{"__name__": "kube_pod_status_ready", "condition": c} for c in ("true", "false", "unknown")]
        out.extend(tuple(sorted({**common, **pod, **s}.items())) for s in series)
    return out


SHAPES: dict[str, Callable[[int], list[Series]]] = {"dcgm": lambda n: list(gpu_series(n)), "ksm": ksm_series}


@dataclass
class InProcess:
    rules: str
    shape: str
    series: int
    before_us: float  # reference decide per new series
    after_us: float  # Pipeline.decide per new series
    route_new_us: float  # Pipeline.route of all-new requests minus the same requests known, per series


def _pipeline(rules: str, root: str = "") -> Pipeline:
    text = f"{root}destinations:\n  - name: sink\n    url: http://127.0.0.1:1/w\n{rules}"
    config = parse_config(text)
    registry = CollectorRegistry()
    cm = CardinalityMetrics(registry)
    stats = [DestinationStats(d.name, window_s=d.limits.window, metrics=cm) for d in config.destinations]
    return Pipeline(config, RelayMetrics(registry), stats, [None], cardinality=cm)


def _per_series(fn: Callable[[bytes], object], keys: Sequence[bytes]) -> float:
    t = time.thread_time()
    for k in keys:
        fn(k)
    return 1e6 * (time.thread_time() - t) / len(keys)


def in_process(rules_name: str, rules: str, shape: str, nodes: int, repeats: int = 3) -> InProcess:
    """Best of ``repeats`` rounds, each on fresh pipelines and series never seen (other node numbers),
    after a warm-up; before and after alternate, so both see the same machine load."""
    make = SHAPES[shape]
    before: list[float] = []
    after: list[float] = []
    route: list[float] = []
    for r in range(repeats):
        root = ROOTS.get(rules_name, "")
        ref, new = _pipeline(rules, root), _pipeline(rules, root)
        warm = [wire.encode_labels(s) for n in range(WARM_NODE + r * 10, WARM_NODE + r * 10 + 4) for s in make(n)]
        for k in warm:
            new.decide(k)
            ref_decide(ref, k, {})
        keys = [wire.encode_labels(s) for n in range(r * nodes, (r + 1) * nodes) for s in make(n)]
        scratch: dict[bytes, Labels] = {}
        before.append(_per_series(lambda k, ref=ref, scratch=scratch: ref_decide(ref, k, scratch), keys))
        after.append(_per_series(new.decide, keys))
        # the whole in-process route: a fresh pipeline, all-new requests, then the same known
        routed = _pipeline(rules, root)
        for q in build_requests([s for n in range(WARM_NODE + 100, WARM_NODE + 104) for s in make(n)], 1):
            routed.route(snappy.uncompress(q))
        reqs = [snappy.uncompress(q) for q in build_requests(
            [s for n in range(r * nodes + 50_000, (r + 1) * nodes + 50_000) for s in make(n)], 1)]
        t = time.thread_time()
        for q in reqs:
            routed.route(q)
        t_new = time.thread_time() - t
        t = time.thread_time()
        for q in reqs:
            routed.route(q)
        route.append(1e6 * (t_new - (time.thread_time() - t)) / len(keys))
    return InProcess(rules_name, shape, len(keys), min(before), min(after), min(route))


REGEX_MEMO_BYTES = 150  # per memoised regex answer: a dict slot and the text it keeps alive


def memo_bytes_bound(rule_lists: int = 1, regexes: int = 5, amp_limits: int = 1) -> int:
    """The memos' worst case, whatever the series count: Label entries and name tuples, per rule list
    (effects and name plans), per regex, per AmpLimits (name tuples) and the metric names. Defaults:
    one destination with the kps rules (one rule list, 5 regexes)."""
    return (label_codec.MAX_ENTRIES * label_codec.ENTRY_BYTES
            + label_codec.MAX_NAME_SETS * (label_codec.NAME_SET_BYTES + 128)
            + label_codec.C_MEMO_SLOTS * (label_codec.C_MEMO_SLOT_BYTES + label_codec.C_MEMO_PAIR_BYTES)
            + rule_lists * rule_plan.MAX_EFFECTS * (rule_plan.EFFECT_BYTES + rule_plan.PLAN_BYTES)
            + regexes * relabel_regexp.MEMO_MAX * REGEX_MEMO_BYTES
            + (amp_limits + 1) * limits.MAX_MEMO * 250)


def in_process_table(rows: Sequence[InProcess]) -> str:
    header = (f"{'rules':<12} {'labels':<6} {'series':>7} {'before':>9} {'after':>9} {'speed-up':>8} "
              f"{'route new-known':>15}")
    lines = ["First sight of a series in process: Pipeline.decide per new series, the reference path (before)",
             "and today's (after), best of 3 rounds; route new-known: Pipeline.route of all-new requests minus",
             "the same requests once known, per series (trackers and decision cache included).",
             header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.rules:<12} {r.shape:<6} {r.series:>7,} {r.before_us:>6.1f} us {r.after_us:>6.1f} us "
                     f"{r.before_us / r.after_us:>7.1f}x {r.route_new_us:>12.1f} us")
    bound = memo_bytes_bound()
    lines.append(f"memos: {label_codec.memo_bytes() / 2**20:.1f} MiB of Label entries now; worst case of every memo "
                 f"for one kps destination {bound / 2**20:.1f} MiB, whatever the series count "
                 f"({bound / 1e6:.1f} B per series at 1M, {bound / 5e6:.1f} at 5M)")
    return "\n".join(lines) + "\n"


def first_sight(name: str, rules: str, keep: Sequence[str] | None, series: list[Series], work: Path) -> FirstSight:
    """One fresh relay: a warm-up on other series, then ``series`` new, then ``series`` known."""
    warm = cluster_series(2, ISSUE9_OTHER_PER_NODE, first_node=WARM_NODE)
    warm_reqs = build_requests(warm, 2)
    reqs = build_requests(series, 2)
    half = len(reqs) // 2
    kw, k = _kept(warm, keep) * 2, _kept(series, keep)
    rx = VictoriaMetrics(work / "rx")
    try:
        with start_relay(rules, work, rx.url) as proc:
            feed(proc, rx, warm_reqs, RW1_HEADERS, kw)
            _settled(rx, 1.2)  # the warm-up's last flush is over
            cpu_new, _ = feed(proc, rx, reqs[:half], RW1_HEADERS, kw + k)
            _settled(rx, 1.2)
            cpu_known, _ = feed(proc, rx, reqs[half:], RW1_HEADERS, kw + 2 * k)
            rows, _ = _settled(rx, 1.5)
            proc.alive()
        if rows != kw + 2 * k:
            raise RuntimeError(f"first sight {name}: receiver got {rows} samples, expected {kw + 2 * k}")
    finally:
        rx.close()
    return FirstSight(name, len(series), 1e6 * cpu_new / len(series), 1e6 * cpu_known / len(series))


def first_sight_table(rows: Sequence[FirstSight]) -> str:
    header = f"{'rules':<12} {'series':>8} {'new round':>10} {'known round':>12} {'first sight':>12}"
    lines = ["First sight of a series, gpu-relay CPU end to end (us per input series; first sight = new - known):",
             header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.rules:<12} {r.series:>8,} {r.new_us:>7.1f} us {r.known_us:>9.1f} us "
                     f"{r.first_sight_us:>9.1f} us")
    return "\n".join(lines) + "\n"


def distinct_requests(start: int, stop: int, ts: int) -> Iterator[bytes]:
    """RW 1.0 requests carrying dcgm-like series number ``start`` to ``stop`` (184 per node), one sample each."""
    chunk: list[Series] = []
    node, skip = divmod(start, 184)
    todo = stop - start
    while todo:
        for s in gpu_series(node):
            if skip:
                skip -= 1
                continue
            chunk.append(s)
            todo -= 1
            if len(chunk) == PER_REQUEST or not todo:
                yield encode_v1(chunk, ts, 0)
                chunk = []
            if not todo:
                break
        node += 1


@dataclass
class MemRow:
    series: int
    rss_mib: float
    delta_mib: float
    cpu_us: float  # relay CPU per new series while getting from the previous size to this one
    steady_mib: float | None = None  # growth once the relay's minute upkeep ran (expire, trim); None: not waited

    @property
    def bytes_per_series(self) -> float:
        return self.delta_mib * 2**20 / self.series


UPKEEP_S = 60  # relay.control.service: the pipeline's expire (and its malloc trim) runs once a minute


def memory(sizes: Sequence[int], work: Path, steady: bool = False) -> tuple[float, float, list[MemRow]]:
    """One pass-through relay grown through ``sizes`` distinct series; returns (RSS after warm-up in MiB,
    peak RSS in MiB, one row per size). ``steady``: at each size, also the growth once the relay's minute
    upkeep has run after the delivery (the RSS a sidecar keeps at that size, not the one right after a burst)."""
    warm = cluster_series(2, ISSUE9_OTHER_PER_NODE, first_node=WARM_NODE)
    warm_reqs = build_requests(warm, 3)
    rx = VictoriaMetrics(work / "rx")
    rows: list[MemRow] = []
    try:
        with start_relay("", work, rx.url) as proc:
            feed(proc, rx, warm_reqs, RW1_HEADERS, 3 * len(warm))
            _settled(rx, 1.5)
            base = status_kib(proc.pid, "VmRSS") / 1024
            have, ts = 0, int(time.time() * 1000)
            for size in sorted(sizes):
                # the relay and the receiver both grow about linearly: twice the relay's expected growth, plus a reserve
                need = MIN_AVAILABLE_MIB + (2 * rows[-1].rss_mib * (size / rows[-1].series - 1) if rows else 0)
                if available_mib() < need:
                    print(f"memory: stopped before {size:,} series: {available_mib():,.0f} MiB available on the "
                          "machine, not enough for the relay and the receiver to grow", flush=True)
                    break
                reqs = list(distinct_requests(have, size, ts))  # built while the relay idles
                cpu, _ = feed(proc, rx, reqs, RW1_HEADERS, 3 * len(warm) + size, timeout=3600)
                fed = time.monotonic()
                got, _ = _settled(rx, 1.5)
                created = int(rx.metric("vm_new_timeseries_created_total"))
                if got != 3 * len(warm) + size or created != len(warm) + size:
                    raise RuntimeError(f"memory at {size}: receiver stored {got} samples of {created} series, "
                                       f"expected {3 * len(warm) + size} of {len(warm) + size}")
                # the relay trims a burst's freed blocks once its write path has been quiet for QUIET_S
                time.sleep(max(0.0, fed + memory_trim.QUIET_S + 1.0 - time.monotonic()))
                rss = status_kib(proc.pid, "VmRSS") / 1024
                settled = None
                if steady:
                    time.sleep(UPKEEP_S + 5)  # one upkeep (at most a minute apart) after the last sample
                    settled = status_kib(proc.pid, "VmRSS") / 1024 - base
                rows.append(MemRow(size, rss, rss - base, 1e6 * cpu / (size - have), settled))
                have = size
            peak = status_kib(proc.pid, "VmHWM") / 1024
            proc.alive()
    finally:
        rx.close()
    return base, peak, rows


def memory_table(base: float, peak: float, rows: Sequence[MemRow]) -> str:
    header = f"{'series':>10} {'RSS':>10} {'growth':>10} {'B/series':>9} {'CPU/new series':>15}"
    lines = ["Memory per active series, gpu-relay process (pass-through, distinct dcgm-like series kept and",
             f"forwarded, one sample each; decision cache included). RSS after warm-up {base:.1f} MiB, "
             f"peak {peak:.1f} MiB.", header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.series:>10,} {r.rss_mib:>6.1f} MiB {r.delta_mib:>6.1f} MiB {r.bytes_per_series:>9,.0f} "
                     f"{r.cpu_us:>12.1f} us")
    steady = [r for r in rows if r.steady_mib is not None]
    if steady:
        lines.append(f"Once the relay's minute upkeep ran (pipeline expire + malloc trim, {UPKEEP_S + 5} s later):")
        lines += [f"{r.series:>10,} growth {r.steady_mib:>6.1f} MiB  {r.steady_mib * 2**20 / r.series:>5,.0f} B/series"
                  for r in steady if r.steady_mib is not None]
    return "\n".join(lines) + "\n"


def worker(quick: bool, end_to_end: bool) -> dict[str, Any]:
    """The first-sight figures of the relay this process imports, as JSON-able rows (``--compare``)."""
    rows = [in_process(name, rules, shape, 8 if quick else 40, 1 if quick else 3)
            for name, rules in RULE_SETS for shape in SHAPES]
    out: dict[str, Any] = {"in_process": [dataclasses.asdict(r) for r in rows], "first_sight": []}
    if end_to_end:
        series = cluster_series(25 if quick else 250, ISSUE9_OTHER_PER_NODE)
        with tempfile.TemporaryDirectory() as td:
            out["first_sight"] = [dataclasses.asdict(first_sight(name, rules, keep, series, Path(td) / name))
                                  for name, rules, keep in (("keep4", KEEP4_RULES, KEEP), ("passthrough", "", None))]
    return out


def run_worker(tree: Path, quick: bool, end_to_end: bool) -> dict[str, Any]:
    """``worker`` in a fresh process whose relay (its gpu-relay processes included) comes from ``tree``."""
    code = (f"import json, sys; sys.path[:0] = [{str(tree)!r}, {str(HERE / 'bench')!r}]; import relay; "
            f"assert relay.__file__.startswith({str(tree)!r}), relay.__file__; "
            f"from relay_series_bench import worker; print(json.dumps(worker({quick}, {end_to_end})))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)  # the relays it starts import the same tree
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tree), capture_output=True, text=True,
                       check=False)
    if r.returncode:
        raise RuntimeError(f"worker in {tree} failed:\n{r.stderr}")
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def compare_tables(best: dict[str, dict[str, Any]]) -> str:
    """This tree against the base, per in-process row and per end-to-end first sight."""
    base, this = best["base"], best["this"]
    header = (f"{'rules':<12} {'labels':<6} {'decide base':>11} {'this':>8} {'ratio':>6}   "
              f"{'route new-known base':>20} {'this':>8} {'ratio':>6}")
    lines = ["First sight in process, this tree against the base (Pipeline.decide per new series; route new-known:",
             "Pipeline.route of all-new requests minus the same known, per series), best of every repeat:",
             header, "-" * len(header)]
    for b, t in zip(base["in_process"], this["in_process"], strict=True):
        lines.append(f"{t['rules']:<12} {t['shape']:<6} {b['after_us']:>8.1f} us {t['after_us']:>5.1f} us "
                     f"{b['after_us'] / t['after_us']:>5.2f}x   {b['route_new_us']:>17.1f} us "
                     f"{t['route_new_us']:>5.1f} us {b['route_new_us'] / t['route_new_us']:>5.2f}x")
    if this["first_sight"]:
        header = (f"{'rules':<12} {'series':>8} {'base new':>9} {'known':>7} {'first':>7}   "
                  f"{'this new':>9} {'known':>7} {'first':>7}")
        lines += ["", "First sight end to end (gpu-relay CPU us per input series; first = new round - known round):",
                  header, "-" * len(header)]
        for b, t in zip(base["first_sight"], this["first_sight"], strict=True):
            fb, ft = FirstSight(**b), FirstSight(**t)
            lines.append(f"{ft.rules:<12} {ft.series:>8,} {fb.new_us:>6.1f} us {fb.known_us:>4.1f} us "
                         f"{fb.first_sight_us:>4.1f} us   {ft.new_us:>6.1f} us {ft.known_us:>4.1f} us "
                         f"{ft.first_sight_us:>4.1f} us")
    return "\n".join(lines) + "\n"


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per row, the repeat with the lowest figure (in process: route new-known; end to end: first sight)."""
    out: dict[str, Any] = {}
    out["in_process"] = [min(rows, key=lambda r: r["route_new_us"])
                         for rows in zip(*[r["in_process"] for r in runs], strict=True)]
    out["first_sight"] = [min(rows, key=lambda r: FirstSight(**r).first_sight_us)
                          for rows in zip(*[r["first_sight"] for r in runs], strict=True)]
    return out


def compare(base: Path, quick: bool, end_to_end: bool, repeat: int) -> str:
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "this": []}
    for _ in range(repeat):
        for label, tree in (("base", base.resolve()), ("this", HERE)):
            runs[label].append(run_worker(tree, quick, end_to_end))
    return compare_tables({k: _best(v) for k, v in runs.items()})


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    quick = "--quick" in argv
    if "--compare" in argv:
        i = argv.index("--compare")
        repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 2
        print(compare(Path(argv[i + 1]), quick, "--first-sight" not in argv, repeat), end="")
        return 0
    sizes = [int(a) for a in argv if a.isdigit()] or [1_000_000]
    if "--memory" in argv:
        with tempfile.TemporaryDirectory() as td:
            print(memory_table(*memory(sizes, Path(td) / "mem", "--steady" in argv)), end="")
        return 0
    rows = [in_process(name, rules, shape, 8 if quick else 40, 1 if quick else 3)
            for name, rules in RULE_SETS for shape in SHAPES]
    print(in_process_table(rows), flush=True)
    if "--first-sight" in argv or quick:
        return 0
    series = cluster_series(250, ISSUE9_OTHER_PER_NODE)
    with tempfile.TemporaryDirectory() as td:
        fs = [first_sight("keep4", KEEP4_RULES, KEEP, series, Path(td) / "fs-keep4"),
              first_sight("passthrough", "", None, series, Path(td) / "fs-pass")]
        print(first_sight_table(fs), flush=True)
        print(memory_table(*memory(sizes, Path(td) / "mem")), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

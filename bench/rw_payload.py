"""What the relay benches send: a cluster's series as Prometheus would remote-write them, RW 1.0 or 2.0.

A node is 8 GPUs x 23 dcgm-exporter metrics (184 series) plus ``other_per_node`` series of the rest
of what kube-prometheus-stack scrapes there (node-exporter-like: per-CPU and per-mode counters and a
few gauges), so "keep 4 DCGM names" drops most of the input, as it would next to a real Prometheus.
The issue 9 shape: 250 nodes x (184 + 68) = 63,000 series per round, 32 rounds = 2,016,000 samples,
2,000 series per request. One sample per series per 15 s round; requests are pre-encoded (snappy).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import snappy

from exporter.fields import DEFAULT_FIELDS, FIELDS
from relay.ingest import wire
from relay.proto import remote_v2_pb2

# What a node's dcgm-exporter default set sends (NVLink bandwidth is absent on PCIe H200 nodes).
METRICS = [f for f in DEFAULT_FIELDS if FIELDS[f].kind != "label" and f != "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]
KEEP = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
DROP_LABELS = ["pci_bus_id", "DCGM_FI_DRIVER_VERSION"]
PER_REQUEST = 2000  # Prometheus's max_samples_per_send default
SCRAPE_MS = 15_000
ISSUE9_OTHER_PER_NODE = 68  # 184 GPU + 68 other = 252 series per node: 63,000 per round at 250 nodes
CPU_MODES = ("idle", "user", "system", "iowait", "irq", "softirq", "steal", "nice")
NODE_GAUGES = ("node_memory_MemAvailable_bytes", "node_load1", "node_network_receive_bytes_total",
               "node_filesystem_avail_bytes")
RW1_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
               "X-Prometheus-Remote-Write-Version": "0.1.0"}
RW2_HEADERS = {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
               "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "2.0.0"}
Series = tuple[tuple[str, str], ...]


def gpu_series(n: int) -> Iterator[Series]:
    """Node ``n``'s 184 dcgm-exporter series (8 GPUs x 23 metrics), labels sorted by name."""
    for g in range(8):
        for m in METRICS:
            labels = {
                "__name__": m, "gpu": str(g), "UUID": f"GPU-{n:06d}{g:02d}-0d4f-4a8e-9b1c-3f2d6e8a7b90",
                "pci_bus_id": f"00000000:{0x18 + g * 0x10:02X}:00.0", "device": f"nvidia{g}",
                "modelName": "NVIDIA H200", "Hostname": f"ip-10-{n // 62500}-{n // 250 % 250}-{n % 250}.ec2.internal",
                "DCGM_FI_DRIVER_VERSION": "580.159.04", "container": "trainer",
                "namespace": "ml-team-a", "pod": f"llm-pretrain-{n // 4}-worker-{n % 4}",
                "instance": f"10.{n // 62500}.{n // 250 % 250}.{n % 250}:9400", "job": "gpu-exporter",
            }
            yield tuple(sorted(labels.items()))


def other_series(n: int, count: int) -> Iterator[Series]:
    """``count`` node-exporter-like series of node ``n``: per CPU, 8 mode counters then 4 gauges (68: 48 + 20)."""
    common = {"instance": f"10.{n // 62500}.{n // 250 % 250}.{n % 250}:9100", "job": "node-exporter",
              "namespace": "monitoring", "pod": f"prometheus-node-exporter-{n:06x}", "container": "node-exporter",
              "endpoint": "http-metrics", "service": "kube-prometheus-stack-prometheus-node-exporter"}
    for i in range(count):
        labels = dict(common)
        cpu, k = divmod(i, len(CPU_MODES) + len(NODE_GAUGES))
        if k < len(CPU_MODES):
            labels.update(__name__="node_cpu_seconds_total", cpu=str(cpu), mode=CPU_MODES[k])
        else:
            labels.update(__name__=NODE_GAUGES[k - len(CPU_MODES)], shard=str(cpu))
        yield tuple(sorted(labels.items()))


def cluster_series(nodes: int, other_per_node: int = 0, first_node: int = 0) -> list[Series]:
    out: list[Series] = []
    for n in range(first_node, first_node + nodes):
        out.extend(gpu_series(n))
        out.extend(other_series(n, other_per_node))
    return out


def encode_v1(chunk: Sequence[Series], ts: int, r: int, label_bytes: Sequence[bytes] | None = None) -> bytes:
    """One snappy RW 1.0 request: one sample per series at ``ts`` (values vary with round ``r``).
    ``label_bytes``: the chunk's series already encoded (``wire.encode_labels``), to save the work."""
    labs = label_bytes if label_bytes is not None else [wire.encode_labels(s) for s in chunk]
    samples = [wire.encode_sample(ts, float(v)) for v in range(100)]
    return bytes(snappy.compress(b"".join(
        [wire.wrap_series(lab, samples[(r * 7 + j) % 100]) for j, lab in enumerate(labs)])))


def encode_v2(chunk: Sequence[Series], ts: int, r: int) -> bytes:
    """The same request as ``encode_v1`` in Remote-Write 2.0 (per-request symbol table, no metadata)."""
    refs: dict[str, int] = {"": 0}
    req = remote_v2_pb2.Request()
    for j, s in enumerate(chunk):
        lr: list[int] = []
        for name, value in s:
            lr.append(refs.setdefault(name, len(refs)))
            lr.append(refs.setdefault(value, len(refs)))
        req.timeseries.add(labels_refs=lr).samples.add(value=float((r * 7 + j) % 100), timestamp=ts)
    req.symbols.extend(refs)
    return bytes(snappy.compress(req.SerializeToString()))


def build_requests(series: Sequence[Series], rounds: int, end_ago_s: float = 0.0, version: int = 1,
                   per_request: int = PER_REQUEST) -> list[bytes]:
    """Snappy requests, round by round; the last round is stamped ``end_ago_s`` before now."""
    t0 = int((time.time() - end_ago_s) * 1000) - (rounds - 1) * SCRAPE_MS
    chunks = [series[i : i + per_request] for i in range(0, len(series), per_request)]
    if version == 2:
        return [encode_v2(c, t0 + r * SCRAPE_MS, r) for r in range(rounds) for c in chunks]
    labs = [[wire.encode_labels(s) for s in c] for c in chunks]
    return [encode_v1(c, t0 + r * SCRAPE_MS, r, lb) for r in range(rounds) for c, lb in zip(chunks, labs, strict=True)]


@dataclass
class Payload:
    series: list[Series]
    rounds: int
    requests: list[bytes]
    version: int = 1

    @property
    def samples(self) -> int:
        return len(self.series) * self.rounds

    @property
    def headers(self) -> dict[str, str]:
        return RW1_HEADERS if self.version == 1 else RW2_HEADERS

    def kept(self, names: Sequence[str]) -> int:
        """Samples of the metrics ``names``."""
        wanted = set(names)
        return sum(1 for s in self.series if dict(s)["__name__"] in wanted) * self.rounds

    def describe(self) -> str:
        return (f"RW {self.version}.0: {len(self.series):,} series x {self.rounds} rounds = {self.samples:,} samples "
                f"in {len(self.requests)} requests ({sum(map(len, self.requests)) / 1e6:.1f} MB snappy)")


def payload(nodes: int, rounds: int, end_ago_s: float = 0.0, *, other_per_node: int = 0, version: int = 1,
            per_request: int = PER_REQUEST) -> Payload:
    series = cluster_series(nodes, other_per_node)
    return Payload(series, rounds, build_requests(series, rounds, end_ago_s, version, per_request), version)

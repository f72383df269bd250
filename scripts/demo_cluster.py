"""The demo's cluster: a kubelet PodResources socket and a Kubernetes API server, both fakes that the
test suite uses too (tests/exporter/podresources_server.py, a real gRPC server from the kubelet's
proto; tests/jobwatch/fake_apiserver.py, list + watch over HTTP), playing two training jobs on the
8 simulated GPUs of one p5.48xlarge node:

- research/llama-ft, a TrainJob on GPUs 0-3: its step advances every 5 s, then stops at 90 s (the
  loop is stuck; its GPUs go quiet at 120 s). `gpu-telemetry.io/stall-after: 60s` is the demo's
  threshold: GPUJobStalled.
- foundation/mixtral-pretrain, a TrainJob on GPUs 4-7 that reports progress until its NCCL
  collective hangs at 120 s: utilisation 100 %, no tensor work, low power: GPUJobBusyHang.

`python scripts/demo_cluster.py --exporter URL --kubelet-socket PATH --kubeconfig PATH` waits for the
exporter (to learn the simulated GPUs' UUIDs), writes the kubeconfig gpu-jobwatch reads, and runs
until it is stopped.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.exporter.podresources_server import FakeKubelet, pod
from tests.jobwatch.fake_apiserver import FakeAPIServer, node, trainer_status, trainjob, trainjob_pod

NODE = "demo-node-1"
JOBS = (  # namespace, name, GPUs, seconds the step advances, annotations on the TrainJob
    ("research", "llama-ft", range(0, 4), 90.0, {"gpu-telemetry.io/stall-after": "60s"}),
    ("foundation", "mixtral-pretrain", range(4, 8), 120.0, {}),
)
STEPS_PER_TICK = 10
TICK_S = 5.0


def gpu_uuids(exporter: str, deadline_s: float = 60.0) -> dict[int, str]:
    """gpu index -> UUID, read from the exporter's /metrics once it serves all 8 GPUs."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(exporter + "/metrics", timeout=5) as r:
                text = r.read().decode()
            found = {int(g): u for g, u in re.findall(r'DCGM_FI_DEV_GPU_TEMP\{[^}]*gpu="(\d+)",UUID="([^"]+)"', text)}
            if len(found) >= 8:
                return found
        except OSError:
            pass
        if time.monotonic() > end:
            raise SystemExit(f"demo_cluster: {exporter}/metrics does not serve 8 GPUs")
        time.sleep(0.5)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exporter", required=True)
    ap.add_argument("--kubelet-socket", required=True)
    ap.add_argument("--kubeconfig", required=True, type=Path)
    args = ap.parse_args(argv)

    kubelet = FakeKubelet(args.kubelet_socket).start()
    api = FakeAPIServer(bookmark_interval=5.0)
    api.__enter__()
    api.apply("nodes", node(NODE, gpus=8, labels={
        "node.kubernetes.io/instance-type": "p5.48xlarge", "nvidia.com/gpu.product": "NVIDIA-H200",
        "karpenter.sh/capacity-type": "on-demand"}))
    uuids = gpu_uuids(args.exporter)
    started = time.monotonic()
    kubelet_pods = []
    for namespace, name, gpus, _, notes in JOBS:
        api.apply("trainjobs", trainjob(name, namespace, status=trainer_status(0, at=now_rfc3339()),
                                        annotations=notes))
        for rank, gpu in enumerate(gpus):
            p = trainjob_pod(name, rank, namespace, node=NODE, gpus=1)
            api.apply("pods", p)
            kubelet_pods.append(pod(p["metadata"]["name"], namespace, {"train": [("nvidia.com/gpu", [uuids[gpu]])]}))
    kubelet.set_pods(kubelet_pods)
    tmp = args.kubeconfig.with_suffix(".tmp")
    api.kubeconfig(tmp)  # written whole, then renamed: the demo waits for the file
    tmp.replace(args.kubeconfig)
    print(f"demo_cluster: kubelet on {args.kubelet_socket}, API server on {api.url}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(TICK_S):
        age = time.monotonic() - started
        for namespace, name, _, advancing_s, notes in JOBS:
            if age <= advancing_s:
                step = int(age / TICK_S) * STEPS_PER_TICK
                api.apply("trainjobs", trainjob(name, namespace, status=trainer_status(step, at=now_rfc3339()),
                                                annotations=notes))
    kubelet.stop()
    api.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env bash
# gpu-check: one run on a machine with an NVIDIA GPU, under ~3 minutes.
#
# Starts gpu-exporter with --backend nvml, scrapes it idle and under a short matmul load (torch if
# present, else no load, saying so), and checks: /health is 200; the default series that every
# NVML GPU has are present with dcgm-exporter's labels; DCGM_FI_PROF_* ratios lie in 0..1;
# DCGM_FI_DEV_GPU_UTIL rises under load. Prints the per-GPU collection time. Exit 0 = all passed.
#
# Before that, an NVML probe pass (no HTTP): the process's uid, capabilities and the driver's
# NVreg_RestrictProfilingToAdminUsers; per GPU the GPM permission state (permitted / refused with
# NVML's reason / not supported); the first three 1 s cycles' PROF values (the first cycle already
# has them: the probe's sample is one interval old) and the per-GPU collection time. When run as
# root with setpriv(1) present, the probe runs a second time under the DaemonSet's securityContext
# (uid 0, every capability dropped, no_new_privs), which shows whether profiling survives it.
#
#   scripts/gpu-check.sh --probe-only     the probe passes only
#   GPU_CHECK_FAKE=1|refused              probe the fake pynvml of tests/ instead of a GPU (to test
#                                         this script without one; implies --probe-only)
#   GPU_CHECK_PYTHON=/path/to/python      the interpreter (default: the repo's .venv, else python3)
#
# Installs nothing and never changes GPU settings (no clocks, power limits, persistence or MIG
# mode): it only reads through NVML and runs ordinary CUDA work.
# Needs: python3 (or the repo's .venv) with nvidia-ml-py and prometheus-client importable.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

PY=${GPU_CHECK_PYTHON:-python3}
[[ -z "${GPU_CHECK_PYTHON:-}" && -x "$REPO/.venv/bin/python" ]] && PY="$REPO/.venv/bin/python"
if ! "$PY" -c 'import exporter.cli' 2>/dev/null; then
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
missing=$("$PY" - <<'EOF'
import importlib
need = {"pynvml": "nvidia-ml-py", "prometheus_client": "prometheus-client", "exporter.cli": "this repo"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod.split(".")[0]) is None))
EOF
)
if [[ -n "$missing" ]]; then
  echo "gpu-check: FAIL: not importable with $PY: $missing (this script installs nothing)" >&2
  exit 2
fi

PROBE_ONLY=0
[[ "${1:-}" == "--probe-only" || -n "${GPU_CHECK_FAKE:-}" ]] && PROBE_ONLY=1
[[ -n "${GPU_CHECK_FAKE:-}" ]] && export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # tests.exporter.fake_pynvml

PORT=${GPU_CHECK_PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
LOAD_S=${GPU_CHECK_LOAD_SECONDS:-40}
BACKEND=${GPU_CHECK_BACKEND:-nvml}  # "simulated" only to try this script itself on a machine without a GPU
WORK=$(mktemp -d)
EXPORTER_PID=""
LOAD_PID=""
cleanup() {
  [[ -n "$LOAD_PID" ]] && kill "$LOAD_PID" 2>/dev/null || true
  [[ -n "$EXPORTER_PID" ]] && kill -TERM "$EXPORTER_PID" 2>/dev/null || true
  [[ -n "$EXPORTER_PID" ]] && wait "$EXPORTER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/probe.py" <<'EOF'
import os, time
from exporter.backend import GpuLostError
from exporter.fields import DEFAULT_FIELDS
from exporter.nvml.backend import NvmlBackend

fake_mode = os.environ.get("GPU_CHECK_FAKE", "")
if fake_mode:
    from tests.exporter.fake_pynvml import FakeNvml
    fake = FakeNvml(n_gpus=2)
    fake.gpm_refused = fake_mode == "refused"
    b = NvmlBackend(fake, clock=fake.clock, wall_clock=fake.clock)
    def advance(s):
        fake.now += s
else:
    b = NvmlBackend()
    advance = time.sleep

status = {}
with open("/proc/self/status", encoding="ascii") as fh:
    for line in fh:
        key, _, value = line.partition(":")
        status[key] = value.strip()
cap_eff = int(status.get("CapEff", "0"), 16)
restrict = "unknown (no /proc/driver/nvidia/params)"
try:
    with open("/proc/driver/nvidia/params", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("RestrictProfilingToAdminUsers"):
                restrict = line.split(":", 1)[1].strip()
except OSError:
    pass
print(f"process: uid {os.getuid()}, CapEff {cap_eff:#x} (CAP_SYS_ADMIN {'yes' if cap_eff >> 21 & 1 else 'no'}), "
      f"NoNewPrivs {status.get('NoNewPrivs', '?')}; driver RestrictProfilingToAdminUsers: {restrict}"
      f"{' [fake pynvml]' if fake_mode else ''}")
fields = frozenset(DEFAULT_FIELDS)
b.set_interval(1.0)
up = []
for d in b.devices():
    if d.problem:
        print(f"gpu {d.index}: DOWN at start: {d.problem}")
        continue
    prof = sorted(f for f in b.supported_fields(d.index, fields) if f.startswith("DCGM_FI_PROF_"))
    refused = sorted(set(b.unavailable(d.index).values()))
    state = "permitted" if prof else f"REFUSED ({', '.join(refused)})" if refused else "not supported on this GPU"
    print(f"gpu {d.index} ({d.uuid}, {d.name}): GPM {state}; {len(prof)} PROF fields")
    up.append(d.index)
for cycle in (1, 2, 3):
    advance(1.0)
    for gpu in up:
        try:
            out = b.read(gpu, fields)
        except GpuLostError as exc:
            print(f"cycle {cycle} gpu {gpu}: down: {exc.reason}")
            continue
        for entity, values in sorted(out.items(), key=lambda kv: -1 if kv[0].gpu_instance_id is None else kv[0].gpu_instance_id):
            prof = " ".join(f"{k[len('DCGM_FI_PROF_'):]}={v:.3f}" if isinstance(v, float) else
                            f"{k[len('DCGM_FI_PROF_'):]}={v}" for k, v in sorted(values.items())
                            if k.startswith("DCGM_FI_PROF_"))
            where = f"gpu {gpu}" + ("" if entity.gpu_instance_id is None else f" GI {entity.gpu_instance_id}")
            print(f"cycle {cycle} {where}: PROF {prof or '(none)'}")
        print(f"cycle {cycle} gpu {gpu}: collection {b.last_pass_us[gpu] / 1000:.3f} ms")
b.close()
EOF

probe() {  # probe <label> [wrapper command...]
  local label=$1
  shift
  echo "== NVML probe: $label"
  "$@" "$PY" "$WORK/probe.py" 2>&1 | sed 's/^/   /'
  return "${PIPESTATUS[0]}"
}
probe_rc=0
probe "as started" env || probe_rc=$?
if [[ $(id -u) -ne 0 ]]; then
  echo "== second probe skipped: not root, so there are no capabilities to drop (the DaemonSet runs as uid 0)"
elif ! command -v setpriv >/dev/null; then
  echo "== second probe skipped: setpriv(1) not found (util-linux)"
else
  # deploy/daemonset.yaml securityContext: runAsUser 0, capabilities drop ALL, no privilege escalation
  probe "DaemonSet securityContext (setpriv: uid 0, all capabilities dropped, no_new_privs)" \
    setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- || probe_rc=$?
fi
if [[ $PROBE_ONLY -eq 1 ]]; then
  exit "$probe_rc"
fi

echo "== gpu-check: python $PY, exporter on 127.0.0.1:$PORT (--backend $BACKEND --interval 1s)"
"$PY" -m exporter.cli --backend "$BACKEND" --listen "127.0.0.1:$PORT" --interval 1s --log-level warning \
  >"$WORK/exporter.out" 2>"$WORK/exporter.err" &
EXPORTER_PID=$!

# The load: a short fp16 matmul loop on every visible CUDA device, if torch is available.
cat >"$WORK/load.py" <<'EOF'
import sys, time
try:
    import torch
except ImportError:
    print("load: torch not installed: running WITHOUT load; the GPU_UTIL rise check is skipped")
    sys.exit(3)
if not torch.cuda.is_available():
    print("load: torch sees no CUDA device: running WITHOUT load; the GPU_UTIL rise check is skipped")
    sys.exit(3)
seconds = float(sys.argv[1])
devs = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
mats = [(torch.randn(8192, 8192, device=d, dtype=torch.float16),
         torch.randn(8192, 8192, device=d, dtype=torch.float16)) for d in devs]
print(f"load: fp16 8192x8192 matmul on {len(devs)} device(s) for {seconds:.0f}s", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for a, b in mats:
        for _ in range(20):
            a @ b
    for d in devs:
        torch.cuda.synchronize(d)
EOF

cat >"$WORK/check.py" <<'EOF'
import re, subprocess, sys, time, urllib.request
from prometheus_client.parser import text_string_to_metric_families

import os
port, load_s, load_py, exporter_pid = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
base = f"http://127.0.0.1:{port}"
LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
CORE = ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"]
OPTIONAL = ["DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ENC_UTIL",
            "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"]
RATIOS = ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"]
failures = []

def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)

def get(path):
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return r.status, r.read().decode()

def scrape():
    out = {}
    for fam in text_string_to_metric_families(get("/metrics")[1]):
        for s in fam.samples:
            # the parser appends _total to counter samples; DCGM's counters have none
            name = fam.name if s.name.startswith("DCGM_") else s.name
            out.setdefault(name, []).append((s.labels, s.value))
    return out

deadline = time.monotonic() + 30
while True:
    try:
        status, body = get("/health")
        if status == 200:
            break
    except Exception as exc:  # 503 raises HTTPError; connection refused before bind
        body = getattr(exc, "read", lambda: str(exc).encode())()
        body = body.decode() if isinstance(body, bytes) else body
    try:
        os.kill(exporter_pid, 0)
    except ProcessLookupError:
        print("FAIL: the exporter exited before becoming healthy")
        sys.exit(1)
    if time.monotonic() > deadline:
        print("FAIL: exporter not healthy within 30s:", body)
        sys.exit(1)
    time.sleep(0.5)
print("ok: /health 200")

time.sleep(2.5)
idle = scrape()
for name in CORE:
    if name not in idle:
        fail(f"{name} missing")
for name, samples in idle.items():
    if name.startswith("DCGM_FI_"):
        for labels, _ in samples:
            if list(labels)[:5] != LABELS or "DCGM_FI_DRIVER_VERSION" not in labels:
                fail(f"{name}: labels {list(labels)}")
                break
print("present:", " ".join(n for n in CORE + OPTIONAL + RATIOS if n in idle))
print("absent (unsupported here):", " ".join(n for n in OPTIONAL + RATIOS if n not in idle) or "none")
idle_util = {l["gpu"] + l.get("GPU_I_ID", ""): v for l, v in idle.get("DCGM_FI_DEV_GPU_UTIL", [])}

load = subprocess.Popen([sys.executable, load_py, str(load_s)])
samples = []
t_end = time.monotonic() + load_s
time.sleep(min(8.0, load_s / 2))
while time.monotonic() < t_end - 1 and load.poll() is None:
    samples.append(scrape())
    time.sleep(2.0)
rc = load.wait(timeout=load_s + 60)
loaded = rc == 0
if not loaded and rc != 3:
    fail(f"load process exited {rc}")

for snap in [idle, *samples]:
    for name in RATIOS:
        for labels, v in snap.get(name, []):
            if not 0.0 <= v <= 1.0:
                fail(f"{name}{{gpu={labels['gpu']}}} = {v} outside 0..1")
if loaded:
    if not samples:
        fail("no scrape taken under load")
    peak = {}
    for snap in samples:
        for l, v in snap.get("DCGM_FI_DEV_GPU_UTIL", []):
            key = l["gpu"] + l.get("GPU_I_ID", "")
            peak[key] = max(peak.get(key, 0.0), v)
    for key, v in sorted(peak.items()):
        print(f"GPU_UTIL gpu {key}: idle {idle_util.get(key, float('nan')):.0f} -> peak under load {v:.0f}")
        if v <= idle_util.get(key, 0.0) or v < 30:
            fail(f"GPU_UTIL on gpu {key} did not rise under load ({idle_util.get(key)} -> {v})")
    for name in RATIOS:
        vals = [v for snap in samples for _, v in snap.get(name, [])]
        if vals:
            print(f"{name}: peak under load {max(vals):.3f}")

final = scrape()
for l, v in final.get("gpu_exporter_collection_duration_seconds", []):
    print(f"collection time gpu {l['gpu']} ({l['UUID']}): {v * 1000:.2f} ms")
for l, v in final.get("gpu_exporter_device_up", []):
    if v != 1:
        fail(f"gpu {l['gpu']} device_up {v}")
print("gpu-check:", "PASS" if not failures else f"FAIL ({len(failures)} problems)")
sys.exit(1 if failures else 0)
EOF

set +e
timeout 170 "$PY" "$WORK/check.py" "$PORT" "$LOAD_S" "$WORK/load.py" "$EXPORTER_PID"
rc=$?
if ! kill -0 "$EXPORTER_PID" 2>/dev/null; then
  wait "$EXPORTER_PID"; erc=$?; EXPORTER_PID=""
  echo "gpu-check: the exporter exited early (exit $erc):" >&2
  cat "$WORK/exporter.err" >&2
  rc=$(( erc == 0 ? 1 : erc ))
elif [[ $rc -ne 0 ]]; then
  echo "-- exporter stderr (last 20 lines):" >&2
  tail -n 20 "$WORK/exporter.err" >&2
fi
exit $rc

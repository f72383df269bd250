#!/usr/bin/env bash
# gpu-check: one run on a machine with an NVIDIA GPU (an H100/H200 node), under ~3 minutes.
#
# Starts gpu-exporter with --backend nvml and the DaemonSet's collectors file and interval, then checks,
# one line a check (PASS, FAIL or SKIP with the reason; exit 1 on any FAIL), see scripts/gpu_check_node.py:
#   series            per GPU and per MIG GPU instance: the core series, dcgm-exporter's labels, PROF in 0..1
#   nvidia-smi        per GPU: temperature, power, clocks, memory used, utilisation against
#                     `nvidia-smi --query-gpu` within tolerances
#   nvlink            per GPU with active NVLink links (`nvidia-smi nvlink --status`): NVLink series served
#   xid               per entity: XID events registered (DCGM_FI_DEV_XID_ERRORS served, no registration error)
#   load, under-load  a matmul load it starts itself (torch fp16 if importable, else it says it could
#                     not load the GPU): GPU_UTIL rises, PROF GR_ENGINE/TENSOR activity non-zero
#   compute-processes gpu_exporter_compute_processes visible (FAIL when the exporter withholds it)
#   resources         the exporter's RSS and CPU against the DaemonSet's limits (deploy/daemonset.yaml)
#   kubelet-socket    /var/lib/kubelet/pod-resources/kubelet.sock accepts connections (SKIP off Kubernetes)
#   dcgm-csv          /etc/dcgm-exporter/{default-counters,dcp-metrics-included,1.x-compatibility-metrics}.csv load
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
#   GPU_CHECK_BACKEND=simulated           run the checks against the simulated backend (tests; no GPU)
#   GPU_CHECK_EXPORTER=FILE.py            run FILE.py (gpu-exporter's flags) instead of `-m exporter.cli`
#   GPU_CHECK_INTERVAL, GPU_CHECK_LOAD_SECONDS, GPU_CHECK_COLLECTORS, GPU_CHECK_PORT
#
# Installs nothing and never changes GPU settings (no clocks, power limits, persistence or MIG
# mode): it only reads through NVML and nvidia-smi and runs ordinary CUDA work.
# Needs: python3 (or the repo's .venv) with nvidia-ml-py, prometheus-client and PyYAML importable.
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
INTERVAL=${GPU_CHECK_INTERVAL:-5s}  # the DaemonSet's --interval
COLLECTORS=${GPU_CHECK_COLLECTORS:-$REPO/deploy/exporter/collectors.csv}  # the DaemonSet's --collectors
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

echo "== gpu-check: python $PY, exporter on 127.0.0.1:$PORT (--backend $BACKEND --interval $INTERVAL -f $COLLECTORS)"
EXPORTER=(-m exporter.cli)
[[ -n "${GPU_CHECK_EXPORTER:-}" ]] && EXPORTER=("$GPU_CHECK_EXPORTER")
"$PY" "${EXPORTER[@]}" --backend "$BACKEND" --listen "127.0.0.1:$PORT" --interval "$INTERVAL" \
  --collectors "$COLLECTORS" --log-level warning >"$WORK/exporter.out" 2>"$WORK/exporter.err" &
EXPORTER_PID=$!

# The load: a short fp16 matmul loop on every visible CUDA device, if torch is available.
cat >"$WORK/load.py" <<'EOF'
import sys, time
try:
    import torch
except ImportError:
    print("torch is not installed, so this script has no CUDA-free way to put work on the GPU")
    sys.exit(3)
if not torch.cuda.is_available():
    print("torch sees no CUDA device (torch.cuda.is_available() is False)")
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

set +e
timeout 170 "$PY" "$REPO/scripts/gpu_check_node.py" "$PORT" "$LOAD_S" "$WORK/load.py" "$EXPORTER_PID" \
  "$WORK/exporter.err" "$REPO/deploy/daemonset.yaml"
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

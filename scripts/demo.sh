#!/usr/bin/env bash
# The demo: 8 simulated H200 GPUs -> gpu-exporter -> Prometheus (scrapes, keeps everything)
#   -> remote_write -> gpu-relay -> "home" (a receiver Prometheus) and "amp" (dry run: what would
#   ship to Amazon Managed Prometheus, and what it would cost). Set-up included (scripts/setup.sh).
# The GPUs belong to two training jobs (scripts/demo_cluster.py: a fake kubelet and API server):
#   one stalls, one hangs in NCCL; gpu-jobwatch and the waste rules (on a 12x faster clock,
#   scripts/demo_rules.py) name both within about 200 s, with what they cost.
# DEMO_SECONDS=N: the demo runs N seconds from the moment its programs start (set-up not counted),
# summary included, then stops by itself (N below 30 shortens the collection); default: until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BIN=.venv/bin
DATA=demo-data
rm -rf "$DATA"; mkdir -p "$DATA"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for port in 9400 9201 9090 9091 9403; do
  if (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "demo: port $port is already in use on 127.0.0.1; stop what uses it and try again" >&2; exit 1
  fi
done

cat > "$DATA/receiver.yml" <<'YML'
global: {scrape_interval: 1m}
YML
cat > "$DATA/prometheus.yml" <<'YML'
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: [demo-waste.rules.yaml]
scrape_configs:
  - job_name: gpu
    static_configs: [{targets: ["127.0.0.1:9400"]}]
  - job_name: gpu-jobwatch
    static_configs: [{targets: ["127.0.0.1:9403"]}]
  - job_name: gpu-relay
    static_configs: [{targets: ["127.0.0.1:9201"]}]
remote_write:
  - url: http://127.0.0.1:9201/api/v1/write
    queue_config: {batch_send_deadline: 2s, max_samples_per_send: 2000}
    metadata_config: {send: true, send_interval: 30s}
YML

cat > "$DATA/jobwatch.yaml" <<'YML'
prices:
  - {instance_type: p5.48xlarge, usd_per_instance_hour: 55.04, gpus: 8}
YML
$BIN/python scripts/demo_rules.py "$DATA/demo-waste.rules.yaml"
promtool check rules "$DATA/demo-waste.rules.yaml" >/dev/null

started=$SECONDS
started_unix=$(date +%s)
echo "demo: starting gpu-exporter (8 simulated GPUs), the demo cluster, gpu-jobwatch, the receiver, gpu-relay and Prometheus"
NODE_NAME=demo-node-1 $BIN/gpu-exporter --backend simulated --simulate-gpus 8 --listen 127.0.0.1:9400 --interval 5s -f deploy/exporter/collectors.csv \
  --simulate-workloads 0:stalled,1:stalled,2:stalled,3:stalled,4:nccl_hang,5:nccl_hang,6:nccl_hang,7:nccl_hang \
  --kubernetes --pod-resources-socket "$PWD/$DATA/kubelet.sock" >"$DATA/exporter.log" 2>&1 & pids+=($!)
$BIN/python scripts/demo_cluster.py --exporter http://127.0.0.1:9400 --kubelet-socket "$PWD/$DATA/kubelet.sock" \
  --kubeconfig "$DATA/kubeconfig" >"$DATA/cluster.log" 2>&1 & pids+=($!)
prometheus --config.file="$DATA/receiver.yml" --web.listen-address=127.0.0.1:9091 \
  --storage.tsdb.path="$DATA/receiver" --web.enable-remote-write-receiver >"$DATA/receiver.log" 2>&1 & pids+=($!)
$BIN/gpu-relay run --config scripts/demo-relay.yaml >"$DATA/relay.log" 2>&1 & pids+=($!)
prometheus --config.file="$DATA/prometheus.yml" --web.listen-address=127.0.0.1:9090 \
  --storage.tsdb.path="$DATA/prometheus" >"$DATA/prometheus.log" 2>&1 & pids+=($!)

wait_http() { for _ in $(seq 1 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.3; done
  echo "demo: $1 did not come up; logs in $DATA/" >&2; tail -n 20 "$DATA"/*.log >&2; exit 1; }
wait_http http://127.0.0.1:9400/health
for _ in $(seq 1 100); do [ -s "$DATA/kubeconfig" ] && break; sleep 0.3; done
[ -s "$DATA/kubeconfig" ] || { echo "demo: the demo cluster did not start; logs in $DATA/" >&2; tail -n 20 "$DATA/cluster.log" >&2; exit 1; }
$BIN/gpu-jobwatch --kubeconfig "$DATA/kubeconfig" --listen 127.0.0.1:9403 --config "$DATA/jobwatch.yaml" \
  >"$DATA/jobwatch.log" 2>&1 & pids+=($!)
wait_http http://127.0.0.1:9403/ready
wait_http http://127.0.0.1:9201/-/ready
wait_http http://127.0.0.1:9091/-/ready
wait_http http://127.0.0.1:9090/-/ready

collect=30
if [ -n "${DEMO_SECONDS:-}" ]; then
  case "$DEMO_SECONDS" in ''|*[!0-9]*) echo "demo: DEMO_SECONDS must be a whole number of seconds, not '$DEMO_SECONDS'" >&2; exit 2;; esac
  left=$((DEMO_SECONDS - (SECONDS - started)))
  [ "$left" -lt "$collect" ] && collect=$(( left > 5 ? left - 5 : 1 ))
fi
echo "demo: collecting for $collect s (Prometheus scrapes every 5 s and remote-writes to the relay)..."
sleep "$collect"
echo
echo "== What the exporter serves (a few lines of http://127.0.0.1:9400/metrics)"
curl -fsS http://127.0.0.1:9400/metrics | grep -E '^DCGM_FI_DEV_GPU_UTIL' | head -n 3
echo
echo "== What reached the 'home' receiver (series per metric, from its API)"
$BIN/python scripts/demo_receiver_summary.py http://127.0.0.1:9091
echo
echo "== What would ship to AMP (dry run) and what it would cost"
$BIN/gpu-relay report --url http://127.0.0.1:9201 --destination amp
echo
echo "== GPU waste: which jobs stalled or hung, and what they cost (gpu-jobwatch + deploy/monitoring rules)"
wait_s=240
if [ -n "${DEMO_SECONDS:-}" ]; then
  left=$((DEMO_SECONDS - (SECONDS - started) - 5)); wait_s=$(( left < wait_s ? (left > 0 ? left : 0) : wait_s ))
fi
$BIN/python scripts/demo_waste_summary.py http://127.0.0.1:9090 --wait "$wait_s" --started "$started_unix"
echo
cat <<TXT
Look around:
  exporter        http://127.0.0.1:9400/metrics   (health: /health)
  gpu-jobwatch    http://127.0.0.1:9403/metrics   (which job holds each GPU, its progress and stall threshold)
  Prometheus      http://127.0.0.1:9090           (scrapes both, evaluates the waste rules: /alerts; remote-writes to the relay)
  gpu-relay       http://127.0.0.1:9201/          (status page; /metrics, /api/v1/cardinality?destination=amp)
  receiver        http://127.0.0.1:9091           (what the 'home' destination received)
  logs            $DATA/*.log
TXT
if [ -n "${DEMO_SECONDS:-}" ]; then
  left=$((DEMO_SECONDS - (SECONDS - started)))
  echo "demo: stopping in $(( left > 0 ? left : 0 )) s (DEMO_SECONDS=$DEMO_SECONDS)"
  if [ "$left" -gt 0 ]; then sleep "$left"; fi
else echo "Ctrl-C to stop."; while true; do sleep 3600; done; fi

#!/usr/bin/env bash
# The demo: 8 simulated H200 GPUs -> gpu-exporter -> Prometheus (scrapes, keeps everything)
#   -> remote_write -> gpu-relay -> "home" (a receiver Prometheus) and "amp" (dry run: what would
#   ship to Amazon Managed Prometheus, and what it would cost). Set-up included (scripts/setup.sh).
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

for port in 9400 9201 9090 9091; do
  if (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "demo: port $port is already in use on 127.0.0.1; stop what uses it and try again" >&2; exit 1
  fi
done

cat > "$DATA/receiver.yml" <<'YML'
global: {scrape_interval: 1m}
YML
cat > "$DATA/prometheus.yml" <<'YML'
global: {scrape_interval: 5s, evaluation_interval: 5s}
scrape_configs:
  - job_name: gpu
    static_configs: [{targets: ["127.0.0.1:9400"]}]
  - job_name: gpu-relay
    static_configs: [{targets: ["127.0.0.1:9201"]}]
remote_write:
  - url: http://127.0.0.1:9201/api/v1/write
    queue_config: {batch_send_deadline: 2s, max_samples_per_send: 2000}
    metadata_config: {send: true, send_interval: 30s}
YML

started=$SECONDS
echo "demo: starting gpu-exporter (8 simulated GPUs), the receiver, gpu-relay and Prometheus"
$BIN/gpu-exporter --backend simulated --simulate-gpus 8 --listen 127.0.0.1:9400 --interval 5s \
  >"$DATA/exporter.log" 2>&1 & pids+=($!)
prometheus --config.file="$DATA/receiver.yml" --web.listen-address=127.0.0.1:9091 \
  --storage.tsdb.path="$DATA/receiver" --web.enable-remote-write-receiver >"$DATA/receiver.log" 2>&1 & pids+=($!)
$BIN/gpu-relay run --config scripts/demo-relay.yaml >"$DATA/relay.log" 2>&1 & pids+=($!)
prometheus --config.file="$DATA/prometheus.yml" --web.listen-address=127.0.0.1:9090 \
  --storage.tsdb.path="$DATA/prometheus" >"$DATA/prometheus.log" 2>&1 & pids+=($!)

wait_http() { for _ in $(seq 1 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.3; done
  echo "demo: $1 did not come up; logs in $DATA/" >&2; tail -n 20 "$DATA"/*.log >&2; exit 1; }
wait_http http://127.0.0.1:9400/health
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
cat <<TXT
Look around:
  exporter        http://127.0.0.1:9400/metrics   (health: /health)
  Prometheus      http://127.0.0.1:9090           (scrapes the exporter, remote-writes to the relay)
  gpu-relay       http://127.0.0.1:9201/          (status page; /metrics, /api/v1/cardinality?destination=amp)
  receiver        http://127.0.0.1:9091           (what the 'home' destination received)
  logs            $DATA/*.log
TXT
if [ -n "${DEMO_SECONDS:-}" ]; then
  left=$((DEMO_SECONDS - (SECONDS - started)))
  echo "demo: stopping in $(( left > 0 ? left : 0 )) s (DEMO_SECONDS=$DEMO_SECONDS)"
  if [ "$left" -gt 0 ]; then sleep "$left"; fi
else echo "Ctrl-C to stop."; while true; do sleep 3600; done; fi

"""The status page in a real browser (issue 10): headless Chromium loads ``GET /`` of a running
`gpu-relay run`, and the numbers it renders match ``/api/v1/cardinality`` and ``/metrics``.

A screenshot is taken every run (a valid PNG in the test's directory); with
``STATUS_PAGE_PNG=docs/status-page.png`` it is also written there, for the README.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

from tests.e2e.procs import running, start_relay
from tests.helpers import require_binary, wait_until
from tests.relay.control.test_service import S, _http_metric, _http_post, now_ms, receiver
from tests.relay.control.test_statuspage import Values

AMP = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-demo/api/v1/remote_write"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def chromium(*args: str) -> subprocess.CompletedProcess[bytes]:
    binary = require_binary("chromium")  # Debian's chromium; missing under CI is a failure
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, timeout=90, check=True)


def cardinality(url: str, name: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/api/v1/cardinality?destination={name}&limit=10", timeout=5) as r:
        data: dict[str, object] = json.load(r)
    return data


def test_status_page_in_chromium_matches_the_api_and_metrics(tmp_path: Path) -> None:
    require_binary("chromium")
    with receiver() as rx:
        config = f"""\
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: amp
    url: {AMP}
    dry_run: true
    sigv4: {{region: us-east-1}}
    write_relabel_configs: [{{source_labels: [__name__], regex: "DCGM_.*", action: keep}}]
    prune_labels: [pod]
  - name: local
    url: {rx.url}
    queue: {{batch_send_deadline: 20ms}}
"""
        proc, url = start_relay(tmp_path, config, env={"AWS_EC2_METADATA_DISABLED": "true"})
        with running(proc):
            t = now_ms()
            series = [(S("DCGM_FI_DEV_GPU_UTIL", gpu=str(g), pod=f"train-{g % 3}"), [(t, 50.0 + g)])
                      for g in range(8)]
            series += [(S("DCGM_FI_DEV_FB_USED", gpu=str(g)), [(t, 1e3 * g)]) for g in range(8)]
            series += [(S("node_cpu_seconds_total", cpu=str(c)), [(t, 1.0)]) for c in range(4)]
            assert _http_post(url, series) == 204
            sent = 'gpu_relay_samples_sent_total{destination="local"}'
            assert wait_until(lambda: _http_metric(url, sent) == 20.0, timeout=15), proc.tail()
            assert wait_until(lambda: _http_metric(url, 'gpu_relay_queue_samples{destination="local"}') == 0.0)

            before = cardinality(url, "amp")["estimated_cost"]
            dom = chromium("--dump-dom", url + "/").stdout.decode()
            after = cardinality(url, "amp")["estimated_cost"]
            png = tmp_path / "status-page.png"
            chromium(f"--screenshot={png}", "--window-size=1300,1100", url + "/")
            api = {name: cardinality(url, name) for name in ("amp", "local")}
            metrics = {
                "samples_in": _http_metric(url, "gpu_relay_samples_received_total"),
                "local_sent": _http_metric(url, sent),
                "local_kept": _http_metric(url, 'gpu_relay_samples_kept_total{destination="local"}'),
                "amp_kept": _http_metric(url, 'gpu_relay_samples_kept_total{destination="amp"}'),
                "amp_out": _http_metric(url, 'gpu_relay_active_series{destination="amp",direction="out"}'),
            }

    page = Values()
    page.feed(dom)
    states = {k: page.values.pop(k) for k in [k for k in page.values if k.endswith(".state")]}
    v, texts = {k: float(x) for k, x in page.values.items()}, page.texts
    assert "<title>gpu-relay status</title>" in dom
    # numbers shown == /metrics
    assert v["amp.samples_in"] == metrics["samples_in"] == 20
    assert v["local.samples_sent"] == metrics["local_sent"] == 20
    assert v["local.samples_kept"] == metrics["local_kept"] == 20
    assert v["amp.samples_kept"] == metrics["amp_kept"] == 16
    assert v["amp.active_out"] == metrics["amp_out"]
    assert v["local.queue_samples"] == 0
    # numbers shown == /api/v1/cardinality
    for name in ("amp", "local"):
        snap = api[name]
        active = snap["active_series"]
        assert isinstance(active, dict)
        assert v[f"{name}.active_in"] == active["in"] == 20
        assert v[f"{name}.active_out"] == active["out"]
        tops = snap["top_metrics"]
        assert isinstance(tops, dict)
        for item in tops["out"]:
            assert v[f"{name}.top_out.{item['metric']}"] == item["series"]
    assert v["amp.active_out"] == 16 - 0  # 8 util (pod pruned: 8 gpus stay distinct) + 8 fb
    assert texts["amp.state"] == "dry run" and texts["local.state"] == "sending"
    assert states == {"amp.state": "dry_run", "local.state": "sending"}  # the state's name beside its words
    # the estimate follows a rate that decays while no samples come in: the page's lies between the
    # API's just before and just after the page was rendered
    assert isinstance(before, dict) and isinstance(after, dict)
    assert float(after["total_usd"]) <= v["amp.cost_usd"] <= float(before["total_usd"])
    assert v["amp.cost_usd"] > 0
    assert "local.cost_usd" not in v and api["local"]["estimated_cost"] is None
    # the screenshot
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    target = os.environ.get("STATUS_PAGE_PNG")
    if target:
        shutil.copyfile(png, target)

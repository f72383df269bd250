"""Start real processes for end-to-end tests: Prometheus, vmagent, gpu-exporter, gpu-relay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers import free_port, require_binary, wait_until

VENV_BIN = Path(sys.executable).parent


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(200 <= r.status < 300)
    except Exception:
        return False


class Proc:
    def __init__(self, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(
            self.args, stdout=self._fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )

    def wait_http(self, url: str, timeout: float = 30.0) -> None:
        if not wait_until(lambda: _http_ok(url) or self.p.poll() is not None, timeout=timeout):
            raise AssertionError(f"{url} did not come up; log:\n{self.tail()}")
        if self.p.poll() is not None:
            raise AssertionError(f"{self.args[0]} exited with {self.p.returncode}; log:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        self._fh.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def kill9(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._fh.close()


@contextmanager
def running(proc: Proc) -> Iterator[Proc]:
    try:
        yield proc
    finally:
        proc.stop()


def start_prometheus(tmp: Path, config: str, receiver: bool = False, name: str = "prometheus") -> tuple[Proc, str]:
    binary = require_binary("prometheus")
    port = free_port()
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "prometheus.yml").write_text(config)
    args = [
        binary,
        f"--config.file={d / 'prometheus.yml'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--storage.tsdb.path={d / 'data'}",
        "--log.level=warn",
    ]
    if receiver:
        args.append("--web.enable-remote-write-receiver")
    proc = Proc(args, d / "log.txt")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/-/ready")
    return proc, url


def start_exporter(tmp: Path, gpus: int = 8, interval: str = "1s") -> tuple[Proc, str]:
    port = free_port()
    proc = Proc(
        [str(VENV_BIN / "gpu-exporter"), "--backend", "simulated", "--simulate-gpus", str(gpus),
         "--listen", f"127.0.0.1:{port}", "--interval", interval],
        tmp / f"exporter-{port}.log",
        env={"NODE_NAME": "node-e2e"},
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


def start_relay(tmp: Path, config_yaml: str, env: dict[str, str] | None = None, port: int | None = None,
                args: Sequence[str] = (), run_args: Sequence[str] = ()) -> tuple[Proc, str]:
    """``gpu-relay [args] run [run_args]`` on ``config_yaml`` (``@PORT@`` replaced by the port), ready."""
    port = port or free_port()
    cfg = tmp / "relay.yaml"
    cfg.write_text(config_yaml.replace("@PORT@", str(port)))
    argv = [str(VENV_BIN / "gpu-relay"), *args, "run", *run_args, "--config", str(cfg)]
    proc = Proc(argv, tmp / "relay.log", env=env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/-/ready")
    return proc, url


def prom_query(url: str, query: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def prom_series(url: str, match: str) -> list[dict[str, str]]:
    q = urllib.parse.urlencode({"match[]": match, "start": str(time.time() - 3600)})
    with urllib.request.urlopen(f"{url}/api/v1/series?{q}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"])

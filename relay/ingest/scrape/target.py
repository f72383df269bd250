"""A scrape target: what it is (:class:`ScrapeTarget`), how its labels join an exposed series, and
how it is fetched.

Contract: target labels follow Prometheus 2.42's ``mutateSampleLabels``. With ``honor_labels:
false`` ``job`` and ``instance`` always win and an exposed label they replace is kept as
``exported_<name>`` (more ``exported_`` prefixes until the name is free of exposed, target and
earlier renamed labels, shortest name first); with ``honor_labels: true`` an exposed label wins.
Report series (``up``, ``scrape_*``) always carry the target's labels. Empty values are no label.
:func:`http_fetch` sends the Accept header Prometheus 2.42 sends (OpenMetrics 1.0.0 first, then
0.0.1, then text 0.0.4), accepts gzip, refuses non-2xx and bodies over 64 MiB, and returns the
body with its Content-Type.
"""

from __future__ import annotations

import gzip
import urllib.request
import zlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from relay import __version__
from relay.common.labels import METRIC_NAME, Labels, make

EXPORTED = "exported_"
MAX_BODY = 64 << 20
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # fmt: skip


@dataclass(frozen=True)
class ScrapeTarget:
    job: str
    url: str
    interval_s: float
    timeout_s: float
    honor_labels: bool = False
    honor_timestamps: bool = True
    sample_limit: int = 0  # 0: no limit
    label_limit: int = 0
    label_name_length_limit: int = 0
    label_value_length_limit: int = 0

    @property
    def key(self) -> tuple[str, str]:
        """What makes it the same target across a reload (its loop and staleness state go on)."""
        return self.job, self.url

    def target_labels(self) -> dict[str, str]:
        return {"instance": instance_of(self.url), "job": self.job}


@dataclass(frozen=True)
class Response:
    body: bytes
    content_type: str = ""


def instance_of(url: str) -> str:
    """The ``instance`` label of a target URL: host:port, without any user:password@ part."""
    return urlsplit(url).netloc.rpartition("@")[2]


def sample_labels(name: str, exposed: tuple[tuple[str, str], ...], target: dict[str, str], honor: bool) -> Labels:
    """An exposed series' labels with the target's, as Prometheus's ``mutateSampleLabels``."""
    labels = {METRIC_NAME: name}
    labels.update(exposed)
    if honor:
        for k, v in target.items():
            labels.setdefault(k, v)
        return make(labels.items())
    conflicts = sorted(((k, labels[k]) for k in target if labels.get(k)), key=lambda c: len(c[0]))
    exposed_names = set(labels)
    labels.update(target)
    taken: set[str] = set()
    for k, v in conflicts:
        new = k
        while True:
            new = EXPORTED + new
            if new not in exposed_names and new not in target and new not in taken:
                taken.add(new)
                labels[new] = v
                break
    return make(labels.items())


def report_labels(name: str, target: dict[str, str]) -> Labels:
    return make([(METRIC_NAME, name), *target.items()])


def http_fetch(url: str, timeout_s: float) -> Response:
    """GET an exposition; non-2xx statuses and network errors raise (urllib's errors)."""
    request = urllib.request.Request(url, headers={
        "Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": f"gpu-relay/{__version__}",
        "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout_s:g}",
    })  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body: bytes = response.read(MAX_BODY + 1)
        content_type = response.headers.get("Content-Type", "")
        encoding = response.headers.get("Content-Encoding", "")
    if len(body) > MAX_BODY:
        raise ValueError(f"scrape body over {MAX_BODY} bytes")
    if encoding.lower() == "gzip":
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = decoder.decompress(body, MAX_BODY + 1)
        except zlib.error as e:
            raise gzip.BadGzipFile(f"bad gzip body: {e}") from None
        if len(body) > MAX_BODY:
            raise ValueError(f"scrape body over {MAX_BODY} bytes after gzip")
    return Response(body, content_type)

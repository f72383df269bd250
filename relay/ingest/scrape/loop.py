"""One target's scrape loop state, as Prometheus 2.42's ``scrapeLoop`` keeps it: a scrape becomes
one RW 1.0 WriteRequest.

Contract of :meth:`TargetLoop.scrape_once` (what one scrape writes, at the scrape's start time):

- every exposed sample, names as exposed, target labels joined (:mod:`.target`); an explicit
  timestamp kept when ``honor_timestamps`` (default), and such a series takes no part in staleness;
- a staleness marker (NaN ``0x7ff0000000000002``) for each series of the previous scrape that is
  gone from this one;
- a scrape that fails (the fetch, the parse, ``sample_limit``, a ``label_*`` limit) writes none of
  its samples: only markers for the previous scrape's series it did not reach (Prometheus rolls the
  samples back and appends an empty scrape, so a series appended before a parse error or below the
  sample limit is not marked until the next scrape that lacks it);
- the five report series ``up``, ``scrape_duration_seconds``, ``scrape_samples_scraped``,
  ``scrape_samples_post_metric_relabeling``, ``scrape_series_added`` (series new to the scrape
  cache, which forgets a series after a successful scrape without it);
- the metadata (type, help, unit) of the families with TYPE/HELP/UNIT lines when it changed, and
  again every minute (Prometheus's ``metadata_config.send_interval``).

:meth:`TargetLoop.end_of_run` is what a target that leaves writes: markers for every series of
its last scrape and for its report series. Not thread-safe: one thread drives one loop.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.common.labels import Labels
from relay.common.protowire import encode_len, encode_uvarint
from relay.common.ratelog import RateLimitedLog
from relay.ingest.scrape import textparse
from relay.ingest.scrape.target import Response, ScrapeTarget, report_labels, sample_labels
from relay.ingest.wire_codec import encode_write_request

log = logging.getLogger("relay.scrape")
_failures = RateLimitedLog(log)

STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
REPORT_NAMES = ("up", "scrape_duration_seconds", "scrape_samples_scraped",
                "scrape_samples_post_metric_relabeling", "scrape_series_added")  # fmt: skip
METADATA_RESEND_S = 60.0
Fetch = Callable[[str, float], "str | Response"]
Written = list[tuple[Labels, int, float]]


class LimitError(ValueError):
    pass


@dataclass
class _Entry:
    labels: Labels
    last_iter: int
    last_ts: int = -(1 << 63)  # the last explicit timestamp appended (the TSDB's out-of-order rule)


@dataclass
class LoopState:
    """What a loop carries from scrape to scrape (and to its successor when a reload changes it)."""

    cache: dict[str, _Entry] = field(default_factory=dict)
    metadata: dict[str, tuple[textparse.Family, int]] = field(default_factory=dict)
    prev: set[Labels] = field(default_factory=set)
    iter: int = 0
    successful_count: int = 0
    scraped: bool = False
    up: bool | None = None
    metadata_sent: bytes = b""
    metadata_sent_at: float = -math.inf


@dataclass
class _Result:
    written: Written
    total: int = 0
    added: int = 0
    series_added: int = 0
    error: Exception | None = None
    cur: set[Labels] = field(default_factory=set)  # the series this append tracks for staleness


class TargetLoop:
    def __init__(self, target: ScrapeTarget, fetch: Fetch, clock: Callable[[], float] = time.time,
                 state: LoopState | None = None) -> None:
        self.target = target
        self.fetch = fetch
        self.clock = clock
        self.state = state or LoopState()
        self._target_labels = target.target_labels()

    def scrape_once(self) -> bytes:
        start = self.clock()
        started = time.monotonic()
        ts = int(start * 1000)
        error: Exception | None = None
        response = Response(b"")
        try:
            got = self.fetch(self.target.url, self.target.timeout_s)
            response = Response(got.encode()) if isinstance(got, str) else got
        except Exception as e:  # any failure of the target is up=0, never raised
            error = e
        result = self._append(response, ts)
        if result.error is not None:
            # Prometheus rolls the samples back and appends an empty scrape: markers only
            result = _Result(self._append(Response(b""), ts, result.cur).written, result.total,
                             result.added, result.series_added, result.error)
        error = error or result.error
        self._log_health(error)
        report = (0.0 if error else 1.0, time.monotonic() - started,
                  float(result.total), float(result.added), float(result.series_added))
        written = result.written + [(report_labels(n, self._target_labels), ts, v)
                                    for n, v in zip(REPORT_NAMES, report, strict=True)]
        self.state.scraped = True
        return encode_write_request(((lb, [(t, v)]) for lb, t, v in written), self._metadata_due())

    def end_of_run(self, ts: int) -> bytes:
        """Markers for every series of the last scrape and for the report series (a target that left)."""
        st = self.state
        written = [(lb, ts, STALE_NAN) for lb in sorted(st.prev)]
        written += [(report_labels(n, self._target_labels), ts, STALE_NAN) for n in REPORT_NAMES]
        st.prev = set()
        return encode_write_request((lb, [(t, v)]) for lb, t, v in written)

    # -- one append, as scrapeLoop.append -----------------------------------------------------------
    def _append(self, response: Response, ts: int, cur: set[Labels] | None = None) -> _Result:
        st, target = self.state, self.target
        out = _Result([], cur=set() if cur is None else cur)
        cur = out.cur
        try:
            parsed = textparse.parse(response.body, response.content_type)
            samples, families = parsed.samples, parsed.families
        except textparse.ParseError as e:
            samples, families, out.error = e.samples, {}, e
        for name, family in families.items():
            st.metadata[name] = (family, st.iter)
        limit_error: Exception | None = None
        seen: set[Labels] = set()
        for s in samples:
            out.total += 1
            explicit = s.timestamp_ms if target.honor_timestamps else None
            t = ts if explicit is None else explicit
            entry = st.cache.get(s.key)
            if entry is not None:
                entry.last_iter = st.iter
                labels = entry.labels
            else:
                labels = sample_labels(s.name, s.labels, self._target_labels, target.honor_labels)
                if (problem := self._label_limit(labels)) is not None:
                    out.error = LimitError(problem)
                    break
            ok = True
            if target.sample_limit and out.total > target.sample_limit:  # limitAppender's count
                limit_error = limit_error or LimitError(f"sample_limit exceeded ({target.sample_limit})")
                ok = False
            elif labels in seen or (explicit is not None and entry is not None and explicit <= entry.last_ts):
                ok = False  # a duplicate in this scrape, or an explicit timestamp not after the last
            else:
                seen.add(labels)
                out.written.append((labels, t, s.value))
            if entry is None:
                entry = st.cache[s.key] = _Entry(labels, st.iter)
                if explicit is None:
                    cur.add(labels)
                if ok and limit_error is None:
                    out.series_added += 1
            elif ok and explicit is None:
                cur.add(labels)
            if ok and explicit is not None:
                entry.last_ts = explicit
            out.added += 1
        if out.error is None:
            out.error = limit_error
        if out.error is None:
            out.written += [(lb, ts, STALE_NAN) for lb in sorted(st.prev - cur)]
            self._iter_done(flush=len(response.body) > 0)
            st.prev = cur
        return out  # on an error nothing is written: the empty append that follows compares with ``cur``

    def _label_limit(self, labels: Labels) -> str | None:
        target = self.target
        name = next((v for n, v in labels if n == "__name__"), "")
        if target.label_limit and len(labels) > target.label_limit:
            return (f"label_limit exceeded (metric: {name[:50]}, number of labels: {len(labels)}, "
                    f"limit: {target.label_limit})")
        for n, v in labels:
            if target.label_name_length_limit and len(n.encode()) > target.label_name_length_limit:
                return (f"label_name_length_limit exceeded (metric: {name[:50]}, label name: {n[:50]}, "
                        f"length: {len(n.encode())}, limit: {target.label_name_length_limit})")
            if target.label_value_length_limit and len(v.encode()) > target.label_value_length_limit:
                return (f"label_value_length_limit exceeded (metric: {name[:50]}, label name: {n[:50]}, "
                        f"value: {v[:50]}, length: {len(v.encode())}, limit: {target.label_value_length_limit})")
        return None

    def _iter_done(self, flush: bool) -> None:
        st = self.state
        count = len(st.cache) + len(st.metadata)
        if flush:
            st.successful_count = count
        elif count > st.successful_count * 2 + 1000:
            flush = True  # failing scrapes with churning labels: Prometheus's forced flush
        if flush:
            st.cache = {k: e for k, e in st.cache.items() if e.last_iter == st.iter}
            st.metadata = {k: m for k, m in st.metadata.items() if m[1] == st.iter}
        st.iter += 1

    # -- metadata and logs ------------------------------------------------------------------------
    def _metadata_due(self) -> bytes:
        st = self.state
        encoded = b"".join(_metadata_entry(name, f) for name, (f, _) in sorted(st.metadata.items()))
        now = time.monotonic()
        if encoded and (encoded != st.metadata_sent or now - st.metadata_sent_at >= METADATA_RESEND_S):
            st.metadata_sent, st.metadata_sent_at = encoded, now
            return encoded
        return b""

    def _log_health(self, error: Exception | None) -> None:
        st, target = self.state, self.target
        up = error is None
        if up and st.up is False:
            log.info("scrape job=%s url=%s is up again", target.job, target.url)
        elif not up:
            reason = type(error).__name__
            # one line when the target goes down, then at most one a minute while it stays down
            if st.up is not False:
                log.warning("scrape job=%s url=%s failed: %s: %s", target.job, target.url, reason,
                            _one_line(error), extra={"reason": reason})
            else:
                _failures.warning((target.key, reason), "scrape job=%s url=%s still failing: %s: %s",
                                  target.job, target.url, reason, _one_line(error), extra={"reason": reason})
        st.up = up


def _one_line(error: Exception | None) -> str:
    text = str(error).splitlines()
    return text[0][:200] if text else ""


def _metadata_entry(name: str, family: textparse.Family) -> bytes:
    """A WriteRequest field-3 MetricMetadata entry (type 1, family name 2, help 4, unit 5)."""
    kind = textparse.TYPE_NUMBERS.get(family.type, 0)
    body = (b"\x08" + encode_uvarint(kind) if kind else b"") + encode_len(2, name.encode())
    if family.help:
        body += encode_len(4, family.help.encode())
    if family.unit:
        body += encode_len(5, family.unit.encode())
    return encode_len(3, body)

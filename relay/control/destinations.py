"""One destination's running parts (stats, durable queue, sender) and how a config generation builds them.

A reload is two phases. ``prepare`` builds everything a new configuration needs (queues that must be
opened, transports and their credential providers, senders) without touching a running part; any
failure closes what it opened and raises :class:`SetupError` naming the destination and what to do,
so the caller keeps the old generation running. ``Generation.commit`` then stops the senders being
replaced before their successors start (never two senders on one queue), closes what left the
configuration, and starts the new senders; a queue that fails to close is one warning, never a
commit left half done (new senders not started).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from relay import __version__
from relay.common.metrics import RelayMetrics
from relay.config.config import Config, DestinationConfig
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import Sender, SenderSettings
from relay.delivery.transport import Transport
from relay.state.cardinality import CardinalityMetrics, DestinationStats

log = logging.getLogger("relay.destinations")

TransportFactory = Callable[[DestinationConfig], Transport]
QueueFactory = Callable[[DestinationConfig, Path], DurableQueue]


class SetupError(RuntimeError):
    """A destination's queue or credentials cannot be set up; ``str()`` is one line with a hint."""

    def __init__(self, destination: str, what: str, cause: BaseException, hint: str) -> None:
        reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        for named in (f"destination {destination!r}: ", f"destination {destination}: "):
            reason = reason.removeprefix(named)  # the cause may name the destination itself
        super().__init__(f"destination {destination}: cannot set up {what}: {reason} ({hint})")
        self.destination = destination
        self.what = what


@dataclass
class Destination:
    config: DestinationConfig
    stats: DestinationStats
    queue: DurableQueue | None
    sender: Sender | None
    credentials: str = "none"  # how it authenticates, for the start-up line and the status page
    # the shard count the pipeline shards its series under now (relay.shardplan changes it)
    shards: int = 1


def sender_key(d: DestinationConfig) -> tuple[Any, ...]:
    """What a running sender was built from: any change needs a new sender (and transport)."""
    return (d.url, d.sigv4, tuple(sorted(d.headers.items())), d.queue, d.dry_run,
            d.send_metadata)


def sender_settings(d: DestinationConfig) -> SenderSettings:
    q = d.queue
    return SenderSettings(
        max_samples_per_send=q.max_samples_per_send,
        batch_send_deadline=q.batch_send_deadline,
        min_backoff=q.min_backoff,
        max_backoff=q.max_backoff,
        max_sample_age=q.max_sample_age,
        timeout=q.timeout,
        on_auth_error="drop" if q.on_auth_error == "drop" else "hold",
    )


def queue_path(storage: Path, d: DestinationConfig) -> Path:
    return storage / f"{d.name}.queue.db"


def open_queue(d: DestinationConfig, path: Path) -> DurableQueue:
    return DurableQueue(path, d.queue.max_disk)


def amp_region(url: str) -> str | None:
    """The region of an Amazon Managed Prometheus URL (host ``aps-workspaces.<region>.amazonaws.com``)."""
    host = (urlsplit(url).hostname or "").lower()
    parts = host.split(".")
    if len(parts) >= 4 and parts[0] == "aps-workspaces" and parts[-2:] == ["amazonaws", "com"]:
        return parts[1]
    return None


def credential_method(d: DestinationConfig, env: Mapping[str, str] | None = None) -> str:
    """Which credentials a destination signs with, from its config and the environment (no secrets)."""
    s = d.sigv4
    if s is None:
        return "none (no sigv4)"
    env = os.environ if env is None else env
    if s.access_key:
        base = "static keys from the config"
    elif s.profile:
        base = f"profile {s.profile}"
    elif env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
        base = "default chain (IRSA web identity)"
    elif env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        base = "default chain (EKS Pod Identity / container credentials)"
    elif env.get("AWS_ACCESS_KEY_ID"):
        base = "default chain (environment keys)"
    else:
        base = "default chain"
    role = f", then assume role {s.role_arn}" if s.role_arn else ""
    return f"sigv4 region {s.region}, {base}{role}"


@dataclass
class Generation:
    """A prepared configuration: its destinations, and what committing it stops, closes and starts."""

    destinations: dict[str, Destination]
    stop_senders: list[Sender] = field(default_factory=list)
    close_queues: list[DurableQueue] = field(default_factory=list)
    start_senders: list[Sender] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)
    opened: list[DurableQueue] = field(default_factory=list)
    # new senders on a kept queue whose max_shards changed: they first drain what the old count sharded
    barriers: list[tuple[Sender, DurableQueue]] = field(default_factory=list)
    # every new sender with the shard count its pipeline shards its queue under
    shard_counts: list[tuple[Sender, int]] = field(default_factory=list)
    # (new sender, the one it replaces): the last success and error carry over, as the counters do
    carry: list[tuple[Sender, Sender]] = field(default_factory=list)
    # kept queues whose max_disk changed
    resize: list[tuple[DurableQueue, int]] = field(default_factory=list)
    # stats made afresh (name, the running stats they replace): tracked for /metrics from creation
    new_stats: list[tuple[str, DestinationStats | None]] = field(default_factory=list)

    def abandon(self, cm: CardinalityMetrics) -> None:
        """Undo ``prepare`` (a later step failed): close only what it opened itself, and put the
        running stats back behind gpu_relay_active_series."""
        for name, old in self.new_stats:
            if old is not None:
                cm.track(old)
            else:
                cm.untrack(name)
        for q in self.opened:
            with contextlib.suppress(Exception):
                q.close()
        for s in self.start_senders:
            _close(s.transport)

    def commit(self, rm: RelayMetrics, cm: CardinalityMetrics, *, start: bool = True) -> None:
        for s in self.stop_senders:  # final: no request of the old sender in flight after this
            s.stop()
        for new, old in self.carry:  # after the stop: nothing changes them on the old one any more
            for attr in ("last_success", "last_error"):
                if getattr(new, attr, None) is None and getattr(old, attr, None) is not None:
                    setattr(new, attr, getattr(old, attr))
        for q in self.close_queues:
            try:
                q.close()
            except Exception as e:  # e.g. a full disk: what it held stays in its file; go on committing
                log.warning("could not close the queue %s of a replaced destination: %s", q.path,
                            str(e).splitlines()[0] if str(e) else type(e).__name__,
                            extra={"reason": "queue_close"})
        for name in self.forget:
            cm.untrack(name)
            rm.forget_destination(name)  # its gpu_relay_* series left with it
        for q, max_disk in self.resize:
            q.max_disk_bytes = max_disk
        for sender in self.start_senders:
            pred = sender.predecessor
            if sender.drain_first is None and pred is not None and pred.drain_first is not None:
                # the old sender had not finished draining a max_shards change: its successor does
                sender.drain_first = pred.drain_first
        for sender, q in self.barriers:
            # Entries up to the queue's newest id were sharded under the old count: the new sender
            # ships them first, in id order, so per-series order holds (relay.sender's drain_first).
            sender.drain_first = q.last_id()
        for sender, shards in self.shard_counts:
            barrier = shard_barrier(sender.queue, shards)
            if barrier is not None and (sender.drain_first is None or sender.drain_first < barrier):
                sender.drain_first = barrier
            if sender.drain_first is not None:
                sender.record_after_drain = shards  # the file says "unknown" until the drain is done
        if start:
            for s in self.start_senders:
                s.start()


def prepare(
    config: Config,
    running: Mapping[str, Destination],
    rm: RelayMetrics,
    cm: CardinalityMetrics,
    transport_factory: TransportFactory,
    queue_factory: QueueFactory = open_queue,
) -> Generation:
    """Build every part ``config`` needs, reusing running ones that did not change; raise SetupError."""
    storage = Path(config.storage_path)
    gen = Generation({})
    try:
        if any(not d.dry_run for d in config.destinations):
            try:
                storage.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                first = next(d for d in config.destinations if not d.dry_run)
                raise SetupError(first.name, f"storage {storage}", e,
                                 "make storage.path a writable directory") from None
        for d in config.destinations:
            gen.destinations[d.name] = _prepare_one(d, running.get(d.name), storage, gen, rm, cm,
                                                    transport_factory, queue_factory)
    except BaseException:
        gen.abandon(cm)
        raise
    for name, old in running.items():
        if name not in gen.destinations:
            if old.sender is not None:
                gen.stop_senders.append(old.sender)
            if old.queue is not None:
                gen.close_queues.append(old.queue)
            gen.forget.append(name)
    return gen


def _prepare_one(
    d: DestinationConfig,
    old: Destination | None,
    storage: Path,
    gen: Generation,
    rm: RelayMetrics,
    cm: CardinalityMetrics,
    transport_factory: TransportFactory,
    queue_factory: QueueFactory,
) -> Destination:
    if old is not None and old.stats.window_s == d.limits.window:
        stats = old.stats
    else:  # new, or limits.window changed: series are tracked afresh over the new window
        stats = DestinationStats(d.name, window_s=d.limits.window, metrics=cm)
        gen.new_stats.append((d.name, old.stats if old is not None else None))
    method = credential_method(d)
    shards = d.queue.min_shards
    if old is not None and sender_key(old.config) == sender_key(d) and _same_queue(old, storage, d):
        return Destination(d, stats, old.queue, old.sender, method, old.shards)
    queue: DurableQueue | None = None
    sender: Sender | None = None
    if not d.dry_run:
        # credentials first: they fail more often, and a queue opened for nothing logs its recovery
        try:
            transport = transport_factory(d)
        except Exception as e:
            raise SetupError(d.name, "credentials", e, _credential_hint(d)) from None
        path = queue_path(storage, d)
        if old is not None and old.queue is not None and _same_queue(old, storage, d):
            queue = old.queue  # one DurableQueue per file: its counts live in memory
            if old.config.queue.max_disk != d.queue.max_disk:
                gen.resize.append((queue, d.queue.max_disk))
        else:
            try:
                queue = queue_factory(d, path)
            except Exception as e:
                _close(transport)
                raise SetupError(d.name, f"its queue {path}", e,
                                 "check that storage.path is writable and has free space") from None
            gen.opened.append(queue)
        shards = start_shards(queue, d, old.shards if old is not None and old.queue is queue else None)
        auth = getattr(transport, "auth", None)
        resolved = getattr(auth, "method", None)
        if isinstance(resolved, str) and resolved:
            method += f" (resolved: {resolved})"
        auth_refresh = getattr(transport, "refresh_credentials", None)
        sender = Sender(
            d.name, d.url, queue, transport, sender_settings(d), rm,
            headers=d.headers, auth_refresh=auth_refresh, user_agent=f"gpu-relay/{__version__}",
        )
        gen.start_senders.append(sender)
        gen.shard_counts.append((sender, shards))
        if old is not None and old.sender is not None:
            gen.carry.append((sender, old.sender))
        if old is not None and old.sender is not None and old.queue is queue:
            sender.predecessor = old.sender  # sends nothing until the old one's threads are gone
        if old is not None and old.queue is queue and old.shards != shards:
            gen.barriers.append((sender, queue))
    if old is not None:
        if old.sender is not None:
            gen.stop_senders.append(old.sender)
        if old.queue is not None and old.queue is not queue:
            gen.close_queues.append(old.queue)
    return Destination(d, stats, queue, sender, method, shards)


def start_shards(queue: DurableQueue, d: DestinationConfig, running: int | None) -> int:
    """The shard count a new sender on ``queue`` starts with, between ``d``'s min_shards and
    max_shards: the running one's (a reload), else the count its queued entries were sharded under
    (a restart: no drain needed), else min_shards (relay.shardplan raises it when sending lags)."""
    lo, hi = d.queue.min_shards, d.queue.max_shards
    if running is None:
        try:
            recorded = queue.shard_count() if queue.shards() else None
        except Exception:  # unreadable: start at the fewest (shard_barrier drains what is queued)
            recorded = None
        running = recorded or lo
    return min(max(running, lo), hi)


def shard_barrier(queue: DurableQueue, shards: int) -> int | None:
    """The drain barrier (``Sender.drain_first``) a sender needs on ``queue`` when its entries were
    sharded under another shard count than ``shards``, or an unknown one (a queue recovered after a
    restart with another count, a change stopped before its drain was done, or written before the
    count was recorded). Records ``shards`` when no drain is needed, else "unknown" (the sender records
    ``shards`` once its drain is done: a stop or crash before that drains again at the next start)."""
    try:
        recorded = queue.shard_count()
    except Exception:  # unreadable: assume another count (draining in id order is always safe)
        recorded = None
    barrier = queue.last_id() if recorded != shards and queue.shards() else None
    if recorded != shards:
        try:
            queue.set_shard_count(0 if barrier is not None else shards)
        except Exception as e:
            log.warning("queue %s: cannot record its shard count: %s", queue.name,
                        str(e).splitlines()[0] if str(e) else type(e).__name__, extra={"reason": "queue"})
    return barrier


def _close(transport: object) -> None:
    close = getattr(transport, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _same_queue(old: Destination, storage: Path, d: DestinationConfig) -> bool:
    if old.queue is None or d.dry_run:
        return old.queue is None and d.dry_run
    return Path(old.queue.path) == queue_path(storage, d)


def _credential_hint(d: DestinationConfig) -> str:
    s = d.sigv4
    if s is None:
        return "check the destination's url and headers"
    if s.profile:
        return f"create profile {s.profile!r} in ~/.aws/config (or AWS_CONFIG_FILE), or remove sigv4.profile"
    return ("give the pod an IAM role (IRSA or EKS Pod Identity), set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or name a sigv4.profile")

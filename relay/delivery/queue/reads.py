"""Reads of a DurableQueue: ``peek`` (a shard's oldest rows, held by its consumer until acked),
``peek_upto`` (the drain barrier across shards) and the oldest times for the report.

A shard whose every row is in memory (relay.delivery.queue.recent) is answered from there, with the
same selection a read of the file would make; otherwise the rows are read from the file and handed
out as stored once their checksum matches (a damaged row: one ERROR and an empty entry).
"""

from __future__ import annotations

from relay.delivery.queue import codec as queue_codec
from relay.delivery.queue.acks import QueueAcks
from relay.delivery.queue.store import log
from relay.delivery.queue.types import Entry

# A peeked row as three columns: its payload, its enqueue time (a REAL, read as it is) and its integers
# in one text, NULL raw_len and crc as _NULL (raw_len is below 2^32, crc a signed 32-bit value);
# _meta reads them back.
_NULL = -(1 << 63)
_PEEK_COLUMNS = ("payload, enqueued_at, printf('%d %d %d %d %d %d', id, shard, samples, oldest_ts, "
                 f"IFNULL(raw_len, {_NULL}), IFNULL(crc, {_NULL}))")


def _meta(text: str) -> tuple[int, int, int, int, int | None, int | None]:
    """(id, shard, samples, oldest_ts, raw_len, crc) of a peeked row's integer column."""
    rid, shard, samples, oldest, raw_len, crc = map(int, text.split())
    return rid, shard, samples, oldest, (None if raw_len == _NULL else raw_len), (None if crc == _NULL else crc)



class QueueReads(QueueAcks):
    def peek(self, shard: int, max_samples: int, max_entries: int = 1000, *, after: int = 0,
             upto: int | None = None) -> list[Entry]:
        """Oldest entries of a shard, up to max_samples (always >= 1 entry if any are queued). The
        shard's consumer holds them until acked or its next peek: queue_full never deletes them.

        ``after`` (the id of the last entry the consumer holds): only newer entries, up to
        max_samples and max_entries MORE (none if the next one does not fit), held together with
        those it already holds. A consumer waiting for a fuller batch so reads each entry once.
        ``upto``: only entries with an id up to this one (a shard's part of a drain barrier)."""
        where, args = "shard = ?", [shard]
        if after > 0:
            where, args = where + " AND id > ?", [*args, after]
        if upto is not None:
            where, args = where + " AND id <= ?", [*args, upto]
        return self._read(shard, where, tuple(args), max_samples, max_entries, extend=after > 0, after=after, upto=upto)

    def peek_upto(self, max_id: int, max_samples: int, max_entries: int = 1000) -> list[Entry]:
        """Oldest entries of ANY shard with id <= max_id, in id order: the barrier a change of the
        shard count drains first, so per-series order holds across it (consumer key -1)."""
        return self._read(-1, "id <= ?", (max_id,), max_samples, max_entries)

    def _read(self, key: int, where: str, args: tuple[int, ...], max_samples: int, max_entries: int,
              extend: bool = False, after: int = 0, upto: int | None = None) -> list[Entry]:
        if extend and (max_entries <= 0 or max_samples < 0):
            return []
        with self._cond:
            if self._closed:
                return []
            if key >= 0:
                self._seen_seq[key] = self._put_seq.get(key, 0)
        out: list[Entry] = []
        counts: dict[int, tuple[int, int]] = {}  # as on file (a damaged entry is handed out with none)
        total = 0
        with self._rlock:
            with self._cond:
                rows = self._recent.rows(key) if key >= 0 else None
                if rows is not None:  # every row of the shard is in memory: the same selection, no read
                    delivered = self._delivered
                    for e in rows:
                        if upto is not None and e.id > upto:
                            break
                        if e.id <= after or e.id in delivered:
                            continue
                        if (out or extend) and (total + e.samples > max_samples or len(out) >= max_entries):
                            break
                        out.append(e)
                        total += e.samples
                    self._hold(key, {e.id: (e.shard, e.samples) for e in out}, extend)
                    return out
                skip = set(self._delivered)  # (the file is read outside _cond)
            cur = self._rdb.execute(
                f"SELECT {_PEEK_COLUMNS} FROM entries WHERE {where} ORDER BY id LIMIT ?",
                (*args, max(1, max_entries) + len(skip)))
            for payload, enqueued_at, meta in cur:
                rid, shard, samples, oldest, raw_len, crc = _meta(meta)
                if rid in skip:
                    continue
                if (out or extend) and (total + samples > max_samples or len(out) >= max_entries):
                    break
                out.append(self._entry(rid, shard, payload, raw_len, crc, samples, enqueued_at, oldest))
                counts[rid] = (shard, samples)
                total += samples
            cur.close()
            with self._cond:  # still under the read lock: a trimming commit sees it (see _commit)
                self._hold(key, counts, extend)
        return out

    def _hold(self, key: int, counts: dict[int, tuple[int, int]], extend: bool) -> None:
        """Under _cond: the consumer ``key`` holds these ids (id -> (shard, samples) as counted)."""
        if extend:
            self._held.setdefault(key, {}).update(counts)
        else:
            self._held[key] = counts

    def _entry(self, rid: int, shard: int, stored: bytes, raw_len: int | None, crc: int | None, samples: int,
               enqueued_at: float, oldest: int) -> Entry:
        """The row as stored once its checksum matches (a row from before checksums: decompressed, the
        old check). SQLite has no checksums of its own: a damaged page reads back as garbage."""
        stored = bytes(stored)
        try:
            if crc is None:
                return Entry(rid, shard, queue_codec.unpack(stored, raw_len), samples, enqueued_at, oldest)
            if queue_codec.checksum(stored, raw_len) != crc:
                raise queue_codec.CodecError("checksum mismatch")
            return Entry(rid, shard, stored, samples, enqueued_at, oldest, raw_len)
        except queue_codec.CodecError as e:
            log.error("queue %s: entry %d is damaged (%s); its %d samples are dropped", self.name, rid, e,
                      samples, extra={"destination": self.name, "reason": "queue_damaged"})
            return Entry(rid, shard, b"", 0, enqueued_at, oldest)

    def oldest_enqueued_at(self) -> float | None:
        with self._rlock:
            if self._closed:
                return None
            row = self._rdb.execute("SELECT enqueued_at FROM entries ORDER BY id LIMIT 1").fetchone()
        return None if row is None else float(row[0])

    def oldest_sample_time(self) -> float | None:
        """Unix time of the oldest sample still queued (enqueue time for entries without one)."""
        with self._rlock:
            if self._closed:
                return None
            row = self._rdb.execute("SELECT MIN(CASE WHEN oldest_ts > 0 THEN oldest_ts / 1000.0 "
                                    "ELSE enqueued_at END) FROM entries").fetchone()
        return None if row is None or row[0] is None else float(row[0])

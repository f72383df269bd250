"""Acks of a DurableQueue: the deletes of sent (or dropped) rows, folded into the next put's
transaction when one is under way, else written in a transaction of their own without fsync.

An ack never raises for a storage failure: the ids are kept in memory, never handed out again, and
the delete is retried on the next put or ack. A failed write gives the volume's reserve back and
checkpoints the WAL, so acks can still be written on a full volume (``_make_room``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence

from relay.delivery.queue import files as qf
from relay.delivery.queue import opening as qo
from relay.delivery.queue.store import QueueStore, log


class QueueAcks(QueueStore):
    def ack(self, ids: Sequence[int]) -> None:
        """Delete entries (sent, or dropped by the sender). Unknown ids are ignored. Never raises for
        a storage failure: the ids are kept and the delete retried; they are not handed out again.

        While a put is being committed the delete is left to it: that commit, or the next one if it
        read the acks before these came in (its put then writes them on its own, when no other put
        waits), deletes them in its own transaction. So an ack costs no transaction of its own under
        load; it is on file once the put is, and never handed out again from the moment it returns."""
        with self._cond:
            if self._closed:
                return
            self._note_acked(ids)
            if self._committing or self._pending:
                return
        self._write_acks()

    def _write_acks(self) -> None:
        """The acks not yet written, in a transaction of their own."""
        with self._wlock:
            if self._closed:
                return
            if not self._flush_delivered(self._wdb) and self._make_room(locked=True):
                self._flush_delivered(self._wdb)
            self._maintain(self._wdb)

    def _make_room(self, locked: bool = False) -> bool:
        """After a failed write: give the reserve back to the volume and move the WAL into the db, so
        acks can be written and free pages for the next puts. True if the reserve was released."""
        released = qf.release_reserve(self.path)
        if released:
            self._reserve = False
            self._need_reserve = True  # no put until the reserve can be made again
            log.debug("queue %s: write failed; released the disk reserve", self.name)
        with contextlib.ExitStack() as stack:
            if not locked:
                stack.enter_context(self._wlock)
            with self._rlock, contextlib.suppress(sqlite3.Error):
                self._wdb.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return released

    def _delete_acked(self, db: sqlite3.Connection, ids: list[int],
                      removed: dict[int, list[int]]) -> tuple[list[int], int]:
        """In a put's transaction: delete acked rows. A chunk whose DELETE fails is undone by SQLite
        (a statement is atomic) and left, with the ones after it, for the next write; so is
        everything if the failure ended the transaction (then a new one is begun for the put).
        Returns (ids deleted, their bytes); their counts go to ``removed``."""
        done: list[int] = []
        nbytes = 0
        got: dict[int, list[int]] = {}
        try:
            for chunk in self._chunks(ids):
                nbytes += self._delete_chunk(db, chunk, got)
                done += chunk
        except sqlite3.Error as e:
            log.debug("queue %s: ack of %d entries not written yet (%s); will retry", self.name, len(ids), e)
            if not db.in_transaction:  # SQLite rolled the whole transaction back (full disk, I/O error)
                db.execute("BEGIN IMMEDIATE")
                return [], 0
        for shard, (n, samples) in got.items():
            r = removed.setdefault(shard, [0, 0])
            r[0] += n
            r[1] += samples
        return done, nbytes

    @staticmethod
    def _chunks(ids: list[int]) -> list[list[int]]:
        return [ids[i : i + 500] for i in range(0, len(ids), 500)]

    def _delete_ids(self, db: sqlite3.Connection, ids: list[int], removed: dict[int, list[int]]) -> int:
        """DELETE the rows; their (entries, samples) per shard added to ``removed``; returns their bytes."""
        return sum(self._delete_chunk(db, chunk, removed) for chunk in self._chunks(ids))

    def _delete_chunk(self, db: sqlite3.Connection, ids: list[int], removed: dict[int, list[int]]) -> int:
        """One DELETE of up to 500 rows; counts added to ``removed`` only once it succeeded. A row held in
        memory is counted from there (it is on file: memory drops a row in the same step as its delete);
        only the others are counted by a SELECT (a row a shard), those not on file not at all."""
        counts: dict[int, list[int]] = {}
        d_bytes = 0
        unknown: list[int] = []
        get = self._recent.get
        for rid in ids:
            e = get(rid)
            if e is None:
                unknown.append(rid)
                continue
            c = counts.get(e.shard)
            if c is None:
                c = counts[e.shard] = [0, 0]
            c[0] += 1
            c[1] += e.samples
            d_bytes += len(e.stored) if e.raw_len is None else e.raw_len
        if unknown:
            for shard, count, samples, nbytes in db.execute(
                    f"SELECT shard, COUNT(*), SUM(samples), SUM({qo.SIZE}) FROM entries "
                    f"WHERE id IN ({','.join('?' * len(unknown))}) GROUP BY shard", unknown).fetchall():
                c = counts.setdefault(shard, [0, 0])
                c[0] += count
                c[1] += samples
                d_bytes += nbytes
        db.execute(f"DELETE FROM entries WHERE id IN ({','.join('?' * len(ids))})", ids)
        self._pages.deleted(d_bytes, sum(c[0] for c in counts.values()))
        for shard, (n, samples) in counts.items():
            r = removed.setdefault(shard, [0, 0])
            r[0] += n
            r[1] += samples
        return d_bytes

    def _flush_delivered(self, db: sqlite3.Connection) -> bool:
        """Write the deletes of acked entries. True if done (or nothing to do)."""
        with self._cond:
            ids = list(self._delivered)
        if not ids:
            return True
        removed: dict[int, list[int]] = {}
        d_bytes = 0
        toggle = self._sync != "NORMAL"  # each PRAGMA is a statement: none when it is NORMAL anyway
        try:
            if toggle:
                db.execute("PRAGMA synchronous=NORMAL")  # losing an ack on a crash only resends
            db.execute("BEGIN IMMEDIATE")
            d_bytes = self._delete_ids(db, ids, removed)
            db.execute("COMMIT")
            self._log.commit([], ids, sum(r[1] for r in removed.values()))
        except sqlite3.Error as e:
            self._rollback(db)
            log.debug("queue %s: ack of %d entries not written yet (%s); will retry", self.name, len(ids), e)
            return False
        finally:
            if toggle:
                with contextlib.suppress(sqlite3.Error):
                    db.execute(f"PRAGMA synchronous={self._sync}")
        with self._cond:
            self._forget_delivered(ids)
            self._samples -= sum(r[1] for r in removed.values())
            self._bytes -= d_bytes
            self._recent.gone_behind(removed, self._recent.remove(ids))
            self._removed(removed)
        return True

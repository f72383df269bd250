/* relay.native._cstage's private header for a destination's pieces (pieces.c, take.c, take_calls.c, route.c).
 *
 * Reference: relay/state/stage.py, DestinationStage.take: its drops by reason, its per-shard
 * payloads (WriteRequest field-1 entries) and the label bytes of a series it sends.
 */
#ifndef GPU_RELAY_CSTAGE_PIECES_H
#define GPU_RELAY_CSTAGE_PIECES_H

#include "cstage.h"

enum { K_DROP = 0, K_AGG = 1, K_SENT = 2 };

typedef struct {
    PyObject *reason; /* borrowed (a decision's metric slot, or one of the module's names) */
    int64_t samples, series;
} Drop;

typedef struct {
    Drop *d;
    Py_ssize_t n, cap;
} Drops;

/* the reasons take() names itself (module.c interns them) */
extern PyObject *S_aggregated, *S_too_far, *S_agg_histogram, *S_collision, *S_series_limit;

int drops_add(Drops *ds, PyObject *reason, int64_t samples, int series);

/* a shard's payload, built in place in a bytes object (no copy at the end) */
typedef struct {
    PyObject *bytes; /* owned, or NULL */
    char *p;
    size_t len, cap;
} Buf;

int buf_grow(Buf *b, size_t more);
static inline int buf_reserve(Buf *b, size_t more) { return b->len + more <= b->cap ? 0 : buf_grow(b, more); }
int buf_presize(Buf *b, size_t n); /* an empty buffer given exactly n bytes of room */

/* Room for one WriteRequest field-1 entry of `size` bytes, its tag and length written: where the
 * entry's bytes go (the caller writes `size` of them and adds them to b->len); NULL with an exception. */
static inline char *buf_entry(Buf *b, size_t size) {
    if (buf_reserve(b, size + 11) < 0)
        return NULL;
    b->p[b->len++] = 0x0a;
    size_t v = size;
    while (v >= 0x80) {
        b->p[b->len++] = (char)(v | 0x80);
        v >>= 7;
    }
    b->p[b->len++] = (char)v;
    return b->p + b->len;
}

/* One destination's shard buffers, sample counts and oldest timestamps. */
typedef struct {
    Buf *bufs;
    int64_t *counts, *oldest;
    Py_ssize_t shards;
} Shards;

int shards_alloc(Shards *s, Py_ssize_t shards); /* -1 with MemoryError */
void shards_free(Shards *s);
/* the entry just written to shard s (its samples and timestamp) counted */
static inline void shards_note(Shards *s, Py_ssize_t shard, int64_t n, int64_t ts) {
    s->counts[shard] += n;
    if (ts && (ts < s->oldest[shard] || !s->oldest[shard]))
        s->oldest[shard] = ts;
}

/* take()'s answer for one destination: (pieces [(shard, bytes, samples, oldest)], kept, routed, drops
   [(reason, samples, series)]), a new reference or NULL. The shards' buffers are cut to their length. */
PyObject *stage_result(Shards *s, const Drops *drops, int64_t kept, int64_t routed);

/* label bytes of a sent series: a[0:an] + b[0:bn] + c[0:cn] (the input key around the external
 * labels' bytes, or the output bytes alone) */
typedef struct {
    const char *a, *b, *c;
    Py_ssize_t an, bn, cn;
    PyObject *whole; /* the bytes object when it is one (borrowed), else NULL */
} Lb;

typedef struct {
    uint64_t low;       /* the output id's 64 bits */
    uint64_t high;      /* bits above 64 (position and claim flag) */
    int64_t n, ts;
    int kind;
} Entry;

static inline Py_ssize_t lb_len(const Lb *lb) { return lb->an + lb->bn + lb->cn; }

/* the label bytes written to p (room for lb_len) */
static inline void lb_write(const Lb *lb, char *p) {
    memcpy(p, lb->a, (size_t)lb->an);
    if (lb->bn)
        memcpy(p + lb->an, lb->b, (size_t)lb->bn);
    if (lb->cn)
        memcpy(p + lb->an + lb->bn, lb->c, (size_t)lb->cn);
}

PyObject *lb_bytes(const Lb *lb); /* a new bytes object (or the one it is) */

/* take_calls.c: take()'s calls into the Python stage (each -1 with an exception) */
int aggregate_call(PyObject *stage, PyObject *en, PyObject *in_id, Drops *drops);
int owner_known(PyObject *owners_dict, const Entry *e, PyObject *in_id, PyObject **sid);
int owner_call(PyObject *stage, PyObject *owners, const Entry *e, PyObject *sid, PyObject *in_id,
               PyObject *in_active, PyObject **contains_fn);
int collided_call(PyObject *stage, const Lb *l);
int admit_call(PyObject *stage, const Entry *e, PyObject *metric, const Lb *l, PyObject *labels_of);

#endif /* GPU_RELAY_CSTAGE_PIECES_H */

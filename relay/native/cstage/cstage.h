/* relay.native._cstage's private header: what its parts share (the .c files of relay/native/cstage/, one extension).
 *
 * The parts, each the twin of a pure-Python reference that stays the fallback:
 *   table.c        the open addressing tables T12 (uint64 -> uint32) and T8 (48-bit key -> 16-bit generation)
 *   table_type.c   Table: T12 alone as a Python type (the tables' own tests)
 *   tracker.c      the tracker's state: slots, metrics, label pairs, series moves
 *   labels.c       label statistics: values noted, swept and counted
 *   observe.c      the tracker's observe passes over any source of items
 *   tracker_type.c Tracker: the tracker as a Python type
 *   pieces.c       drops by reason, shard buffers, a destination's result tuple
 *   take.c         take(): DestinationStage.take's loop
 *   hits.c, route.c route_hits(): Pipeline.route's pass over a request of cache hits
 *   module.c       the module and its initialisation
 *
 * Hot helpers are static inline here, so that splitting the source changes no generated loop; the
 * rest has external linkage inside the extension only (it is built with -fvisibility=hidden).
 */
#ifndef GPU_RELAY_CSTAGE_H
#define GPU_RELAY_CSTAGE_H

#include "bigarray.h"
#include "fastpath.h"
#include <stdint.h>
#include <string.h>

#define CS_INLINE static inline __attribute__((always_inline))

/* ---- the tables ------------------------------------------------------------------------------------ */

/* Both tables are open addressing over entries of one kind (key 0 marks an empty bucket; key 0
 * itself is kept aside in has_zero/zero), positions by multiply-shift of a keyed mix (any capacity
 * >= TBL_MIN_CAP), linear probing, growth x1.25 at 85% load, backward-shift deletion (no
 * tombstones), shrinking once a quarter full. Tables of 1 MiB and more are mmap'd (bigarray.h). */
typedef struct {
    void *e;       /* cap entries of the kind's size */
    size_t cap;    /* buckets */
    size_t n;      /* keys in buckets (key 0 not counted) */
    int has_zero;
    uint32_t zero; /* key 0's value (T12) or generation (T8) */
} Tbl;

typedef Tbl T12; /* uint64 id -> uint32 value, 12 bytes an entry (E12) */
typedef Tbl T8;  /* 48-bit value hash -> generation mod 2^16, 8 bytes an entry: key << 16 | generation */

typedef struct {
    uint32_t klo, khi; /* the key in two halves: 12 bytes an entry, 4-byte aligned */
    uint32_t v;
} E12;

#define TBL_MIN_CAP 8
/* The load limit, TBL_LOAD_NUM / TBL_LOAD_DEN, and the growth past it, cap + cap / TBL_GROW_DIV: the
 * load stays within [0.68, 0.85] (0.76 on average over sizes; x1.5 at 80% gave [0.53, 0.8], 0.66): 14%
 * fewer bytes a series and a label value. Linear probing at 0.85 still finds a key in 3.8 probes on
 * average (12-byte entries: one or two cache lines) and misses in 23; each growth rewrites the table,
 * about 4 moves an entry over the table's growth instead of 2. */
#define TBL_LOAD_NUM 17
#define TBL_LOAD_DEN 20
#define TBL_GROW_DIV 4

/* whether n keys fit in cap buckets */
static inline int tbl_fits(size_t n, size_t cap) { return n * TBL_LOAD_DEN <= cap * TBL_LOAD_NUM; }
#define VKEY_MASK ((UINT64_C(1) << 48) - 1)

/* an entry kind: its size, its key (0: empty) and the value remove_if's predicate is asked about */
typedef struct {
    size_t size;
    uint64_t (*key)(const void *e);
    uint32_t (*val)(const void *e);
} TblKind;

static inline uint64_t ekey(const E12 *e) { return (uint64_t)e->khi << 32 | e->klo; }
static inline uint64_t k12_key(const void *e) { return ekey(e); }
static inline uint32_t k12_val(const void *e) { return ((const E12 *)e)->v; }
static inline uint64_t vkey(uint64_t e) { return e >> 16; }
static inline uint16_t vgen16(uint64_t e) { return (uint16_t)e; }
static inline uint64_t k8_key(const void *e) { return vkey(*(const uint64_t *)e); }
static inline uint32_t k8_val(const void *e) { return vgen16(*(const uint64_t *)e); }

static const TblKind K12 = {sizeof(E12), k12_key, k12_val};
static const TblKind K8 = {sizeof(uint64_t), k8_key, k8_val};

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Keys a client can choose (series ids are BLAKE2b-64 of its label bytes), and mix64 is public and
 * invertible: without a secret, ids aimed at one bucket make one probe run of them all (quadratic).
 * A per-process key from os.urandom, drawn at import (module.c), mixed in before it. */
extern uint64_t t12_key;

static inline size_t tbl_pos(uint64_t k, size_t cap) {
    return (size_t)(((unsigned __int128)mix64(k ^ t12_key) * cap) >> 64);
}

CS_INLINE size_t tbl_next(size_t i, size_t cap) { return ++i == cap ? 0 : i; }

/* backward-shift deletion: with a hole at i, the entry at j (home h) stays unless moving it to i
 * keeps it reachable, i.e. unless h lies cyclically outside (i, j] */
CS_INLINE int tbl_stays(size_t i, size_t j, size_t h) { return (i <= j) ? (i < h && h <= j) : (i < h || h <= j); }

CS_INLINE void *tbl_at(void *e, size_t i, const TblKind *k) { return (char *)e + i * k->size; }

/* the bucket holding key `key` (not 0), or NULL */
CS_INLINE void *tbl_find(const Tbl *t, uint64_t key, const TblKind *k) {
    if (t->cap == 0)
        return NULL;
    size_t i = tbl_pos(key, t->cap);
    for (;;) {
        void *b = tbl_at(t->e, i, k);
        uint64_t bk = k->key(b);
        if (bk == key)
            return b;
        if (bk == 0)
            return NULL;
        i = tbl_next(i, t->cap);
    }
}

static inline size_t tbl_size(const Tbl *t) { return t->n + (size_t)t->has_zero; }
static inline E12 *t12_entries(const T12 *t) { return t->e; }
static inline uint64_t *t8_entries(const T8 *t) { return t->e; }
static inline size_t t12_home(const T12 *t, uint64_t k) { return tbl_pos(k, t->cap); }

static inline uint32_t *t12_find(T12 *t, uint64_t k) {
    if (k == 0)
        return t->has_zero ? &t->zero : NULL;
    E12 *b = tbl_find(t, k, &K12);
    return b == NULL ? NULL : &b->v;
}

/* the bucket holding key k (0 < k <= VKEY_MASK), or NULL */
static inline uint64_t *t8_find(T8 *t, uint64_t k) { return tbl_find(t, k, &K8); }

typedef int (*tbl_pred)(uint32_t v, void *ctx);
typedef void (*tbl_each)(uint32_t v, void *ctx);

void t12_free(T12 *t);
int t12_put(T12 *t, uint64_t k, uint32_t v);  /* insert or overwrite; -1 (MemoryError set) */
int t12_del(T12 *t, uint64_t k);              /* whether it was there */
/* Remove every entry whose value satisfies dead(v, ctx), calling gone(v, ctx) (when not NULL) for
 * each; how many, -1 on MemoryError. Mostly dead: the survivors go into a right-sized table. */
Py_ssize_t t12_remove_if(T12 *t, tbl_pred dead, tbl_each gone, void *ctx);
void t8_free(T8 *t);
int t8_add(T8 *t, uint64_t k, uint16_t g);    /* k (<= VKEY_MASK) known absent; -1 (MemoryError set) */
Py_ssize_t t8_remove_if(T8 *t, tbl_pred dead, void *ctx); /* dead(generation mod 2^16, ctx) */

/* ---- Python argument helpers ---------------------------------------------------------------------- */

static inline int get_u64(PyObject *o, uint64_t *out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "a series id must be an int, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* an id for a membership test: anything that is not a uint64 int is simply absent */
static inline int try_u64(PyObject *o, uint64_t *out) {
    if (!PyLong_Check(o))
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

/* an int64 int: 1; anything else (no exception left set): 0 */
static inline int get_i64(PyObject *o, int64_t *out) {
    if (!PyLong_Check(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if ((v == -1 && PyErr_Occurred()) || overflow) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

/* room for one more element in *arr (n of *cap used, `size` bytes each): doubled, from `first`, when
   full; -1 with MemoryError (*arr left as it was) */
static inline int room_for_one(void **arr, Py_ssize_t n, Py_ssize_t *cap, size_t size, Py_ssize_t first) {
    if (n < *cap)
        return 0;
    Py_ssize_t grown = *cap ? *cap * 2 : first;
    void *p = PyMem_RawRealloc(*arr, (size_t)grown * size);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *arr = p;
    *cap = grown;
    return 0;
}

/* list.append(item) for a new reference (stolen, also on failure); -1 with an exception */
static inline int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* ---- the tracker ----------------------------------------------------------------------------------- */

#define NONE32 UINT32_MAX
/* Label values' generations are kept mod 2^16 (T8); the tracker's vbase is a generation at or
 * below every value's, and every value's is below vbase + 2^16, so the full generation is
 * vbase + ((g16 - vbase) mod 2^16). note_labels sweeps the values out of the window first whenever a
 * generation reaches vbase + 2^16 (expire() not run for that long), which moves vbase up to the
 * cutoff: at most MAX_WSLOTS below the generation. relay/state/series_tracker.py does the same arithmetic. */
#define GEN_SPAN 65536
#define MAX_WSLOTS 32768

typedef struct {
    int64_t gen;   /* slot the series was last seen in */
    int64_t lgen;  /* slot its labels were last supplied in (-1: never) */
    uint32_t metric;
    uint32_t refs; /* series pointing here; 0: free (next free in lgen) */
} Slot;

typedef struct {
    uint32_t metric;
    uint8_t exists;
    PyObject *name; /* owned; NULL when free */
    T8 values;      /* 48-bit hash of a value -> generation last supplied (mod 2^16) */
} Pair;

typedef struct {
    PyObject *obj;   /* owned; NULL when free */
    PyObject *pairs; /* dict label name -> pair index (int); owned, or NULL */
    int64_t count;   /* active series */
} Metric;

typedef struct {
    PyObject_HEAD
    T12 series;
    int64_t wslots;
    int64_t vbase; /* label values' generations are in [vbase, vbase + GEN_SPAN) */
    Py_ssize_t max_values;
    Slot *slots;
    uint32_t nslots, cap_slots, free_slot;
    uint32_t *sidx; /* slot lookup: open addressing over slot indexes, NONE32 empty */
    uint32_t sidx_cap, sidx_n;
    Metric *metrics;
    uint32_t nmetrics, cap_metrics;
    PyObject *metric_ids; /* dict metric -> index */
    PyObject *free_metrics; /* list of free indexes */
    Pair *pairs;
    uint32_t npairs, cap_pairs;
    PyObject *free_pairs;
    PyObject *metric_name; /* "__name__" */
} TrackerObject;

extern PyTypeObject TrackerType;

/* the series' slot or NULL */
static inline Slot *series_slot(TrackerObject *t, uint64_t id) {
    uint32_t *p = t12_find(&t->series, id);
    return p == NULL ? NULL : &t->slots[*p];
}

static inline int tracker_contains(TrackerObject *t, uint64_t id, int64_t gen) {
    Slot *s = series_slot(t, id);
    return s != NULL && gen - s->gen <= t->wslots;
}

static inline int64_t *metric_counter(TrackerObject *t, uint32_t m) { return &t->metrics[m].count; }

static inline int64_t value_gen(const TrackerObject *t, uint16_t g) {
    return t->vbase + (int64_t)(uint16_t)(g - (uint16_t)t->vbase);
}

/* an expiry's context: tracker_expire's and values_sweep's predicates */
typedef struct {
    TrackerObject *t;
    int64_t cutoff;
} ExpireCtx;

/* tracker.c */
void slot_unref(TrackerObject *t, uint32_t x);
uint32_t metric_index(TrackerObject *t, PyObject *metric); /* created when new; NONE32 with an exception */
uint32_t pair_index(TrackerObject *t, uint32_t m, PyObject *name);
int series_move(TrackerObject *t, uint64_t id, uint32_t metric, int64_t gen, int64_t lgen);
int series_insert(TrackerObject *t, uint64_t id, uint32_t metric, int64_t gen, int64_t lgen);
void metric_decrement(TrackerObject *t, uint32_t m, int64_t n);
void series_forget(TrackerObject *t, uint64_t id);
Py_ssize_t tracker_expire(TrackerObject *t, int64_t cutoff); /* series removed, -1 with an exception */

/* labels.c */
int unpack_pair(PyObject *item, PyObject **name, PyObject **value);
int note_labels(TrackerObject *t, uint32_t m, PyObject *labels, int64_t gen);
int values_sweep(TrackerObject *t, int64_t cutoff);
PyObject *tracker_label_union(TrackerObject *t);

/* A source of (id, metric) items and their labels: observe_batch's items, observe_inputs' inputs,
 * take()'s kept series, route_hits' hits and kept series. */
typedef struct ItemSource ItemSource;
/* borrowed metric into *metric; -1 with an exception */
typedef int (*ItemGet)(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric);
typedef PyObject *(*ItemLabels)(ItemSource *src, Py_ssize_t i); /* new reference */
struct ItemSource {
    Py_ssize_t n;
    ItemGet get;
    ItemLabels labels;
    void *ctx;
    PyObject *seq;
    PyObject *labels_of;
    int ahead; /* get() only reads a C array: observe_source may call it ahead to prefetch */
};

/* observe.c: SeriesTracker.observe_batch over any source; a new list of the new items' indexes */
PyObject *observe_source(TrackerObject *t, ItemSource *src, int64_t gen);
PyObject *Tracker_observe(TrackerObject *t, PyObject *args);
PyObject *Tracker_observe_batch(TrackerObject *t, PyObject *args);
PyObject *Tracker_observe_inputs(TrackerObject *t, PyObject *args);
PyObject *Tracker_observe_many(TrackerObject *t, PyObject *args);

/* the module's functions */
PyObject *take(PyObject *module, PyObject *args);
PyObject *route_hits(PyObject *module, PyObject *args);
PyObject *hit_counts(PyObject *module, PyObject *unused);

extern PyTypeObject TableType;

#endif /* GPU_RELAY_CSTAGE_H */

/* relay.native._cstage: the relay's per-series stateful pass in C (issue 9).
 *
 * Two parts, each the twin of a pure-Python reference that stays the fallback:
 *
 * - Tracker: the state of relay.cardinality.SeriesTracker in compact C tables. Series: an open
 *   addressing table uint64 id -> uint32 slot index (12 bytes an entry, linear probing, growth x1.5
 *   at 80% load, backward-shift deletion: no tombstones); a slot is shared by every series of one
 *   (metric, generation, labels generation), reference counted. Label statistics: per (metric, label
 *   name) one table 48-bit value hash -> generation mod 2^16 (8 bytes an entry). Tables of 1 MiB and
 *   more are mmap'd. The Python wrapper (CSeriesTracker) reads the clock and passes the generation in.
 * - take(): DestinationStage.take's loop over one request's series for one destination: drops,
 *   sent series (owner and limiter checks), sharding into queue pieces. The rare branches
 *   (aggregated members, limiter admission of a series not yet contained, collisions, owner
 *   changes) call back into the Python stage so they stay the reference's. Any input of an unusual
 *   shape makes take() answer NotImplemented before any side effect: the caller runs the reference.
 */
#include "bigarray.h"
#include "fastpath.h"
#include <stdint.h>
#include <string.h>

/* ---- the table: uint64 key -> uint32 value ----------------------------------------------------- */

typedef struct {
    uint32_t klo, khi; /* the key in two halves: 12 bytes an entry, 4-byte aligned */
    uint32_t v;
} E12;

static inline uint64_t ekey(const E12 *e) { return (uint64_t)e->khi << 32 | e->klo; }
static inline void eset(E12 *e, uint64_t k) {
    e->klo = (uint32_t)k;
    e->khi = (uint32_t)(k >> 32);
}

typedef struct {
    E12 *e;
    size_t cap;    /* buckets (any size >= 8: positions by multiply-shift, not masking) */
    size_t n;      /* keys in buckets (key 0 is kept aside: 0 marks an empty bucket) */
    int has_zero;
    uint32_t zero_v;
} T12;

#define T12_MIN_CAP 8

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
 * A per-process key from os.urandom, drawn at import, mixed in before it. */
static uint64_t t12_key;

static inline size_t t12_pos(uint64_t k, size_t cap) {
    return (size_t)(((unsigned __int128)mix64(k ^ t12_key) * cap) >> 64);
}

static inline size_t t12_home(const T12 *t, uint64_t k) { return t12_pos(k, t->cap); }

static inline size_t t12_size(const T12 *t) { return t->n + (size_t)t->has_zero; }

static void t12_free(T12 *t) {
    arr_free(t->e, t->cap * sizeof(E12));
    t->e = NULL;
    t->cap = t->n = 0;
    t->has_zero = 0;
}

static inline uint32_t *t12_find(T12 *t, uint64_t k) {
    if (k == 0)
        return t->has_zero ? &t->zero_v : NULL;
    if (t->cap == 0)
        return NULL;
    size_t i = t12_home(t, k);
    for (;;) {
        E12 *b = &t->e[i];
        if (ekey(b) == k)
            return &b->v;
        if (ekey(b) == 0)
            return NULL;
        if (++i == t->cap)
            i = 0;
    }
}

/* place a key known absent (no growth check) */
static inline void t12_place(E12 *e, size_t cap, uint64_t k, uint32_t v) {
    size_t i = t12_pos(k, cap);
    while (ekey(&e[i]) != 0)
        if (++i == cap)
            i = 0;
    eset(&e[i], k);
    e[i].v = v;
}

static int t12_rebuild(T12 *t, size_t cap) {
    if (cap < T12_MIN_CAP)
        cap = T12_MIN_CAP;
    E12 *e = arr_calloc(cap, sizeof(E12));
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < t->cap; i++)
        if (ekey(&t->e[i]) != 0)
            t12_place(e, cap, ekey(&t->e[i]), t->e[i].v);
    arr_free(t->e, t->cap * sizeof(E12));
    t->e = e;
    t->cap = cap;
    return 0;
}

/* insert or overwrite; -1 (MemoryError set) when it cannot grow */
static int t12_put(T12 *t, uint64_t k, uint32_t v) {
    if (k == 0) {
        t->has_zero = 1;
        t->zero_v = v;
        return 0;
    }
    uint32_t *p = t12_find(t, k);
    if (p != NULL) {
        *p = v;
        return 0;
    }
    if ((t->n + 1) * 5 > t->cap * 4) {
        size_t cap = t->cap < T12_MIN_CAP ? T12_MIN_CAP : t->cap + t->cap / 2;
        if (t12_rebuild(t, cap) < 0)
            return -1;
    }
    t12_place(t->e, t->cap, k, v);
    t->n++;
    return 0;
}

static void t12_del_at(T12 *t, size_t i) {
    size_t j = i;
    for (;;) {
        if (++j == t->cap)
            j = 0;
        if (ekey(&t->e[j]) == 0)
            break;
        size_t h = t12_home(t, ekey(&t->e[j]));
        /* the entry at j may move to the hole at i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            t->e[i] = t->e[j];
            i = j;
        }
    }
    eset(&t->e[i], 0);
    t->n--;
}

static int t12_del(T12 *t, uint64_t k) {
    if (k == 0) {
        int had = t->has_zero;
        t->has_zero = 0;
        return had;
    }
    if (t->cap == 0)
        return 0;
    size_t i = t12_home(t, k);
    for (;;) {
        if (ekey(&t->e[i]) == k) {
            t12_del_at(t, i);
            return 1;
        }
        if (ekey(&t->e[i]) == 0)
            return 0;
        if (++i == t->cap)
            i = 0;
    }
}

/* give memory back once a table is a quarter full (after deletions) */
static int t12_maybe_shrink(T12 *t) {
    if (t->cap > T12_MIN_CAP && t->n * 4 < t->cap)
        return t12_rebuild(t, t->n * 2);
    return 0;
}

/* Remove every entry whose value satisfies dead(v, ctx); calls gone(v, ctx) for each. Returns how
 * many left. Mostly dead: the survivors are copied into a right-sized table. */
typedef int (*t12_pred)(uint32_t v, void *ctx);
typedef void (*t12_each)(uint32_t v, void *ctx);

static Py_ssize_t t12_remove_if(T12 *t, t12_pred dead, t12_each gone, void *ctx) {
    size_t n_dead = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (ekey(&t->e[i]) != 0 && dead(t->e[i].v, ctx))
            n_dead++;
    Py_ssize_t total = (Py_ssize_t)n_dead;
    if (t->has_zero && dead(t->zero_v, ctx)) {
        t->has_zero = 0;
        if (gone)
            gone(t->zero_v, ctx);
        total++;
    }
    if (n_dead == 0)
        return total;
    if (n_dead * 2 > t->n) {
        size_t left = t->n - n_dead;
        size_t cap = left * 2 < T12_MIN_CAP ? T12_MIN_CAP : left * 2;
        E12 *e = arr_calloc(cap, sizeof(E12));
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < t->cap; i++) {
            if (ekey(&t->e[i]) == 0)
                continue;
            if (dead(t->e[i].v, ctx)) {
                if (gone)
                    gone(t->e[i].v, ctx);
            } else {
                t12_place(e, cap, ekey(&t->e[i]), t->e[i].v);
            }
        }
        arr_free(t->e, t->cap * sizeof(E12));
        t->e = e;
        t->cap = cap;
        t->n = left;
        return total;
    }
    uint64_t *keys = PyMem_RawMalloc(n_dead * sizeof(uint64_t));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t m = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (ekey(&t->e[i]) != 0 && dead(t->e[i].v, ctx)) {
            keys[m++] = ekey(&t->e[i]);
            if (gone)
                gone(t->e[i].v, ctx);
        }
    for (size_t i = 0; i < m; i++)
        t12_del(t, keys[i]);
    PyMem_RawFree(keys);
    if (t12_maybe_shrink(t) < 0)
        return -1;
    return total;
}

/* ---- the value table: 48-bit key -> 16-bit generation, 8 bytes an entry ------------------------- */

/* An entry is key << 16 | generation mod 2^16 (the tracker rebuilds the full generation from its
 * base, below); key 0 is kept aside, as in T12 (0 marks an empty bucket). Same positions, probing,
 * growth, deletion and shrinking as T12. */
#define VKEY_MASK ((UINT64_C(1) << 48) - 1)

typedef struct {
    uint64_t *e;
    size_t cap, n;
    int has_zero;
    uint16_t zero_g;
} T8;

static inline uint64_t vkey(uint64_t e) { return e >> 16; }
static inline uint16_t vgen16(uint64_t e) { return (uint16_t)e; }
static inline size_t t8_size(const T8 *t) { return t->n + (size_t)t->has_zero; }

static void t8_free(T8 *t) {
    arr_free(t->e, t->cap * sizeof(uint64_t));
    t->e = NULL;
    t->cap = t->n = 0;
    t->has_zero = 0;
}

/* the bucket holding key k (0 < k <= VKEY_MASK), or NULL */
static inline uint64_t *t8_find(T8 *t, uint64_t k) {
    if (t->cap == 0)
        return NULL;
    size_t i = t12_pos(k, t->cap);
    for (;;) {
        uint64_t e = t->e[i];
        if (vkey(e) == k)
            return &t->e[i];
        if (e == 0)
            return NULL;
        if (++i == t->cap)
            i = 0;
    }
}

static inline void t8_place(uint64_t *e, size_t cap, uint64_t entry) {
    size_t i = t12_pos(vkey(entry), cap);
    while (e[i] != 0)
        if (++i == cap)
            i = 0;
    e[i] = entry;
}

static int t8_rebuild(T8 *t, size_t cap) {
    if (cap < T12_MIN_CAP)
        cap = T12_MIN_CAP;
    uint64_t *e = arr_calloc(cap, sizeof(uint64_t));
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i] != 0)
            t8_place(e, cap, t->e[i]);
    arr_free(t->e, t->cap * sizeof(uint64_t));
    t->e = e;
    t->cap = cap;
    return 0;
}

/* key k (<= VKEY_MASK), known absent, with generation g; -1 (MemoryError set) when it cannot grow */
static int t8_add(T8 *t, uint64_t k, uint16_t g) {
    if (k == 0) {
        t->has_zero = 1;
        t->zero_g = g;
        return 0;
    }
    if ((t->n + 1) * 5 > t->cap * 4) {
        size_t cap = t->cap < T12_MIN_CAP ? T12_MIN_CAP : t->cap + t->cap / 2;
        if (t8_rebuild(t, cap) < 0)
            return -1;
    }
    t8_place(t->e, t->cap, k << 16 | g);
    t->n++;
    return 0;
}

static void t8_del_at(T8 *t, size_t i) {
    size_t j = i;
    for (;;) {
        if (++j == t->cap)
            j = 0;
        if (t->e[j] == 0)
            break;
        size_t h = t12_pos(vkey(t->e[j]), t->cap);
        int stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            t->e[i] = t->e[j];
            i = j;
        }
    }
    t->e[i] = 0;
    t->n--;
}

static void t8_del(T8 *t, uint64_t k) {
    uint64_t *p = t8_find(t, k);
    if (p != NULL)
        t8_del_at(t, (size_t)(p - t->e));
}

/* Remove every entry whose generation satisfies dead(g, ctx); how many, -1 on MemoryError. Mostly
 * dead: the survivors are copied into a right-sized table (as t12_remove_if). */
typedef int (*t8_pred)(uint16_t g, void *ctx);

static Py_ssize_t t8_remove_if(T8 *t, t8_pred dead, void *ctx) {
    size_t n_dead = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i] != 0 && dead(vgen16(t->e[i]), ctx))
            n_dead++;
    Py_ssize_t total = (Py_ssize_t)n_dead;
    if (t->has_zero && dead(t->zero_g, ctx)) {
        t->has_zero = 0;
        total++;
    }
    if (n_dead == 0)
        return total;
    if (n_dead * 2 > t->n) {
        size_t left = t->n - n_dead;
        size_t cap = left * 2 < T12_MIN_CAP ? T12_MIN_CAP : left * 2;
        uint64_t *e = arr_calloc(cap, sizeof(uint64_t));
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < t->cap; i++)
            if (t->e[i] != 0 && !dead(vgen16(t->e[i]), ctx))
                t8_place(e, cap, t->e[i]);
        arr_free(t->e, t->cap * sizeof(uint64_t));
        t->e = e;
        t->cap = cap;
        t->n = left;
        return total;
    }
    uint64_t *keys = PyMem_RawMalloc(n_dead * sizeof(uint64_t));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t m = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i] != 0 && dead(vgen16(t->e[i]), ctx))
            keys[m++] = vkey(t->e[i]);
    for (size_t i = 0; i < m; i++)
        t8_del(t, keys[i]);
    PyMem_RawFree(keys);
    if (t->cap > T12_MIN_CAP && t->n * 4 < t->cap && t8_rebuild(t, t->n * 2) < 0)
        return -1;
    return total;
}

/* ---- Table: the table alone as a Python type (tests of the table itself) ------------------------ */

typedef struct {
    PyObject_HEAD
    T12 t;
} TableObject;

static int get_u64(PyObject *o, uint64_t *out) {
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
static int try_u64(PyObject *o, uint64_t *out) {
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

static void Table_dealloc(TableObject *self) {
    t12_free(&self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Table_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (!PyArg_ParseTuple(args, ":Table"))
        return NULL;
    TableObject *self = (TableObject *)type->tp_alloc(type, 0);
    return (PyObject *)self;
}

static PyObject *Table_put(TableObject *self, PyObject *args) {
    PyObject *k;
    unsigned int v;
    if (!PyArg_ParseTuple(args, "OI:put", &k, &v))
        return NULL;
    uint64_t key;
    if (get_u64(k, &key) < 0)
        return NULL;
    if (t12_put(&self->t, key, v) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Table_get(TableObject *self, PyObject *k) {
    uint64_t key;
    if (!try_u64(k, &key))
        Py_RETURN_NONE;
    uint32_t *p = t12_find(&self->t, key);
    if (p == NULL)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(*p);
}

static PyObject *Table_delete(TableObject *self, PyObject *k) {
    uint64_t key;
    if (!try_u64(k, &key))
        Py_RETURN_FALSE;
    return PyBool_FromLong(t12_del(&self->t, key));
}

static PyObject *Table_items(TableObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    T12 *t = &self->t;
    for (size_t i = 0; i <= t->cap; i++) {
        uint64_t k;
        uint32_t v;
        if (i == t->cap) {
            if (!t->has_zero)
                break;
            k = 0;
            v = t->zero_v;
        } else {
            if (ekey(&t->e[i]) == 0)
                continue;
            k = ekey(&t->e[i]);
            v = t->e[i].v;
        }
        PyObject *item = Py_BuildValue("(KI)", (unsigned long long)k, (unsigned int)v);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static int below_ctx(uint32_t v, void *ctx) { return v < *(uint32_t *)ctx; }

static PyObject *Table_remove_below(TableObject *self, PyObject *arg) {
    unsigned long lim = PyLong_AsUnsignedLong(arg);
    if (lim == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    uint32_t l = (uint32_t)lim;
    Py_ssize_t n = t12_remove_if(&self->t, below_ctx, NULL, &l);
    if (n < 0)
        return NULL;
    return PyLong_FromSsize_t(n);
}

static PyObject *Table_capacity(TableObject *self, PyObject *unused) {
    return PyLong_FromSize_t(self->t.cap);
}

static PyObject *Table_check(TableObject *self, PyObject *unused) {
    /* invariant: every key is reachable from its home without crossing an empty bucket */
    T12 *t = &self->t;
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (ekey(&t->e[i]) == 0)
            continue;
        n++;
        if (t12_find(t, ekey(&t->e[i])) != &t->e[i].v) {
            PyErr_SetString(PyExc_AssertionError, "a key is not found where it lies");
            return NULL;
        }
    }
    if (n != t->n) {
        PyErr_SetString(PyExc_AssertionError, "the count does not match the buckets");
        return NULL;
    }
    if (t->cap && t->n * 5 > t->cap * 4) {
        PyErr_SetString(PyExc_AssertionError, "over the load limit");
        return NULL;
    }
    Py_RETURN_NONE;
}

static Py_ssize_t Table_len(TableObject *self) { return (Py_ssize_t)t12_size(&self->t); }

static int Table_contains(TableObject *self, PyObject *k) {
    uint64_t key;
    if (!try_u64(k, &key))
        return 0;
    return t12_find(&self->t, key) != NULL;
}

static PyMethodDef Table_methods[] = {
    {"put", (PyCFunction)Table_put, METH_VARARGS, "put(key, value): insert or overwrite"},
    {"get", (PyCFunction)Table_get, METH_O, "get(key) -> value or None"},
    {"delete", (PyCFunction)Table_delete, METH_O, "delete(key) -> whether it was there"},
    {"items", (PyCFunction)Table_items, METH_NOARGS, "[(key, value)] in table order"},
    {"remove_below", (PyCFunction)Table_remove_below, METH_O, "remove entries with value < n; how many"},
    {"capacity", (PyCFunction)Table_capacity, METH_NOARGS, "buckets allocated"},
    {"check", (PyCFunction)Table_check, METH_NOARGS, "assert the probing invariants"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Table_as_sequence = {
    .sq_length = (lenfunc)Table_len,
    .sq_contains = (objobjproc)Table_contains,
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "relay.native._cstage.Table",
    .tp_basicsize = sizeof(TableObject),
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "uint64 -> uint32 open addressing table (the tracker's building block)",
    .tp_methods = Table_methods,
    .tp_as_sequence = &Table_as_sequence,
    .tp_new = Table_new,
};

/* ---- the tracker -------------------------------------------------------------------------------- */

#define NONE32 UINT32_MAX
/* Label values' generations are kept mod 2^16 (T8); the tracker's vbase is a generation at or
 * below every value's, and every value's is below vbase + 2^16, so the full generation is
 * vbase + ((g16 - vbase) mod 2^16). note_labels sweeps the values out of the window first whenever a
 * generation reaches vbase + 2^16 (expire() not run for that long), which moves vbase up to the
 * cutoff: at most MAX_WSLOTS below the generation. relay.cardinality does the same arithmetic. */
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

static PyTypeObject TrackerType;

static inline size_t slot_hash(uint32_t metric, int64_t gen, int64_t lgen, uint32_t cap) {
    uint64_t h = mix64((uint64_t)gen * 0x9E3779B97F4A7C15ULL ^ (uint64_t)lgen ^ ((uint64_t)metric << 32));
    return (size_t)(h & (cap - 1));
}

static int sidx_grow(TrackerObject *t) {
    uint32_t cap = t->sidx_cap ? t->sidx_cap * 2 : 64;
    uint32_t *s = PyMem_RawMalloc((size_t)cap * sizeof(uint32_t));
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(s, 0xff, (size_t)cap * sizeof(uint32_t));
    for (uint32_t i = 0; i < t->sidx_cap; i++) {
        uint32_t x = t->sidx[i];
        if (x == NONE32)
            continue;
        Slot *sl = &t->slots[x];
        size_t j = slot_hash(sl->metric, sl->gen, sl->lgen, cap);
        while (s[j] != NONE32)
            j = (j + 1) & (cap - 1);
        s[j] = x;
    }
    PyMem_RawFree(t->sidx);
    t->sidx = s;
    t->sidx_cap = cap;
    return 0;
}

static void sidx_remove(TrackerObject *t, uint32_t x) {
    Slot *sl = &t->slots[x];
    uint32_t mask = t->sidx_cap - 1;
    size_t i = slot_hash(sl->metric, sl->gen, sl->lgen, t->sidx_cap);
    while (t->sidx[i] != x)
        i = (i + 1) & mask;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint32_t y = t->sidx[j];
        if (y == NONE32)
            break;
        Slot *o = &t->slots[y];
        size_t h = slot_hash(o->metric, o->gen, o->lgen, t->sidx_cap);
        int stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            t->sidx[i] = y;
            i = j;
        }
    }
    t->sidx[i] = NONE32;
    t->sidx_n--;
}

/* the slot (metric, gen, lgen) with one more reference; NONE32 on MemoryError */
static uint32_t slot_ref(TrackerObject *t, uint32_t metric, int64_t gen, int64_t lgen) {
    if (t->sidx_cap) {
        size_t i = slot_hash(metric, gen, lgen, t->sidx_cap);
        for (;;) {
            uint32_t x = t->sidx[i];
            if (x == NONE32)
                break;
            Slot *s = &t->slots[x];
            if (s->gen == gen && s->lgen == lgen && s->metric == metric) {
                s->refs++;
                return x;
            }
            i = (i + 1) & (t->sidx_cap - 1);
        }
    }
    if ((t->sidx_n + 1) * 2 > t->sidx_cap && sidx_grow(t) < 0)
        return NONE32;
    uint32_t x;
    if (t->free_slot != NONE32) {
        x = t->free_slot;
        t->free_slot = (uint32_t)t->slots[x].lgen;
    } else {
        if (t->nslots == t->cap_slots) {
            uint32_t cap = t->cap_slots ? t->cap_slots * 2 : 64;
            Slot *s = PyMem_RawRealloc(t->slots, (size_t)cap * sizeof(Slot));
            if (s == NULL) {
                PyErr_NoMemory();
                return NONE32;
            }
            t->slots = s;
            t->cap_slots = cap;
        }
        x = t->nslots++;
    }
    Slot *s = &t->slots[x];
    s->gen = gen;
    s->lgen = lgen;
    s->metric = metric;
    s->refs = 1;
    size_t i = slot_hash(metric, gen, lgen, t->sidx_cap);
    while (t->sidx[i] != NONE32)
        i = (i + 1) & (t->sidx_cap - 1);
    t->sidx[i] = x;
    t->sidx_n++;
    return x;
}

static void slot_unref(TrackerObject *t, uint32_t x) {
    Slot *s = &t->slots[x];
    if (--s->refs == 0) {
        sidx_remove(t, x);
        s->lgen = (int64_t)t->free_slot;
        s->metric = NONE32;
        t->free_slot = x;
    }
}

/* The index of `key` in `ids` (a dict key -> int index into the array *arr); NONE32 with an
 * exception set. A key not there gets an index from `free` (a list of free indexes) or a new one at
 * the end of *arr (`size` bytes an element, capacity *cap, grown by doubling from `first_cap`); then
 * *created is 1 and the caller fills the element in. */
static uint32_t pool_index(PyObject *ids, PyObject *key, PyObject *free, void **arr, uint32_t *n,
                           uint32_t *cap, size_t size, uint32_t first_cap, int *created) {
    *created = 0;
    PyObject *ix = PyDict_GetItemWithError(ids, key);
    if (ix != NULL)
        return (uint32_t)PyLong_AsUnsignedLong(ix);
    if (PyErr_Occurred())
        return NONE32;
    uint32_t x;
    Py_ssize_t nfree = PyList_GET_SIZE(free);
    if (nfree) {
        x = (uint32_t)PyLong_AsUnsignedLong(PyList_GET_ITEM(free, nfree - 1));
    } else {
        if (*n == *cap) {
            uint32_t grown = *cap ? *cap * 2 : first_cap;
            void *m = PyMem_RawRealloc(*arr, (size_t)grown * size);
            if (m == NULL) {
                PyErr_NoMemory();
                return NONE32;
            }
            *arr = m;
            *cap = grown;
        }
        x = *n;
    }
    PyObject *value = PyLong_FromUnsignedLong(x);
    if (value == NULL)
        return NONE32;
    int rc = PyDict_SetItem(ids, key, value);
    Py_DECREF(value);
    if (rc < 0)
        return NONE32;
    if (nfree)
        PyList_SetSlice(free, nfree - 1, nfree, NULL);
    else
        (*n)++;
    *created = 1;
    return x;
}

/* the metric's index, created when new; NONE32 with an exception set */
static uint32_t metric_index(TrackerObject *t, PyObject *metric) {
    int created;
    void *arr = t->metrics;
    uint32_t x = pool_index(t->metric_ids, metric, t->free_metrics, &arr, &t->nmetrics, &t->cap_metrics,
                            sizeof(Metric), 16, &created);
    t->metrics = arr;
    if (x == NONE32 || !created)
        return x;
    Py_INCREF(metric);
    t->metrics[x].obj = metric;
    t->metrics[x].pairs = NULL;
    t->metrics[x].count = 0;
    return x;
}

static inline int64_t *metric_counter(TrackerObject *t, uint32_t m) { return &t->metrics[m].count; }

/* the pair (metric, name), created when new (and marked as existing); NONE32 with an exception */
static uint32_t pair_index(TrackerObject *t, uint32_t m, PyObject *name) {
    Metric *me = &t->metrics[m];
    if (me->pairs == NULL) {
        me->pairs = PyDict_New();
        if (me->pairs == NULL)
            return NONE32;
    }
    int created;
    void *arr = t->pairs;
    uint32_t x = pool_index(me->pairs, name, t->free_pairs, &arr, &t->npairs, &t->cap_pairs, sizeof(Pair), 64,
                            &created);
    t->pairs = arr;
    if (x == NONE32 || !created)
        return x;
    Pair *p = &t->pairs[x];
    Py_INCREF(name);
    p->name = name;
    p->metric = m;
    p->exists = 1;
    memset(&p->values, 0, sizeof(T8));
    return x;
}

static inline int64_t value_gen(const TrackerObject *t, uint16_t g) {
    return t->vbase + (int64_t)(uint16_t)(g - (uint16_t)t->vbase);
}

static int values_sweep(TrackerObject *t, int64_t cutoff);

static int unpack_pair(PyObject *item, PyObject **name, PyObject **value) {
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
        *name = PyTuple_GET_ITEM(item, 0);
        *value = PyTuple_GET_ITEM(item, 1);
        return 0;
    }
    PyObject *seq = PySequence_Fast(item, "cannot unpack a label");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != 2) {
        Py_DECREF(seq);
        if (n > 2)
            PyErr_Format(PyExc_ValueError, "too many values to unpack (expected 2)");
        else
            PyErr_Format(PyExc_ValueError, "not enough values to unpack (expected 2, got %zd)", n);
        return -1;
    }
    *name = PySequence_Fast_GET_ITEM(seq, 0);
    *value = PySequence_Fast_GET_ITEM(seq, 1);
    Py_DECREF(seq); /* a list or tuple keeps its items alive: the caller holds `item` */
    return 0;
}

/* SeriesTracker._note_labels; steals nothing */
static int note_labels(TrackerObject *t, uint32_t m, PyObject *labels, int64_t gen) {
    if (gen - t->vbase >= GEN_SPAN && values_sweep(t, gen - t->wslots) < 0)
        return -1;
    PyObject *seq = PySequence_Fast(labels, "labels must be iterable");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint16_t g = (uint16_t)gen;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *value;
        if (unpack_pair(PySequence_Fast_GET_ITEM(seq, i), &name, &value) < 0)
            goto fail;
        int is_name = PyObject_RichCompareBool(name, t->metric_name, Py_EQ);
        if (is_name < 0)
            goto fail;
        if (is_name)
            continue;
        uint32_t p = pair_index(t, m, name);
        if (p == NONE32)
            goto fail;
        Py_hash_t h = PyObject_Hash(value);
        if (h == -1 && PyErr_Occurred())
            goto fail;
        uint64_t key = (uint64_t)h & VKEY_MASK;
        T8 *vals = &t->pairs[p].values;
        if (key == 0 && vals->has_zero) {
            vals->zero_g = g;
            continue;
        }
        uint64_t *slot = key ? t8_find(vals, key) : NULL;
        if (slot != NULL)
            *slot = key << 16 | g;
        else if ((Py_ssize_t)t8_size(vals) < t->max_values && t8_add(vals, key, g) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static void Tracker_dealloc(TrackerObject *t) {
    t12_free(&t->series);
    PyMem_RawFree(t->slots);
    PyMem_RawFree(t->sidx);
    for (uint32_t i = 0; i < t->nmetrics; i++) {
        Py_XDECREF(t->metrics[i].obj);
        Py_XDECREF(t->metrics[i].pairs);
    }
    PyMem_RawFree(t->metrics);
    for (uint32_t i = 0; i < t->npairs; i++) {
        Py_XDECREF(t->pairs[i].name);
        t8_free(&t->pairs[i].values);
    }
    PyMem_RawFree(t->pairs);
    Py_XDECREF(t->metric_ids);
    Py_XDECREF(t->free_metrics);
    Py_XDECREF(t->free_pairs);
    Py_XDECREF(t->metric_name);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *Tracker_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"wslots", "max_values", NULL};
    long long wslots;
    Py_ssize_t max_values;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Ln:Tracker", kwlist, &wslots, &max_values))
        return NULL;
    if (wslots <= 0 || wslots > MAX_WSLOTS) {
        PyErr_Format(PyExc_ValueError, "wslots must be 1 to %d", MAX_WSLOTS);
        return NULL;
    }
    TrackerObject *t = (TrackerObject *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->wslots = wslots;
    t->max_values = max_values;
    t->free_slot = NONE32;
    t->metric_ids = PyDict_New();
    t->free_metrics = PyList_New(0);
    t->free_pairs = PyList_New(0);
    t->metric_name = PyUnicode_InternFromString("__name__");
    if (!t->metric_ids || !t->free_metrics || !t->free_pairs || !t->metric_name) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

/* the series' slot or NULL */
static inline Slot *series_slot(TrackerObject *t, uint64_t id) {
    uint32_t *p = t12_find(&t->series, id);
    return p == NULL ? NULL : &t->slots[*p];
}

/* re-point series `id` (present) to (metric, gen, lgen) */
static int series_move(TrackerObject *t, uint64_t id, uint32_t metric, int64_t gen, int64_t lgen) {
    uint32_t *p = t12_find(&t->series, id);
    uint32_t old = *p;
    uint32_t x = slot_ref(t, metric, gen, lgen);
    if (x == NONE32)
        return -1;
    p = t12_find(&t->series, id); /* (slot_ref does not touch the series table: p stays valid) */
    *p = x;
    slot_unref(t, old);
    return 0;
}

static int series_insert(TrackerObject *t, uint64_t id, uint32_t metric, int64_t gen, int64_t lgen) {
    uint32_t *p = t12_find(&t->series, id);
    uint32_t x = slot_ref(t, metric, gen, lgen);
    if (x == NONE32)
        return -1;
    if (p != NULL) { /* labels_of re-entered and inserted it: overwrite, as a dict store would */
        uint32_t old = *p;
        *p = x;
        slot_unref(t, old);
        return 0;
    }
    if (t12_put(&t->series, id, x) < 0) {
        slot_unref(t, x);
        return -1;
    }
    return 0;
}

static void metric_decrement(TrackerObject *t, uint32_t m, int64_t n) {
    int64_t *c = metric_counter(t, m);
    *c -= n;
    if (*c < 0)
        *c = 0;
}

static void series_forget(TrackerObject *t, uint64_t id) {
    uint32_t *p = t12_find(&t->series, id);
    uint32_t x = *p;
    uint32_t m = t->slots[x].metric;
    t12_del(&t->series, id);
    metric_decrement(t, m, 1);
    slot_unref(t, x);
}

/* A source of (id, metric) items and their labels: observe_batch's items, observe_inputs' inputs,
 * or take()'s kept series. */
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

/* How far ahead observe_source prefetches a series' home bucket: a request's series are looked up
 * in a table of about a megabyte per 60,000 series, one cache miss each, and the loop's calls keep
 * the core from overlapping them by itself. */
#define OBSERVE_AHEAD 12

static int items_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric) {
    PyObject *item = PySequence_Fast_GET_ITEM(src->seq, i);
    PyObject *sid, *m;
    if (unpack_pair(item, &sid, &m) < 0)
        return -1;
    if (get_u64(sid, id) < 0)
        return -1;
    *metric = m;
    return 0;
}

static PyObject *items_labels(ItemSource *src, Py_ssize_t i) {
    PyObject *ix = PyLong_FromSsize_t(i);
    if (ix == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(src->labels_of, ix);
    Py_DECREF(ix);
    return r;
}

/* inputs[i][0] is the input decision (key, in_id, metric) */
static int inputs_decision(PyObject *seq, Py_ssize_t i, PyObject **d) {
    PyObject *entry = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 1 || !PyTuple_Check(PyTuple_GET_ITEM(entry, 0))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(entry, 0)) < 3) {
        PyErr_SetString(PyExc_TypeError, "an input entry is not ((key, id, metric), rest, n, ts)");
        return -1;
    }
    *d = PyTuple_GET_ITEM(entry, 0);
    return 0;
}

static int inputs_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric) {
    PyObject *d;
    if (inputs_decision(src->seq, i, &d) < 0)
        return -1;
    if (get_u64(PyTuple_GET_ITEM(d, 1), id) < 0)
        return -1;
    *metric = PyTuple_GET_ITEM(d, 2);
    return 0;
}

static PyObject *inputs_labels(ItemSource *src, Py_ssize_t i) {
    PyObject *d;
    if (inputs_decision(src->seq, i, &d) < 0)
        return NULL;
    return PyObject_CallOneArg(src->labels_of, PyTuple_GET_ITEM(d, 0));
}

/* SeriesTracker.observe_batch over any source; a new list of the new items' indexes */
static PyObject *observe_source(TrackerObject *t, ItemSource *src, int64_t gen) {
    int64_t wslots = t->wslots, due = wslots / 2;
    PyObject *new = PyList_New(0);
    if (new == NULL)
        return NULL;
    if (src->ahead && t->series.cap)
        for (Py_ssize_t i = 0; i < src->n && i < OBSERVE_AHEAD; i++) {
            uint64_t id;
            PyObject *metric;
            src->get(src, i, &id, &metric);
            __builtin_prefetch(&t->series.e[t12_home(&t->series, id)]);
        }
    for (Py_ssize_t i = 0; i < src->n; i++) {
        uint64_t id;
        PyObject *metric;
        if (src->ahead && t->series.cap && i + OBSERVE_AHEAD < src->n) {
            src->get(src, i + OBSERVE_AHEAD, &id, &metric);
            __builtin_prefetch(&t->series.e[t12_home(&t->series, id)]);
        }
        if (src->get(src, i, &id, &metric) < 0)
            goto fail;
        uint32_t *p = t12_find(&t->series, id);
        if (p != NULL) {
            Slot *s = &t->slots[*p];
            if (s->gen == gen)
                continue; /* the common case: already seen in this slot */
            if (gen - s->gen <= wslots) {
                uint32_t m = s->metric;
                if (s->lgen >= 0 && gen - s->lgen < due) {
                    if (series_move(t, id, m, gen, s->lgen) < 0)
                        goto fail;
                } else {
                    PyObject *labels = src->labels(src, i);
                    if (labels == NULL)
                        goto fail;
                    int rc = note_labels(t, m, labels, gen);
                    Py_DECREF(labels);
                    if (rc < 0)
                        goto fail;
                    /* (labels_of may have re-entered: look the series up again) */
                    if (t12_find(&t->series, id) == NULL) {
                        if (series_insert(t, id, m, gen, gen) < 0)
                            goto fail;
                    } else if (series_move(t, id, m, gen, gen) < 0) {
                        goto fail;
                    }
                }
                continue;
            }
            series_forget(t, id); /* out of the window but not swept yet: new again */
        }
        PyObject *ix = PyLong_FromSsize_t(i);
        if (ix == NULL || PyList_Append(new, ix) < 0) {
            Py_XDECREF(ix);
            goto fail;
        }
        Py_DECREF(ix);
        uint32_t m = metric_index(t, metric);
        if (m == NONE32)
            goto fail;
        (*metric_counter(t, m))++;
        PyObject *labels = src->labels(src, i);
        if (labels == NULL)
            goto fail;
        int rc = note_labels(t, m, labels, gen);
        Py_DECREF(labels);
        if (rc < 0 || series_insert(t, id, m, gen, gen) < 0)
            goto fail;
    }
    return new;
fail:
    Py_DECREF(new);
    return NULL;
}

/* observe_batch / observe_inputs: (sequence, labels_of, gen) read by `get`/`labels` */
static PyObject *observe_sequence(TrackerObject *t, PyObject *args, const char *format, const char *what,
                                  ItemGet get, ItemLabels labels) {
    PyObject *items, *labels_of;
    long long gen;
    if (!PyArg_ParseTuple(args, format, &items, &labels_of, &gen))
        return NULL;
    PyObject *seq = PySequence_Fast(items, what);
    if (seq == NULL)
        return NULL;
    ItemSource src = {PySequence_Fast_GET_SIZE(seq), get, labels, NULL, seq, labels_of, 0};
    PyObject *r = observe_source(t, &src, gen);
    Py_DECREF(seq);
    return r;
}

static PyObject *Tracker_observe_batch(TrackerObject *t, PyObject *args) {
    return observe_sequence(t, args, "OOL:observe_batch", "items must be a sequence", items_get, items_labels);
}

static PyObject *Tracker_observe_inputs(TrackerObject *t, PyObject *args) {
    return observe_sequence(t, args, "OOL:observe_inputs", "inputs must be a sequence", inputs_get, inputs_labels);
}

/* SeriesTracker.observe: True if the series was not active */
static int observe_one(TrackerObject *t, uint64_t id, PyObject *metric, PyObject *labels, int64_t gen) {
    uint32_t *p = t12_find(&t->series, id);
    if (p != NULL) {
        Slot *s = &t->slots[*p];
        if (gen - s->gen <= t->wslots) {
            uint32_t m = s->metric;
            if (labels == Py_None) {
                if (s->gen != gen && series_move(t, id, m, gen, s->lgen) < 0)
                    return -1;
                return 0;
            }
            if (note_labels(t, m, labels, gen) < 0)
                return -1;
            if (t12_find(&t->series, id) == NULL)
                return series_insert(t, id, m, gen, gen) < 0 ? -1 : 0;
            return series_move(t, id, m, gen, gen) < 0 ? -1 : 0;
        }
        series_forget(t, id);
    }
    uint32_t m = metric_index(t, metric);
    if (m == NONE32)
        return -1;
    (*metric_counter(t, m))++;
    int64_t lgen = -1;
    if (labels != Py_None) {
        if (note_labels(t, m, labels, gen) < 0)
            return -1;
        lgen = gen;
    }
    if (series_insert(t, id, m, gen, lgen) < 0)
        return -1;
    return 1;
}

static PyObject *Tracker_observe(TrackerObject *t, PyObject *args) {
    PyObject *sid, *metric, *labels;
    long long gen;
    if (!PyArg_ParseTuple(args, "OOOL:observe", &sid, &metric, &labels, &gen))
        return NULL;
    uint64_t id;
    if (get_u64(sid, &id) < 0)
        return NULL;
    int r = observe_one(t, id, metric, labels, gen);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *Tracker_observe_many(TrackerObject *t, PyObject *args) {
    PyObject *items;
    long long gen;
    if (!PyArg_ParseTuple(args, "OL:observe_many", &items, &gen))
        return NULL;
    PyObject *seq = PySequence_Fast(items, "items must be a sequence");
    if (seq == NULL)
        return NULL;
    ItemSource src = {PySequence_Fast_GET_SIZE(seq), items_get, items_labels, NULL, seq, NULL, 0};
    for (Py_ssize_t i = 0; i < src.n; i++) {
        uint64_t id;
        PyObject *metric;
        if (items_get(&src, i, &id, &metric) < 0)
            goto fail;
        Slot *s = series_slot(t, id);
        if (s != NULL && s->gen == gen)
            continue;
        if (s != NULL && gen - s->gen <= t->wslots) {
            if (series_move(t, id, s->metric, gen, s->lgen) < 0)
                goto fail;
        } else if (observe_one(t, id, metric, Py_None, gen) < 0) {
            goto fail;
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *Tracker_lookup(TrackerObject *t, PyObject *sid) {
    uint64_t id;
    if (!try_u64(sid, &id))
        Py_RETURN_NONE;
    Slot *s = series_slot(t, id);
    if (s == NULL)
        Py_RETURN_NONE;
    return Py_BuildValue("(OLL)", t->metrics[s->metric].obj, (long long)s->gen, (long long)s->lgen);
}

static inline int tracker_contains(TrackerObject *t, uint64_t id, int64_t gen) {
    Slot *s = series_slot(t, id);
    return s != NULL && gen - s->gen <= t->wslots;
}

static PyObject *Tracker_contains(TrackerObject *t, PyObject *args) {
    PyObject *sid;
    long long gen;
    if (!PyArg_ParseTuple(args, "OL:contains", &sid, &gen))
        return NULL;
    uint64_t id;
    if (!try_u64(sid, &id))
        Py_RETURN_FALSE;
    return PyBool_FromLong(tracker_contains(t, id, gen));
}

static PyObject *Tracker_has(TrackerObject *t, PyObject *sid) {
    uint64_t id;
    if (!try_u64(sid, &id))
        Py_RETURN_FALSE;
    return PyBool_FromLong(t12_find(&t->series, id) != NULL);
}

static Py_ssize_t Tracker_len(TrackerObject *t) { return (Py_ssize_t)t12_size(&t->series); }

static PyObject *Tracker_metric_count(TrackerObject *t, PyObject *metric) {
    PyObject *ix = PyDict_GetItemWithError(t->metric_ids, metric);
    if (ix == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyLong_FromLong(0);
    }
    return PyLong_FromLongLong(t->metrics[PyLong_AsUnsignedLong(ix)].count);
}

static PyObject *Tracker_metric_counts(TrackerObject *t, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (uint32_t i = 0; i < t->nmetrics; i++) {
        Metric *m = &t->metrics[i];
        if (m->obj == NULL || m->count <= 0)
            continue;
        PyObject *item = Py_BuildValue("(OL)", m->obj, (long long)m->count);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *Tracker_pairs(TrackerObject *t, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (uint32_t i = 0; i < t->npairs; i++) {
        Pair *p = &t->pairs[i];
        if (p->name == NULL || !p->exists)
            continue;
        PyObject *item = Py_BuildValue("(OOn)", t->metrics[p->metric].obj, p->name,
                                       (Py_ssize_t)t8_size(&p->values));
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* label name -> distinct values over every metric (names with none left out) */
static PyObject *Tracker_label_union(TrackerObject *t, PyObject *unused) {
    PyObject *groups = PyDict_New(); /* name -> list of pair indexes */
    PyObject *out = PyDict_New();
    uint64_t *buf = NULL;
    if (groups == NULL || out == NULL)
        goto fail;
    for (uint32_t i = 0; i < t->npairs; i++) {
        Pair *p = &t->pairs[i];
        if (p->name == NULL || !p->exists)
            continue;
        PyObject *lst = PyDict_GetItemWithError(groups, p->name);
        if (lst == NULL) {
            if (PyErr_Occurred())
                goto fail;
            lst = PyList_New(0);
            if (lst == NULL || PyDict_SetItem(groups, p->name, lst) < 0) {
                Py_XDECREF(lst);
                goto fail;
            }
            Py_DECREF(lst);
        }
        PyObject *ix = PyLong_FromUnsignedLong(i);
        if (ix == NULL || PyList_Append(lst, ix) < 0) {
            Py_XDECREF(ix);
            goto fail;
        }
        Py_DECREF(ix);
    }
    PyObject *name, *lst;
    Py_ssize_t pos = 0;
    while (PyDict_Next(groups, &pos, &name, &lst)) {
        size_t total = 0;
        Py_ssize_t k = PyList_GET_SIZE(lst);
        for (Py_ssize_t j = 0; j < k; j++)
            total += t8_size(&t->pairs[PyLong_AsUnsignedLong(PyList_GET_ITEM(lst, j))].values);
        size_t distinct = total;
        if (k > 1 && total > 0) {
            buf = PyMem_RawMalloc(total * sizeof(uint64_t));
            if (buf == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            size_t m = 0;
            for (Py_ssize_t j = 0; j < k; j++) {
                T8 *v = &t->pairs[PyLong_AsUnsignedLong(PyList_GET_ITEM(lst, j))].values;
                for (size_t b = 0; b < v->cap; b++)
                    if (v->e[b] != 0)
                        buf[m++] = vkey(v->e[b]);
                if (v->has_zero)
                    buf[m++] = 0;
            }
            qsort(buf, m, sizeof(uint64_t), cmp_u64);
            distinct = m ? 1 : 0;
            for (size_t b = 1; b < m; b++)
                distinct += buf[b] != buf[b - 1];
            PyMem_RawFree(buf);
            buf = NULL;
        }
        if (distinct == 0)
            continue;
        PyObject *c = PyLong_FromSize_t(distinct);
        if (c == NULL || PyDict_SetItem(out, name, c) < 0) {
            Py_XDECREF(c);
            goto fail;
        }
        Py_DECREF(c);
    }
    Py_DECREF(groups);
    return out;
fail:
    PyMem_RawFree(buf);
    Py_XDECREF(groups);
    Py_XDECREF(out);
    return NULL;
}

typedef struct {
    TrackerObject *t;
    int64_t cutoff;
} ExpireCtx;

static int value_dead(uint16_t g, void *ctx) {
    ExpireCtx *c = ctx;
    return value_gen(c->t, g) < c->cutoff;
}

static int series_dead(uint32_t v, void *ctx) {
    ExpireCtx *c = ctx;
    return c->t->slots[v].gen < c->cutoff;
}

static void series_gone(uint32_t v, void *ctx) {
    ExpireCtx *c = ctx;
    Slot *s = &c->t->slots[v];
    metric_decrement(c->t, s->metric, 1);
    /* (a slot freed here is not read again: no other series points to it) */
    slot_unref(c->t, v);
}

static int free_pair(TrackerObject *t, uint32_t i) {
    Pair *p = &t->pairs[i];
    PyObject *d = t->metrics[p->metric].pairs;
    if (d != NULL && PyDict_DelItem(d, p->name) < 0)
        return -1;
    Py_CLEAR(p->name);
    t8_free(&p->values);
    p->exists = 0;
    PyObject *ix = PyLong_FromUnsignedLong(i);
    if (ix == NULL)
        return -1;
    int rc = PyList_Append(t->free_pairs, ix);
    Py_DECREF(ix);
    return rc;
}

/* label values last supplied before cutoff leave, then pairs left without any (SeriesTracker.
 * _expire_values); vbase moves up to the cutoff */
static int values_sweep(TrackerObject *t, int64_t cutoff) {
    ExpireCtx ctx = {t, cutoff};
    for (uint32_t i = 0; i < t->npairs; i++) {
        Pair *p = &t->pairs[i];
        if (p->name == NULL)
            continue;
        if (t8_remove_if(&p->values, value_dead, &ctx) < 0)
            return -1;
        if (t8_size(&p->values) == 0 && free_pair(t, i) < 0)
            return -1;
    }
    if (cutoff > t->vbase)
        t->vbase = cutoff;
    return 0;
}

/* SeriesTracker.expire with the cutoff generation; how many series left */
static PyObject *Tracker_expire(TrackerObject *t, PyObject *arg) {
    long long cutoff = PyLong_AsLongLong(arg);
    if (cutoff == -1 && PyErr_Occurred())
        return NULL;
    ExpireCtx ctx = {t, cutoff};
    /* label values first (as the reference), then pairs left without any */
    if (values_sweep(t, cutoff) < 0)
        return NULL;
    Py_ssize_t n_dead = t12_remove_if(&t->series, series_dead, series_gone, &ctx);
    if (n_dead < 0)
        return NULL;
    /* metrics no slot, pair or series uses any more */
    uint8_t *used = PyMem_RawCalloc(t->nmetrics ? t->nmetrics : 1, 1);
    if (used == NULL)
        return PyErr_NoMemory();
    for (uint32_t x = 0; x < t->nslots; x++)
        if (t->slots[x].refs > 0)
            used[t->slots[x].metric] = 1;
    for (uint32_t i = 0; i < t->npairs; i++)
        if (t->pairs[i].name != NULL)
            used[t->pairs[i].metric] = 1;
    for (uint32_t i = 0; i < t->nmetrics; i++) {
        Metric *m = &t->metrics[i];
        if (m->obj == NULL || used[i] || m->count > 0)
            continue;
        if (PyDict_DelItem(t->metric_ids, m->obj) < 0) {
            PyMem_RawFree(used);
            return NULL;
        }
        Py_CLEAR(m->obj);
        Py_CLEAR(m->pairs);
        PyObject *ix = PyLong_FromUnsignedLong(i);
        if (ix == NULL || PyList_Append(t->free_metrics, ix) < 0) {
            Py_XDECREF(ix);
            PyMem_RawFree(used);
            return NULL;
        }
        Py_DECREF(ix);
    }
    PyMem_RawFree(used);
    return PyLong_FromSsize_t(n_dead);
}

static PyObject *Tracker_memory(TrackerObject *t, PyObject *unused) {
    size_t b = t->series.cap * sizeof(E12) + (size_t)t->cap_slots * sizeof(Slot)
               + (size_t)t->sidx_cap * sizeof(uint32_t) + (size_t)t->cap_metrics * sizeof(Metric)
               + (size_t)t->cap_pairs * sizeof(Pair);
    for (uint32_t i = 0; i < t->npairs; i++)
        b += t->pairs[i].values.cap * sizeof(uint64_t);
    return PyLong_FromSize_t(b);
}

static PyMethodDef Tracker_methods[] = {
    {"observe", (PyCFunction)Tracker_observe, METH_VARARGS, "observe(id, metric, labels|None, gen) -> new"},
    {"observe_batch", (PyCFunction)Tracker_observe_batch, METH_VARARGS,
     "observe_batch(items, labels_of, gen) -> new indexes"},
    {"observe_inputs", (PyCFunction)Tracker_observe_inputs, METH_VARARGS,
     "observe_inputs(inputs, labels_of_key, gen) -> new indexes"},
    {"observe_many", (PyCFunction)Tracker_observe_many, METH_VARARGS, "observe_many(items, gen)"},
    {"lookup", (PyCFunction)Tracker_lookup, METH_O, "lookup(id) -> (metric, gen, lgen) or None"},
    {"contains", (PyCFunction)Tracker_contains, METH_VARARGS, "contains(id, gen)"},
    {"has", (PyCFunction)Tracker_has, METH_O, "has(id): kept (active or not swept yet)"},
    {"metric_count", (PyCFunction)Tracker_metric_count, METH_O, "active series of one metric"},
    {"metric_counts", (PyCFunction)Tracker_metric_counts, METH_NOARGS, "[(metric, active)] with active > 0"},
    {"pairs", (PyCFunction)Tracker_pairs, METH_NOARGS, "[(metric, label, distinct values)]"},
    {"label_union", (PyCFunction)Tracker_label_union, METH_NOARGS, "{label: distinct values over metrics}"},
    {"expire", (PyCFunction)Tracker_expire, METH_O, "expire(cutoff gen) -> series removed"},
    {"memory", (PyCFunction)Tracker_memory, METH_NOARGS, "bytes of the C tables"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Tracker_as_sequence = {.sq_length = (lenfunc)Tracker_len};

static PyTypeObject TrackerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "relay.native._cstage.Tracker",
    .tp_basicsize = sizeof(TrackerObject),
    .tp_dealloc = (destructor)Tracker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SeriesTracker's state in C tables (relay.cardinality.CSeriesTracker wraps it)",
    .tp_methods = Tracker_methods,
    .tp_as_sequence = &Tracker_as_sequence,
    .tp_new = Tracker_new,
};

/* ---- take(): DestinationStage.take's per-series loop -------------------------------------------- */

typedef struct {
    PyObject *reason; /* borrowed (a decision's metric slot, or one of the module's names) */
    int64_t samples, series;
} Drop;

typedef struct {
    Drop *d;
    Py_ssize_t n, cap;
} Drops;

static PyObject *S_aggregated, *S_too_far, *S_agg_histogram, *S_collision, *S_series_limit;

static int drops_add(Drops *ds, PyObject *reason, int64_t samples, int series) {
    Py_ssize_t i;
    for (i = 0; i < ds->n; i++)
        if (ds->d[i].reason == reason)
            goto found;
    for (i = 0; i < ds->n; i++) {
        int eq = PyObject_RichCompareBool(ds->d[i].reason, reason, Py_EQ);
        if (eq < 0)
            return -1;
        if (eq)
            goto found;
    }
    if (ds->n == ds->cap) {
        Py_ssize_t cap = ds->cap ? ds->cap * 2 : 8;
        Drop *d = PyMem_RawRealloc(ds->d, (size_t)cap * sizeof(Drop));
        if (d == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        ds->d = d;
        ds->cap = cap;
    }
    i = ds->n++;
    ds->d[i].reason = reason;
    ds->d[i].samples = ds->d[i].series = 0;
found:
    ds->d[i].samples += samples;
    ds->d[i].series += series;
    return 0;
}

enum { K_DROP = 0, K_AGG = 1, K_SENT = 2 };

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

static PyObject *lb_bytes(const Lb *lb) {
    if (lb->whole != NULL) {
        Py_INCREF(lb->whole);
        return lb->whole;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, lb->an + lb->bn + lb->cn);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, lb->a, (size_t)lb->an);
    memcpy(p + lb->an, lb->b, (size_t)lb->bn);
    memcpy(p + lb->an + lb->bn, lb->c, (size_t)lb->cn);
    return out;
}

/* a shard's payload, built in place in a bytes object (no copy at the end) */
typedef struct {
    PyObject *bytes; /* owned, or NULL */
    char *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 16384;
    while (cap < b->len + more)
        cap *= 2;
    if (cap > (size_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->bytes == NULL) {
        b->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
        if (b->bytes == NULL)
            return -1;
    } else if (_PyBytes_Resize(&b->bytes, (Py_ssize_t)cap) < 0) {
        return -1; /* (b->bytes is NULL now) */
    }
    b->p = PyBytes_AS_STRING(b->bytes);
    b->cap = cap;
    return 0;
}

/* an empty buffer given exactly n bytes of room (the caller knows what it will hold) */
static int buf_presize(Buf *b, size_t n) {
    if (b->bytes != NULL || n <= b->cap)
        return buf_reserve(b, n);
    if (n > (size_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    b->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (b->bytes == NULL)
        return -1;
    b->p = PyBytes_AS_STRING(b->bytes);
    b->cap = n;
    return 0;
}

typedef struct {
    uint64_t id;
    PyObject *metric; /* borrowed */
    Lb lb;
} Seen;

typedef struct {
    Seen *s;
    Py_ssize_t n, cap;
    PyObject *labels_of;
} SeenList;

static int seen_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric) {
    SeenList *sl = src->ctx;
    *id = sl->s[i].id;
    *metric = sl->s[i].metric;
    return 0;
}

static PyObject *seen_labels(ItemSource *src, Py_ssize_t i) {
    SeenList *sl = src->ctx;
    PyObject *lb = lb_bytes(&sl->s[i].lb);
    if (lb == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(sl->labels_of, lb);
    Py_DECREF(lb);
    return r;
}

/* the decision's output id as 128 bits; 0 unusual (too big), 1 ok; negative ids are K_AGG */
static int split_id(PyObject *sid, Entry *e) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(sid, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (overflow < 0 || (overflow == 0 && v < 0)) {
        e->kind = K_AGG;
        return 1;
    }
    e->kind = K_SENT;
    if (overflow == 0) {
        e->low = (uint64_t)v;
        e->high = 0;
        return 1;
    }
    unsigned char b[16];
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t need = PyLong_AsNativeBytes(sid, b, 16, Py_ASNATIVEBYTES_LITTLE_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
    if (need < 0) {
        PyErr_Clear();
        return 0;
    }
    if (need > 16)
        return 0;
#else
    if (_PyLong_AsByteArray((PyLongObject *)sid, b, 16, 1, 0) < 0) {
        PyErr_Clear();
        return 0;
    }
#endif
    uint64_t lo = 0, hi = 0;
    for (int i = 7; i >= 0; i--) {
        lo = (lo << 8) | b[i];
        hi = (hi << 8) | b[8 + i];
    }
    e->low = lo;
    e->high = hi;
    return 1;
}

static int get_i64(PyObject *o, int64_t *out) {
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

static inline PyObject *input_decision(PyObject *inputs, Py_ssize_t j) {
    return PyTuple_GET_ITEM(PyList_GET_ITEM(inputs, j), 0);
}

static PyObject *call_method(PyObject *obj, const char *name, PyObject *const *args, size_t n) {
    PyObject *m = PyObject_GetAttrString(obj, name);
    if (m == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(m, args, n, NULL);
    Py_DECREF(m);
    return r;
}

/* entries[j] and inputs[j] as wire.route makes them: 1 and *e, *l filled; 0 unusual */
static int check_entry(PyObject *entries, PyObject *inputs, Py_ssize_t j, Entry *e, Lb *l) {
    PyObject *en = PyList_GET_ITEM(entries, j);
    PyObject *in = PyList_GET_ITEM(inputs, j);
    if (!PyTuple_CheckExact(en) || PyTuple_GET_SIZE(en) != 4 || !PyTuple_CheckExact(in) || PyTuple_GET_SIZE(in) < 1)
        return 0;
    PyObject *d = PyTuple_GET_ITEM(en, 0), *rest = PyTuple_GET_ITEM(en, 1);
    PyObject *ind = PyTuple_GET_ITEM(in, 0);
    if (!PyTuple_CheckExact(d) || PyTuple_GET_SIZE(d) != 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(d, 0))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(d, 1)) || !PyBytes_CheckExact(rest) || !PyTuple_CheckExact(ind)
        || PyTuple_GET_SIZE(ind) < 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(ind, 0))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(ind, 1)) || !get_i64(PyTuple_GET_ITEM(en, 2), &e->n)
        || !get_i64(PyTuple_GET_ITEM(en, 3), &e->ts))
        return 0;
    PyObject *lb = PyTuple_GET_ITEM(d, 0);
    if (PyBytes_GET_SIZE(lb) == 0) {
        e->kind = K_DROP;
        return 1;
    }
    if (!split_id(PyTuple_GET_ITEM(d, 1), e))
        return 0;
    if (e->kind != K_SENT)
        return 1;
    l->whole = lb;
    l->a = PyBytes_AS_STRING(lb);
    l->an = PyBytes_GET_SIZE(lb);
    l->b = l->c = NULL;
    l->bn = l->cn = 0;
    if (e->high > 1) { /* the input key with the external labels' bytes inserted */
        PyObject *key = PyTuple_GET_ITEM(ind, 0);
        uint64_t pos = (e->high >> 1) - 1;
        Py_ssize_t klen = PyBytes_GET_SIZE(key);
        Py_ssize_t p = pos > (uint64_t)klen ? klen : (Py_ssize_t)pos; /* (slicing clamps) */
        l->whole = NULL;
        l->a = PyBytes_AS_STRING(key);
        l->an = p;
        l->b = PyBytes_AS_STRING(lb);
        l->bn = PyBytes_GET_SIZE(lb);
        l->c = PyBytes_AS_STRING(key) + p;
        l->cn = klen - p;
    }
    return 1;
}

/* every entry from j on is usual (before the first effect) */
static int check_rest(PyObject *entries, PyObject *inputs, Py_ssize_t j, Py_ssize_t n) {
    for (; j < n; j++) {
        Entry e;
        Lb l;
        if (!check_entry(entries, inputs, j, &e, &l))
            return 0;
    }
    return 1;
}

/* take()'s answer for one destination: (pieces [(shard, bytes, samples, oldest)], kept, routed, drops
   [(reason, samples, series)]), a new reference or NULL. The shards' buffers are cut to their length. */
static PyObject *stage_result(Buf *bufs, const int64_t *counts, const int64_t *oldest, Py_ssize_t shards,
                              const Drops *drops, int64_t kept, int64_t routed) {
    PyObject *pieces = PyList_New(0), *drops_out = PyList_New(0), *result = NULL;
    if (pieces == NULL || drops_out == NULL)
        goto done;
    for (Py_ssize_t s = 0; s < shards; s++) {
        if (!counts[s])
            continue;
        if (_PyBytes_Resize(&bufs[s].bytes, (Py_ssize_t)bufs[s].len) < 0)
            goto done;
        PyObject *piece = Py_BuildValue("(nOLL)", s, bufs[s].bytes, (long long)counts[s], (long long)oldest[s]);
        if (piece == NULL || PyList_Append(pieces, piece) < 0) {
            Py_XDECREF(piece);
            goto done;
        }
        Py_DECREF(piece);
    }
    for (Py_ssize_t i = 0; i < drops->n; i++) {
        PyObject *item = Py_BuildValue("(OLL)", drops->d[i].reason, (long long)drops->d[i].samples,
                                       (long long)drops->d[i].series);
        if (item == NULL || PyList_Append(drops_out, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    result = Py_BuildValue("(OLLO)", pieces, (long long)kept, (long long)routed, drops_out);
done:
    Py_XDECREF(pieces);
    Py_XDECREF(drops_out);
    return result;
}

static PyObject *take(PyObject *module, PyObject *args) {
    PyObject *stage, *entries, *inputs, *new_in, *in_active, *labels_of, *tracker_obj;
    long long gen;
    if (!PyArg_ParseTuple(args, "OOOOOOO!L:take", &stage, &entries, &inputs, &new_in, &in_active, &labels_of,
                          &TrackerType, &tracker_obj, &gen))
        return NULL;
    TrackerObject *tracker = (TrackerObject *)tracker_obj;
    if (!PyList_CheckExact(entries) || !PyList_CheckExact(inputs) || !PyAnySet_Check(new_in))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = PyList_GET_SIZE(entries);
    if (PyList_GET_SIZE(inputs) < n)
        Py_RETURN_NOTIMPLEMENTED;

    PyObject *shards_o = NULL, *limiter = NULL, *owners = NULL, *owners_dict = NULL, *contains_fn = NULL;
    PyObject *ext_o = NULL, *result = NULL;
    uint8_t *is_new = NULL;
    Buf *bufs = NULL;
    int64_t *counts = NULL, *oldest = NULL;
    Drops drops = {NULL, 0, 0};
    SeenList seen = {NULL, 0, 0, labels_of};
    Py_ssize_t shards = 0;
    int64_t kept = 0, routed = 0;

    /* Entries are checked as the loop reaches them; before the first call back into Python (an
     * effect) every later entry is checked too: anything unusual goes to the reference, before any
     * effect. */
    is_new = PyMem_RawCalloc((size_t)(n ? n : 1), 1);
    if (is_new == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int unusual = 0;
    if (unusual)
        goto not_implemented;
    if (PySet_GET_SIZE(new_in)) {
        PyObject *it = PyObject_GetIter(new_in), *x;
        if (it == NULL)
            goto fail;
        while ((x = PyIter_Next(it)) != NULL) {
            int64_t j;
            if (get_i64(x, &j) && j >= 0 && j < n)
                is_new[j] = 1;
            else if (!PyLong_Check(x))
                unusual = 1; /* (j in new_in for a non-int that equals an index: the reference) */
            Py_DECREF(x);
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            goto fail;
        if (unusual)
            goto not_implemented;
    }

    shards_o = PyObject_GetAttrString(stage, "shards");
    if (shards_o == NULL)
        goto fail;
    shards = PyLong_AsSsize_t(shards_o);
    if (shards == -1 && PyErr_Occurred())
        goto fail;
    if (shards <= 0)
        goto not_implemented;
    limiter = PyObject_GetAttrString(stage, "limiter");
    owners = PyObject_GetAttrString(stage, "owners");
    if (limiter == NULL || owners == NULL)
        goto fail;
    owners_dict = PyObject_GetAttrString(owners, "owners");
    if (owners_dict == NULL)
        goto fail;
    if (!PyDict_CheckExact(owners_dict))
        goto not_implemented;
    bufs = PyMem_RawCalloc((size_t)shards, sizeof(Buf));
    counts = PyMem_RawCalloc((size_t)shards, sizeof(int64_t));
    oldest = PyMem_RawCalloc((size_t)shards, sizeof(int64_t));
    if (bufs == NULL || counts == NULL || oldest == NULL) {
        PyErr_NoMemory();
        goto fail;
    }

    int checked = 0; /* every entry checked: effects may happen */
#define BEFORE_EFFECT()                                                                            \
    do {                                                                                           \
        if (!checked) {                                                                            \
            if (!check_rest(entries, inputs, j + 1, n))                                            \
                goto not_implemented;                                                              \
            checked = 1;                                                                           \
        }                                                                                          \
    } while (0)
    for (Py_ssize_t j = 0; j < n; j++) {
        Entry ent;
        Lb lbv;
        Entry *e = &ent;
        if (!check_entry(entries, inputs, j, e, &lbv)) {
            if (checked) { /* (cannot be: checked before the first effect) */
                PyErr_SetString(PyExc_SystemError, "take: an entry changed under the loop");
                goto fail;
            }
            goto not_implemented;
        }
        PyObject *d = PyTuple_GET_ITEM(PyList_GET_ITEM(entries, j), 0);
        PyObject *metric = PyTuple_GET_ITEM(d, 2);
        routed += e->n;
        if (e->kind == K_DROP) { /* the metric slot holds the reason */
            if (drops_add(&drops, metric, e->n, is_new[j]) < 0)
                goto fail;
            continue;
        }
        PyObject *in_id = PyTuple_GET_ITEM(input_decision(inputs, j), 1);
        if (e->kind == K_AGG) {
            BEFORE_EFFECT();
            PyObject *argv[] = {stage, d, PyTuple_GET_ITEM(PyList_GET_ITEM(entries, j), 1),
                                PyTuple_GET_ITEM(PyList_GET_ITEM(entries, j), 2), in_id};
            PyObject *r = call_method(stage, "_aggregate", argv + 1, 4);
            if (r == NULL)
                goto fail;
            int64_t a, t, h;
            int ok = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 3 && get_i64(PyTuple_GET_ITEM(r, 0), &a)
                     && get_i64(PyTuple_GET_ITEM(r, 1), &t) && get_i64(PyTuple_GET_ITEM(r, 2), &h);
            Py_DECREF(r);
            if (!ok) {
                PyErr_SetString(PyExc_TypeError, "DestinationStage._aggregate must return three ints");
                goto fail;
            }
            if ((a && drops_add(&drops, S_aggregated, a, 0) < 0) || (t && drops_add(&drops, S_too_far, t, 0) < 0)
                || (h > 0 && drops_add(&drops, S_agg_histogram, h, 0) < 0))
                goto fail;
            continue;
        }
        /* a series sent: its output's owner first */
        Lb *l = &lbv;
        int ok;
        int claim = (int)(e->high & 1);
        if (!claim && PyDict_GET_SIZE(owners_dict) == 0) {
            ok = 1;
        } else {
            PyObject *sid = PyLong_FromUnsignedLongLong(e->low);
            if (sid == NULL)
                goto fail;
            PyObject *owner = PyDict_GetItemWithError(owners_dict, sid);
            if (owner == NULL && PyErr_Occurred()) {
                Py_DECREF(sid);
                goto fail;
            }
            ok = 0;
            if (owner == NULL) {
                ok = !claim; /* unchanged(): no owner, the series is its output's */
            } else {
                int eq = PyObject_RichCompareBool(owner, in_id, Py_EQ);
                if (eq < 0) {
                    Py_DECREF(sid);
                    goto fail;
                }
                ok = eq;
            }
            if (!ok) { /* a change of owner, or a refusal: the reference decides */
                BEFORE_EFFECT();
                PyObject *r;
                if (claim) {
                    if (contains_fn == NULL) {
                        PyObject *stats = PyObject_GetAttrString(stage, "stats");
                        PyObject *tr = stats ? PyObject_GetAttrString(stats, "tracker_out") : NULL;
                        Py_XDECREF(stats);
                        contains_fn = tr ? PyObject_GetAttrString(tr, "contains") : NULL;
                        Py_XDECREF(tr);
                        if (contains_fn == NULL) {
                            Py_DECREF(sid);
                            goto fail;
                        }
                    }
                    PyObject *argv[] = {sid, in_id, in_active, contains_fn};
                    r = call_method(owners, "claim", argv, 4);
                } else {
                    PyObject *argv[] = {sid, in_id, in_active};
                    r = call_method(owners, "unchanged", argv, 3);
                }
                if (r == NULL) {
                    Py_DECREF(sid);
                    goto fail;
                }
                ok = PyObject_IsTrue(r);
                Py_DECREF(r);
                if (ok < 0) {
                    Py_DECREF(sid);
                    goto fail;
                }
            }
            Py_DECREF(sid);
        }
        if (!ok) {
            BEFORE_EFFECT();
            if (drops_add(&drops, S_collision, e->n, is_new[j]) < 0)
                goto fail;
            PyObject *lb = lb_bytes(l);
            if (lb == NULL)
                goto fail;
            PyObject *argv[] = {lb};
            PyObject *r = call_method(stage, "_collided", argv, 1);
            Py_DECREF(lb);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
            continue;
        }
        if (limiter == Py_None || tracker_contains(tracker, e->low, gen)) {
            if (seen.n == seen.cap) {
                Py_ssize_t cap = seen.cap ? seen.cap * 2 : 256;
                Seen *s = PyMem_RawRealloc(seen.s, (size_t)cap * sizeof(Seen));
                if (s == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                seen.s = s;
                seen.cap = cap;
            }
            seen.s[seen.n].id = e->low;
            seen.s[seen.n].metric = metric;
            seen.s[seen.n].lb = *l;
            seen.n++;
        } else {
            BEFORE_EFFECT();
            PyObject *sid = PyLong_FromUnsignedLongLong(e->low);
            PyObject *lb = sid ? lb_bytes(l) : NULL;
            if (lb == NULL) {
                Py_XDECREF(sid);
                goto fail;
            }
            PyObject *argv[] = {sid, metric, lb, labels_of};
            PyObject *r = call_method(stage, "_admit", argv, 4);
            Py_DECREF(sid);
            Py_DECREF(lb);
            if (r == NULL)
                goto fail;
            int admitted = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (admitted < 0)
                goto fail;
            if (!admitted) {
                if (drops_add(&drops, S_series_limit, e->n, 0) < 0)
                    goto fail;
                continue;
            }
        }
        Py_ssize_t shard = (Py_ssize_t)(e->low % (uint64_t)shards);
        PyObject *rest = PyTuple_GET_ITEM(PyList_GET_ITEM(entries, j), 1);
        size_t size = (size_t)(l->an + l->bn + l->cn + PyBytes_GET_SIZE(rest));
        Buf *b = &bufs[shard];
        if (buf_reserve(b, size + 11) < 0)
            goto fail;
        b->p[b->len++] = 0x0a; /* one WriteRequest field-1 entry: tag, length, labels, rest */
        size_t v = size;
        while (v >= 0x80) {
            b->p[b->len++] = (char)(v | 0x80);
            v >>= 7;
        }
        b->p[b->len++] = (char)v;
        memcpy(b->p + b->len, l->a, (size_t)l->an);
        b->len += (size_t)l->an;
        if (l->bn) {
            memcpy(b->p + b->len, l->b, (size_t)l->bn);
            b->len += (size_t)l->bn;
        }
        if (l->cn) {
            memcpy(b->p + b->len, l->c, (size_t)l->cn);
            b->len += (size_t)l->cn;
        }
        memcpy(b->p + b->len, PyBytes_AS_STRING(rest), (size_t)PyBytes_GET_SIZE(rest));
        b->len += (size_t)PyBytes_GET_SIZE(rest);
        counts[shard] += e->n;
        if (e->ts && (e->ts < oldest[shard] || !oldest[shard]))
            oldest[shard] = e->ts;
        kept += e->n;
    }
#undef BEFORE_EFFECT
    if (seen.n) {
        ItemSource src = {seen.n, seen_get, seen_labels, &seen, NULL, labels_of, 1};
        PyObject *r = observe_source(tracker, &src, gen);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    result = stage_result(bufs, counts, oldest, shards, &drops, kept, routed);
    goto done;
not_implemented:
    result = Py_NewRef(Py_NotImplemented);
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(shards_o);
    Py_XDECREF(limiter);
    Py_XDECREF(owners);
    Py_XDECREF(owners_dict);
    Py_XDECREF(contains_fn);
    Py_XDECREF(ext_o);
    if (bufs != NULL)
        for (Py_ssize_t s = 0; s < shards; s++)
            Py_XDECREF(bufs[s].bytes);
    PyMem_RawFree(bufs);
    PyMem_RawFree(counts);
    PyMem_RawFree(oldest);
    PyMem_RawFree(is_new);
    PyMem_RawFree(drops.d);
    PyMem_RawFree(seen.s);
    return result;
}

/* ---- route_hits(): a request whose every series is a cache hit, without Python objects per series --
 *
 * Pipeline.route's whole per-series pass in one call for the steady state: the route loop (its pass 1
 * from relay.native._cwire), the decision cache lookups (relay.native._cdcache's packed entries, read in place: no
 * decision tuples, key or rest bytes), the in tracker's observe_inputs, and per destination take()'s
 * drops, owner and limit checks, out tracker and queue pieces. Pass 1 reads the request and every
 * decision and checks everything the reference might do otherwise, with no side effect: any miss
 * (decide() would run), a decision of another kind (aggregated, stored whole, None for a
 * destination), an owner that is not the series' own, a series a limiter has not admitted yet answer
 * NotImplemented, and Pipeline.route runs its usual path on the whole request. Pass 2 then has the
 * reference's effects in the reference's order (the same observe_source for the trackers). */

static const fp_wire_api *wire_api;
static const fp_table_api *table_api;
static Py_ssize_t n_hit_series, n_hit_requests;

typedef struct {
    Py_ssize_t key_start, key_end, rest_start, rest_end;
    int64_t n, ts;
    uint64_t in_id;
    PyObject *metric_in; /* owned */
} Hit;

typedef struct {
    uint64_t low, high;
    uint64_t aux;
    PyObject *obj;   /* owned: the metric (sent) or the drop's reason */
    PyObject *lbobj; /* owned or NULL: the output bytes (OWN, SHARED) or the edit's run (EDIT) */
    Py_ssize_t lb_len; /* the decision's label bytes (before the external labels go in) */
    int kind;        /* K_DROP or K_SENT */
    int mode;        /* FP_LB_* */
} HitDest;

typedef struct {
    const uint8_t *b;
    Hit *hits;
    HitDest *dests;
    Py_ssize_t nd; /* destinations */
    Py_ssize_t dest; /* the destination whose seen list is observed */
    Py_ssize_t *seen; /* item indexes of its kept series */
    PyObject *labels_of;
} HitCtx;

static int load_apis(void) {
    if (wire_api == NULL) {
        const fp_wire_api *w = PyCapsule_Import("relay.native._cwire._parse_api", 0);
        if (w == NULL)
            return -1;
        if (w->version != FP_API_VERSION) {
            PyErr_SetString(PyExc_ImportError, "relay.native._cwire: another fast path API version");
            return -1;
        }
        wire_api = w;
    }
    if (table_api == NULL) {
        const fp_table_api *t = PyCapsule_Import("relay.native._cdcache._table_api", 0);
        if (t == NULL)
            return -1;
        if (t->version != FP_API_VERSION) {
            PyErr_SetString(PyExc_ImportError, "relay.native._cdcache: another fast path API version");
            return -1;
        }
        table_api = t;
    }
    return 0;
}

/* The output label bytes of destination d of hit h: written to out (room for hit_lb_len). */
static Py_ssize_t hit_lb_len(const Hit *h, const HitDest *d) {
    return d->lb_len + (d->high > 1 ? h->key_end - h->key_start : 0);
}

static void hit_lb_write(const uint8_t *b, const Hit *h, const HitDest *d, char *out) {
    const char *key = (const char *)b + h->key_start;
    Py_ssize_t klen = h->key_end - h->key_start, p = 0;
    if (d->high > 1) { /* the input key with the decision's bytes inserted at pos (slicing clamps) */
        uint64_t pos = (d->high >> 1) - 1;
        p = pos > (uint64_t)klen ? klen : (Py_ssize_t)pos;
        memcpy(out, key, (size_t)p);
        out += p;
    }
    switch (d->mode) {
    case FP_LB_KEY:
        memcpy(out, key, (size_t)klen);
        break;
    case FP_LB_EDIT:
        table_api->edit((const uint8_t *)key, (size_t)klen, d->aux, d->lbobj ? PyBytes_AS_STRING(d->lbobj) : NULL,
                        d->lbobj ? (size_t)PyBytes_GET_SIZE(d->lbobj) : 0, (uint8_t *)out);
        break;
    default:
        memcpy(out, PyBytes_AS_STRING(d->lbobj), (size_t)d->lb_len);
        break;
    }
    out += d->lb_len;
    if (d->high > 1)
        memcpy(out, key + p, (size_t)(klen - p));
}

static int hits_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric) {
    HitCtx *c = src->ctx;
    *id = c->hits[i].in_id;
    *metric = c->hits[i].metric_in;
    return 0;
}

static PyObject *hits_labels(ItemSource *src, Py_ssize_t i) {
    HitCtx *c = src->ctx;
    const Hit *h = &c->hits[i];
    PyObject *key = PyBytes_FromStringAndSize((const char *)c->b + h->key_start, h->key_end - h->key_start);
    if (key == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(c->labels_of, key);
    Py_DECREF(key);
    return r;
}

static int kept_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric) {
    HitCtx *c = src->ctx;
    const HitDest *d = &c->dests[c->seen[i] * c->nd + c->dest];
    *id = d->low;
    *metric = d->obj;
    return 0;
}

static PyObject *kept_labels(ItemSource *src, Py_ssize_t i) {
    HitCtx *c = src->ctx;
    const Hit *h = &c->hits[c->seen[i]];
    const HitDest *d = &c->dests[c->seen[i] * c->nd + c->dest];
    PyObject *lb = PyBytes_FromStringAndSize(NULL, hit_lb_len(h, d));
    if (lb == NULL)
        return NULL;
    hit_lb_write(c->b, h, d, PyBytes_AS_STRING(lb));
    PyObject *r = PyObject_CallOneArg(c->labels_of, lb);
    Py_DECREF(lb);
    return r;
}

/* Destination word w of an entry for hit h into *d (references taken); 1, or 0: not for this path. */
static int hit_dest(PyObject *table, const uint8_t *b, const Hit *h, const uint64_t *w, HitDest *d) {
    PyObject *o = (PyObject *)(uintptr_t)(w[1] & ~(uint64_t)3);
    memset(d, 0, sizeof(*d));
    switch (w[1] & 3) {
    case FP_K_SHARED: /* a drop (b"", 0, reason), shared by every series dropped for that reason */
        if (!PyTuple_CheckExact(o) || PyTuple_GET_SIZE(o) != 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(o, 0))
            || PyBytes_GET_SIZE(PyTuple_GET_ITEM(o, 0)) != 0)
            return 0;
        d->kind = K_DROP;
        d->obj = Py_NewRef(PyTuple_GET_ITEM(o, 2));
        return 1;
    case FP_K_SENT:
        break;
    default: /* None for a destination (the reference raises), or a tuple stored as is (aggregated) */
        return 0;
    }
    uint64_t aux = w[2];
    int mode = (int)((aux >> 1) & 3);
    Py_ssize_t klen = h->key_end - h->key_start;
    PyObject *lb = NULL;
    d->kind = K_SENT;
    d->mode = mode;
    d->aux = aux;
    d->low = w[0];
    d->high = mode == FP_LB_OWN || mode == FP_LB_EDIT ? (aux & 1) : (aux & 1) | ((aux >> 11) << 1);
    switch (mode) {
    case FP_LB_KEY:
        d->lb_len = klen;
        break;
    case FP_LB_OWN:
        lb = (PyObject *)(uintptr_t)(aux & ~(uint64_t)7);
        if (!PyBytes_CheckExact(lb))
            return 0;
        d->lb_len = PyBytes_GET_SIZE(lb);
        break;
    case FP_LB_SHARED:
        lb = table_api->shared(table, (int)((aux >> 3) & 0xff));
        if (lb == NULL || !PyBytes_CheckExact(lb))
            return 0;
        d->lb_len = PyBytes_GET_SIZE(lb);
        break;
    default: { /* FP_LB_EDIT: the key with label entries left out and a run put in */
        int run = (int)((aux >> 3) & 31);
        if (run) {
            lb = table_api->shared(table, run - 1);
            if (lb == NULL || !PyBytes_CheckExact(lb))
                return 0;
        }
        d->lb_len = table_api->edit(b + h->key_start, (size_t)klen, aux, lb ? PyBytes_AS_STRING(lb) : NULL,
                                    lb ? (size_t)PyBytes_GET_SIZE(lb) : 0, NULL);
        if (d->lb_len < 0)
            return 0;
        break;
    }
    }
    if (d->lb_len == 0)
        return 0; /* the reference takes an empty output for a drop: not this path */
    d->obj = Py_NewRef(o);
    d->lbobj = Py_XNewRef(lb);
    return 1;
}

/* the owner of out id `low` (a dict int -> int) lets input `in_id` send it without a call into the
   reference's CollisionOwners: 1 yes, 0 the reference must decide, -1 error */
static int owner_ok(PyObject *owners, const HitDest *d, uint64_t in_id) {
    int claim = (int)(d->high & 1);
    if (!claim && PyDict_GET_SIZE(owners) == 0)
        return 1;
    PyObject *sid = PyLong_FromUnsignedLongLong(d->low);
    if (sid == NULL)
        return -1;
    PyObject *owner = PyDict_GetItemWithError(owners, sid);
    Py_DECREF(sid);
    if (owner == NULL)
        return PyErr_Occurred() ? -1 : !claim;
    if (!PyLong_CheckExact(owner))
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(owner);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return v == in_id;
}

typedef struct {
    Py_ssize_t shards;
    int limited;
    PyObject *owners;   /* borrowed (the stages tuple holds it) */
    TrackerObject *tracker;
    int64_t gen;
} HitStage;

static PyObject *route_hits(PyObject *module, PyObject *args) {
    PyObject *body, *table, *tracker_obj, *stages_arg, *labels_of;
    long long gen_in;
    if (!PyArg_ParseTuple(args, "SOO!LOO:route_hits", &body, &table, &TrackerType, &tracker_obj, &gen_in,
                          &stages_arg, &labels_of))
        return NULL;
    if (load_apis() < 0)
        return NULL;
    if (!PyBytes_CheckExact(body) || Py_TYPE(table) != table_api->type || !PyTuple_CheckExact(stages_arg))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t nd = PyTuple_GET_SIZE(stages_arg);
    if (nd < 1 || table_api->width(table) != nd + 1)
        Py_RETURN_NOTIMPLEMENTED;
    const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(body);
    fp_items it;
    int ok = wire_api->parse(b, PyBytes_GET_SIZE(body), &it);
    if (ok <= 0) {
        wire_api->items_free(&it);
        if (ok < 0)
            return PyErr_NoMemory();
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result = NULL, *metadata = NULL, *per_stage = NULL, *new_in = NULL;
    HitStage *st = NULL;
    Hit *hits = NULL;
    HitDest *dests = NULL;
    uint64_t (*hk)[2] = NULL; /* each item's key hash */
    uint8_t *is_new = NULL;
    Py_ssize_t *seen = NULL;
    Buf *bufs = NULL;
    int64_t *counts = NULL, *oldest = NULL;
    Drops drops = {NULL, 0, 0};
    Py_ssize_t nh = 0, nbufs = 0; /* hits filled in (their references held) */
    Py_ssize_t series = 0, samples = 0, histograms = 0, exemplars = 0;

    st = PyMem_RawCalloc((size_t)nd, sizeof(HitStage));
    hits = PyMem_RawMalloc(sizeof(Hit) * (size_t)(it.len ? it.len : 1));
    dests = PyMem_RawCalloc((size_t)(it.len ? it.len : 1) * (size_t)nd, sizeof(HitDest));
    if (st == NULL || hits == NULL || dests == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t j = 0; j < nd; j++) { /* (shards, limited, owners dict, tracker, gen) */
        PyObject *s = PyTuple_GET_ITEM(stages_arg, j);
        if (!PyTuple_CheckExact(s) || PyTuple_GET_SIZE(s) != 5 || !PyDict_CheckExact(PyTuple_GET_ITEM(s, 2))
            || Py_TYPE(PyTuple_GET_ITEM(s, 3)) != &TrackerType || PyTuple_GET_ITEM(s, 3) == tracker_obj)
            goto not_implemented;
        int64_t shards, gen;
        if (!get_i64(PyTuple_GET_ITEM(s, 0), &shards) || shards <= 0 || !get_i64(PyTuple_GET_ITEM(s, 4), &gen))
            goto not_implemented;
        int limited = PyObject_IsTrue(PyTuple_GET_ITEM(s, 1));
        if (limited < 0)
            goto fail;
        st[j] = (HitStage){(Py_ssize_t)shards, limited, PyTuple_GET_ITEM(s, 2),
                           (TrackerObject *)PyTuple_GET_ITEM(s, 3), gen};
    }

    /* every series' key hashed, its index slot then its entry prefetched: the lookups below find
       them in the cache instead of waiting on memory one after the other */
    hk = PyMem_RawMalloc(sizeof(*hk) * (size_t)(it.len ? it.len : 1));
    if (hk == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t pending = -1; /* keys are hashed two at a time */
    for (Py_ssize_t i = 0; i < it.len; i++) {
        const fp_item *r = &it.items[i];
        if (r->metadata)
            continue;
        if (pending < 0) {
            pending = i;
            continue;
        }
        const fp_item *q = &it.items[pending];
        table_api->hash2(b + q->start, (size_t)(q->key_end - q->start), hk[pending], b + r->start,
                         (size_t)(r->key_end - r->start), hk[i]);
        table_api->prefetch(table, hk[pending], 0);
        table_api->prefetch(table, hk[i], 0);
        pending = -1;
    }
    if (pending >= 0) {
        const fp_item *q = &it.items[pending];
        table_api->hash(b + q->start, (size_t)(q->key_end - q->start), hk[pending]);
        table_api->prefetch(table, hk[pending], 0);
    }
    for (Py_ssize_t i = 0; i < it.len; i++)
        if (!it.items[i].metadata)
            table_api->prefetch(table, hk[i], 1);

    /* pass 1: every lookup as the reference's loop makes them (its one-sample guess included) */
    Py_ssize_t glen = 0, head = 0;
    int64_t gts = 0;
    for (Py_ssize_t i = 0; i < it.len; i++) {
        const fp_item *r = &it.items[i];
        if (r->metadata)
            continue;
        const uint64_t *e = NULL;
        Hit h;
        if (glen && glen < r->end - r->start) {
            Py_ssize_t g = r->end - glen;
            if (memcmp(b + g + 11, b + head + 11, (size_t)glen - 11) == 0 && memcmp(b + g, b + head, 3) == 0) {
                e = g == r->key_end ? table_api->find(table, hk[i])
                                    : table_api->lookup(table, b + r->start, (size_t)(g - r->start));
                if (e != NULL) {
                    series++;
                    samples++;
                    h = (Hit){r->start, g, g, r->end, 1, gts, 0, NULL};
                }
            }
        }
        if (e == NULL) {
            if (r->guess) {
                glen = r->end - r->key_end;
                gts = r->oldest;
                head = r->key_end;
            } else {
                glen = 0;
            }
            series++;
            samples += r->ns;
            exemplars += r->ne;
            histograms += r->nh;
            e = table_api->find(table, hk[i]); /* the key [start, key_end) */
            if (e == NULL)
                goto not_implemented; /* a miss: decide() runs on the usual path */
            h = (Hit){r->start, r->key_end, r->key_end, r->end, r->ns + r->nh, r->oldest, 0, NULL};
        }
        if (e[3] & FP_WHOLE)
            goto not_implemented;
        h.in_id = e[2];
        HitDest *hd = &dests[nh * nd];
        for (Py_ssize_t j = 0; j < nd; j++) {
            if (!hit_dest(table, b, &h, e + FP_HDR + 3 * j, &hd[j])) {
                for (Py_ssize_t k = 0; k < j; k++) {
                    Py_CLEAR(hd[k].obj);
                    Py_CLEAR(hd[k].lbobj);
                }
                goto not_implemented;
            }
        }
        h.metric_in = Py_NewRef((PyObject *)(uintptr_t)e[3]);
        hits[nh++] = h;
    }
    /* ... and every owner and limiter check (nothing has changed them yet) */
    for (Py_ssize_t i = 0; i < nh; i++)
        for (Py_ssize_t j = 0; j < nd; j++) {
            const HitDest *d = &dests[i * nd + j];
            if (d->kind != K_SENT)
                continue;
            int o = owner_ok(st[j].owners, d, hits[i].in_id);
            if (o < 0)
                goto fail;
            if (!o || (st[j].limited && !tracker_contains(st[j].tracker, d->low, st[j].gen)))
                goto not_implemented;
        }

    /* pass 2: the in tracker, then each destination, as Pipeline.route calls them */
    HitCtx ctx = {b, hits, dests, nd, 0, NULL, labels_of};
    ItemSource in_src = {nh, hits_get, hits_labels, &ctx, NULL, labels_of, 1};
    new_in = observe_source((TrackerObject *)tracker_obj, &in_src, gen_in);
    if (new_in == NULL)
        goto fail;
    is_new = PyMem_RawCalloc((size_t)(nh ? nh : 1), 1);
    seen = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(nh ? nh : 1));
    if (is_new == NULL || seen == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(new_in); k++) {
        Py_ssize_t x = PyLong_AsSsize_t(PyList_GET_ITEM(new_in, k));
        if (x >= 0 && x < nh)
            is_new[x] = 1;
    }
    per_stage = PyList_New(0);
    if (per_stage == NULL)
        goto fail;
    for (Py_ssize_t j = 0; j < nd; j++) {
        Py_ssize_t shards = st[j].shards, nseen = 0;
        int64_t kept = 0, routed = 0;
        bufs = PyMem_RawCalloc((size_t)shards, sizeof(Buf));
        counts = PyMem_RawCalloc((size_t)shards, sizeof(int64_t));
        oldest = PyMem_RawCalloc((size_t)shards, sizeof(int64_t));
        nbufs = shards;
        drops.n = 0;
        if (bufs == NULL || counts == NULL || oldest == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        /* each shard's piece sized once, to what it will hold: growing it by doubling copied a
           pass-through request's output about twice over (its tag, up to 10 length bytes, the entry) */
        for (Py_ssize_t i = 0; i < nh; i++) {
            const Hit *h = &hits[i];
            const HitDest *d = &dests[i * nd + j];
            if (d->kind != K_DROP)
                counts[d->low % (uint64_t)shards] +=
                    (int64_t)(11 + hit_lb_len(h, d) + (h->rest_end - h->rest_start));
        }
        for (Py_ssize_t s = 0; s < shards; s++) {
            if (counts[s] && buf_presize(&bufs[s], (size_t)counts[s]) < 0)
                goto fail;
            counts[s] = 0;
        }
        for (Py_ssize_t i = 0; i < nh; i++) {
            const Hit *h = &hits[i];
            const HitDest *d = &dests[i * nd + j];
            routed += h->n;
            if (d->kind == K_DROP) {
                if (drops_add(&drops, d->obj, h->n, is_new[i]) < 0)
                    goto fail;
                continue;
            }
            seen[nseen++] = i;
            Py_ssize_t shard = (Py_ssize_t)(d->low % (uint64_t)shards);
            Py_ssize_t lbn = hit_lb_len(h, d), rn = h->rest_end - h->rest_start;
            size_t size = (size_t)(lbn + rn);
            Buf *bf = &bufs[shard];
            if (buf_reserve(bf, size + 11) < 0)
                goto fail;
            bf->p[bf->len++] = 0x0a; /* one WriteRequest field-1 entry: tag, length, labels, rest */
            size_t v = size;
            while (v >= 0x80) {
                bf->p[bf->len++] = (char)(v | 0x80);
                v >>= 7;
            }
            bf->p[bf->len++] = (char)v;
            hit_lb_write(b, h, d, bf->p + bf->len);
            bf->len += (size_t)lbn;
            memcpy(bf->p + bf->len, b + h->rest_start, (size_t)rn);
            bf->len += (size_t)rn;
            counts[shard] += h->n;
            if (h->ts && (h->ts < oldest[shard] || !oldest[shard]))
                oldest[shard] = h->ts;
            kept += h->n;
        }
        if (nseen) {
            ctx.dest = j;
            ctx.seen = seen;
            ItemSource src = {nseen, kept_get, kept_labels, &ctx, NULL, labels_of, 1};
            PyObject *r = observe_source(st[j].tracker, &src, st[j].gen);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        }
        PyObject *one = stage_result(bufs, counts, oldest, shards, &drops, kept, routed);
        if (one == NULL || PyList_Append(per_stage, one) < 0) {
            Py_XDECREF(one);
            goto fail;
        }
        Py_DECREF(one);
        for (Py_ssize_t s = 0; s < nbufs; s++)
            Py_XDECREF(bufs[s].bytes);
        PyMem_RawFree(bufs);
        PyMem_RawFree(counts);
        PyMem_RawFree(oldest);
        bufs = NULL;
        counts = oldest = NULL;
        nbufs = 0;
        continue;
    }
    metadata = PyList_New(0);
    if (metadata == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < it.len; i++) {
        const fp_item *r = &it.items[i];
        if (!r->metadata)
            continue;
        PyObject *m = PyBytes_FromStringAndSize((const char *)b + r->start, r->end - r->start);
        if (m == NULL || PyList_Append(metadata, m) < 0) {
            Py_XDECREF(m);
            goto fail;
        }
        Py_DECREF(m);
    }
    result = Py_BuildValue("(nnnnOO)", series, samples, histograms, exemplars, metadata, per_stage);
    if (result != NULL) {
        n_hit_series += nh;
        n_hit_requests++;
    }
    goto done;
not_implemented:
    result = Py_NewRef(Py_NotImplemented);
    goto done;
fail:
    result = NULL;
done:
    for (Py_ssize_t i = 0; i < nh; i++) {
        Py_DECREF(hits[i].metric_in);
        for (Py_ssize_t j = 0; j < nd; j++) {
            Py_XDECREF(dests[i * nd + j].obj);
            Py_XDECREF(dests[i * nd + j].lbobj);
        }
    }
    if (bufs != NULL)
        for (Py_ssize_t s = 0; s < nbufs; s++)
            Py_XDECREF(bufs[s].bytes);
    PyMem_RawFree(bufs);
    PyMem_RawFree(counts);
    PyMem_RawFree(oldest);
    PyMem_RawFree(drops.d);
    PyMem_RawFree(is_new);
    PyMem_RawFree(seen);
    PyMem_RawFree(st);
    PyMem_RawFree(hits);
    PyMem_RawFree(dests);
    PyMem_RawFree(hk);
    Py_XDECREF(new_in);
    Py_XDECREF(metadata);
    Py_XDECREF(per_stage);
    wire_api->items_free(&it);
    return result;
}

static PyObject *hit_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(nn)", n_hit_requests, n_hit_series);
}

/* ---- the module --------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"take", (PyCFunction)take, METH_VARARGS,
     "take(stage, entries, inputs, new_in, in_active, labels_of, tracker, gen) -> (pieces, kept, routed, "
     "[(reason, samples, series)]) or NotImplemented (the reference must run)"},
    {"route_hits", (PyCFunction)route_hits, METH_VARARGS,
     "route_hits(body, table, tracker_in, gen_in, stages, labels_of) -> (series, samples, histograms, "
     "exemplars, [metadata bytes], [(pieces, kept, routed, drops)] per stage) or NotImplemented: a request whose "
     "every series is a hit in the DecisionTable, routed without Python objects per series; stages: "
     "(shards, limited, owners dict, out tracker, gen) each"},
    {"hit_counts", (PyCFunction)hit_counts, METH_NOARGS,
     "hit_counts() -> (requests, series) routed by route_hits so far (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "relay.native._cstage",
    "The relay's per-series stateful pass in C (relay.cardinality, relay.stage use it).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cstage(void) {
    PyObject *os = PyImport_ImportModule("os");
    if (os == NULL)
        return NULL;
    PyObject *rnd = PyObject_CallMethod(os, "urandom", "i", 8);
    Py_DECREF(os);
    if (rnd == NULL)
        return NULL;
    if (!PyBytes_Check(rnd) || PyBytes_GET_SIZE(rnd) != 8) {
        Py_DECREF(rnd);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom(8) did not return 8 bytes");
        return NULL;
    }
    memcpy(&t12_key, PyBytes_AS_STRING(rnd), 8);
    Py_DECREF(rnd);
    if (PyType_Ready(&TableType) < 0 || PyType_Ready(&TrackerType) < 0)
        return NULL;
    S_aggregated = PyUnicode_InternFromString("aggregated");
    S_too_far = PyUnicode_InternFromString("too_far_in_future");
    S_agg_histogram = PyUnicode_InternFromString("aggregate_histogram");
    S_collision = PyUnicode_InternFromString("collision");
    S_series_limit = PyUnicode_InternFromString("series_limit");
    if (!S_aggregated || !S_too_far || !S_agg_histogram || !S_collision || !S_series_limit)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TableType);
    Py_INCREF(&TrackerType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0
        || PyModule_AddObject(m, "Tracker", (PyObject *)&TrackerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

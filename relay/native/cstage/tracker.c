/* relay.native._cstage: the tracker's state (slots, metrics, label pairs, series moves, expiry).
 *
 * Reference: relay/state/series_tracker.py, SeriesTracker (its _series dict, _metric_counts,
 * expire). The series table is T12 id -> slot index; a slot is shared by every series of one
 * (metric, generation, labels generation), reference counted. The Python wrapper (CSeriesTracker)
 * reads the clock and passes the generation in.
 */
#include "cstage.h"

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
        if (!tbl_stays(i, j, h)) {
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

void slot_unref(TrackerObject *t, uint32_t x) {
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
uint32_t metric_index(TrackerObject *t, PyObject *metric) {
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

/* the pair (metric, name), created when new (and marked as existing); NONE32 with an exception */
uint32_t pair_index(TrackerObject *t, uint32_t m, PyObject *name) {
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

/* re-point series `id` (present) to (metric, gen, lgen) */
int series_move(TrackerObject *t, uint64_t id, uint32_t metric, int64_t gen, int64_t lgen) {
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

int series_insert(TrackerObject *t, uint64_t id, uint32_t metric, int64_t gen, int64_t lgen) {
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

void metric_decrement(TrackerObject *t, uint32_t m, int64_t n) {
    int64_t *c = metric_counter(t, m);
    *c -= n;
    if (*c < 0)
        *c = 0;
}

void series_forget(TrackerObject *t, uint64_t id) {
    uint32_t *p = t12_find(&t->series, id);
    uint32_t x = *p;
    uint32_t m = t->slots[x].metric;
    t12_del(&t->series, id);
    metric_decrement(t, m, 1);
    slot_unref(t, x);
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

/* SeriesTracker.expire with the cutoff generation: label values first (as the reference), then
 * series, then metrics nothing uses any more; how many series left, -1 with an exception */
Py_ssize_t tracker_expire(TrackerObject *t, int64_t cutoff) {
    ExpireCtx ctx = {t, cutoff};
    if (values_sweep(t, cutoff) < 0)
        return -1;
    Py_ssize_t n_dead = t12_remove_if(&t->series, series_dead, series_gone, &ctx);
    if (n_dead < 0)
        return -1;
    /* metrics no slot, pair or series uses any more */
    uint8_t *used = PyMem_RawCalloc(t->nmetrics ? t->nmetrics : 1, 1);
    if (used == NULL) {
        PyErr_NoMemory();
        return -1;
    }
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
            return -1;
        }
        Py_CLEAR(m->obj);
        Py_CLEAR(m->pairs);
        if (append_new(t->free_metrics, PyLong_FromUnsignedLong(i)) < 0) {
            PyMem_RawFree(used);
            return -1;
        }
    }
    PyMem_RawFree(used);
    return n_dead;
}

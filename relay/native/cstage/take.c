/* relay.native._cstage.take: DestinationStage.take's loop over one request's series for one destination.
 *
 * Reference: relay/state/stage.py, DestinationStage.take: drops, sent series (owner and limiter
 * checks), sharding into queue pieces. The rare branches (aggregated members, limiter admission of a
 * series not yet contained, collisions, owner changes) call back into the Python stage so they stay
 * the reference's. Any input of an unusual shape makes take() answer NotImplemented before any side
 * effect: the caller runs the reference.
 */
#include "pieces.h"

/* a kept series, for the out tracker after the loop */
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

static inline PyObject *input_decision(PyObject *inputs, Py_ssize_t j) {
    return PyTuple_GET_ITEM(PyList_GET_ITEM(inputs, j), 0);
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

static int seen_push(SeenList *seen, uint64_t id, PyObject *metric, const Lb *l) {
    if (room_for_one((void **)&seen->s, seen->n, &seen->cap, sizeof(Seen), 256) < 0)
        return -1;
    seen->s[seen->n++] = (Seen){id, metric, *l};
    return 0;
}

/* new_in (a set of indexes) as flags; -1 with an exception, 0 unusual (a non-int in it), 1 done */
static int new_flags(PyObject *new_in, uint8_t *is_new, Py_ssize_t n) {
    if (!PySet_GET_SIZE(new_in))
        return 1;
    int unusual = 0;
    PyObject *it = PyObject_GetIter(new_in), *x;
    if (it == NULL)
        return -1;
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
        return -1;
    return !unusual;
}

PyObject *take(PyObject *module, PyObject *args) {
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
    PyObject *sid = NULL, *result = NULL;
    uint8_t *is_new = NULL;
    Shards sh = {NULL, NULL, NULL, 0};
    Drops drops = {NULL, 0, 0};
    SeenList seen = {NULL, 0, 0, labels_of};
    int64_t kept = 0, routed = 0;

    /* Entries are checked as the loop reaches them; before the first call back into Python (an
     * effect) every later entry is checked too: anything unusual goes to the reference, before any
     * effect. */
    is_new = PyMem_RawCalloc((size_t)(n ? n : 1), 1);
    if (is_new == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int flags = new_flags(new_in, is_new, n);
    if (flags < 0)
        goto fail;
    if (flags == 0)
        goto not_implemented;

    shards_o = PyObject_GetAttrString(stage, "shards");
    if (shards_o == NULL)
        goto fail;
    Py_ssize_t shards = PyLong_AsSsize_t(shards_o);
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
    if (shards_alloc(&sh, shards) < 0)
        goto fail;

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
        Lb *l = &lbv;
        if (!check_entry(entries, inputs, j, e, l)) {
            if (checked) { /* (cannot be: checked before the first effect) */
                PyErr_SetString(PyExc_SystemError, "take: an entry changed under the loop");
                goto fail;
            }
            goto not_implemented;
        }
        PyObject *en = PyList_GET_ITEM(entries, j);
        PyObject *metric = PyTuple_GET_ITEM(PyTuple_GET_ITEM(en, 0), 2);
        routed += e->n;
        if (e->kind == K_DROP) { /* the metric slot holds the reason */
            if (drops_add(&drops, metric, e->n, is_new[j]) < 0)
                goto fail;
            continue;
        }
        PyObject *in_id = PyTuple_GET_ITEM(input_decision(inputs, j), 1);
        if (e->kind == K_AGG) {
            BEFORE_EFFECT();
            if (aggregate_call(stage, en, in_id, &drops) < 0)
                goto fail;
            continue;
        }
        /* a series sent: its output's owner first */
        int ok = owner_known(owners_dict, e, in_id, &sid);
        if (ok == 0) {
            BEFORE_EFFECT();
            ok = owner_call(stage, owners, e, sid, in_id, in_active, &contains_fn);
        }
        Py_CLEAR(sid);
        if (ok < 0)
            goto fail;
        if (!ok) {
            BEFORE_EFFECT();
            if (drops_add(&drops, S_collision, e->n, is_new[j]) < 0 || collided_call(stage, l) < 0)
                goto fail;
            continue;
        }
        if (limiter == Py_None || tracker_contains(tracker, e->low, gen)) {
            if (seen_push(&seen, e->low, metric, l) < 0)
                goto fail;
        } else {
            BEFORE_EFFECT();
            int admitted = admit_call(stage, e, metric, l, labels_of);
            if (admitted < 0)
                goto fail;
            if (!admitted) {
                if (drops_add(&drops, S_series_limit, e->n, 0) < 0)
                    goto fail;
                continue;
            }
        }
        Py_ssize_t shard = (Py_ssize_t)(e->low % (uint64_t)shards);
        PyObject *rest = PyTuple_GET_ITEM(en, 1);
        size_t size = (size_t)(lb_len(l) + PyBytes_GET_SIZE(rest));
        char *p = buf_entry(&sh.bufs[shard], size); /* one WriteRequest field-1 entry: labels, rest */
        if (p == NULL)
            goto fail;
        lb_write(l, p);
        memcpy(p + lb_len(l), PyBytes_AS_STRING(rest), (size_t)PyBytes_GET_SIZE(rest));
        sh.bufs[shard].len += size;
        shards_note(&sh, shard, e->n, e->ts);
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
    result = stage_result(&sh, &drops, kept, routed);
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
    Py_XDECREF(sid);
    shards_free(&sh);
    PyMem_RawFree(is_new);
    PyMem_RawFree(drops.d);
    PyMem_RawFree(seen.s);
    return result;
}

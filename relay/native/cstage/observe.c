/* relay.native._cstage: the tracker's observe passes, over any source of items.
 *
 * Reference: relay/state/series_tracker.py, SeriesTracker.observe, observe_batch and observe_many;
 * observe_source is also take()'s and route_hits' out tracker pass (the same effects in the same order).
 */
#include "cstage.h"

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
PyObject *observe_source(TrackerObject *t, ItemSource *src, int64_t gen) {
    int64_t wslots = t->wslots, due = wslots / 2;
    PyObject *new = PyList_New(0);
    if (new == NULL)
        return NULL;
    if (src->ahead && t->series.cap)
        for (Py_ssize_t i = 0; i < src->n && i < OBSERVE_AHEAD; i++) {
            uint64_t id;
            PyObject *metric;
            src->get(src, i, &id, &metric);
            __builtin_prefetch(&t12_entries(&t->series)[t12_home(&t->series, id)]);
        }
    for (Py_ssize_t i = 0; i < src->n; i++) {
        uint64_t id;
        PyObject *metric;
        if (src->ahead && t->series.cap && i + OBSERVE_AHEAD < src->n) {
            src->get(src, i + OBSERVE_AHEAD, &id, &metric);
            __builtin_prefetch(&t12_entries(&t->series)[t12_home(&t->series, id)]);
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
        if (append_new(new, PyLong_FromSsize_t(i)) < 0)
            goto fail;
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

PyObject *Tracker_observe_batch(TrackerObject *t, PyObject *args) {
    return observe_sequence(t, args, "OOL:observe_batch", "items must be a sequence", items_get, items_labels);
}

PyObject *Tracker_observe_inputs(TrackerObject *t, PyObject *args) {
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

PyObject *Tracker_observe(TrackerObject *t, PyObject *args) {
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

PyObject *Tracker_observe_many(TrackerObject *t, PyObject *args) {
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


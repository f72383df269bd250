/* relay.native._cstage.Tracker: the tracker as a Python type (relay.state CSeriesTracker wraps it).
 *
 * Reference: relay/state/series_tracker.py, SeriesTracker (PySeriesTracker): CSeriesTracker
 * answers each of its methods from these (observe*, contains, has, expire, the counts).
 */
#include "cstage.h"

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

static PyObject *Tracker_lookup(TrackerObject *t, PyObject *sid) {
    uint64_t id;
    if (!try_u64(sid, &id))
        Py_RETURN_NONE;
    Slot *s = series_slot(t, id);
    if (s == NULL)
        Py_RETURN_NONE;
    return Py_BuildValue("(OLL)", t->metrics[s->metric].obj, (long long)s->gen, (long long)s->lgen);
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

static Py_ssize_t Tracker_len(TrackerObject *t) { return (Py_ssize_t)tbl_size(&t->series); }

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
        if (append_new(out, Py_BuildValue("(OL)", m->obj, (long long)m->count)) < 0) {
            Py_DECREF(out);
            return NULL;
        }
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
        if (append_new(out, Py_BuildValue("(OOn)", t->metrics[p->metric].obj, p->name,
                                          (Py_ssize_t)tbl_size(&p->values))) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* SeriesTracker.expire with the cutoff generation; how many series left */
static PyObject *Tracker_expire(TrackerObject *t, PyObject *arg) {
    long long cutoff = PyLong_AsLongLong(arg);
    if (cutoff == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = tracker_expire(t, cutoff);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *Tracker_label_union(TrackerObject *t, PyObject *unused) { return tracker_label_union(t); }

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

PyTypeObject TrackerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "relay.native._cstage.Tracker",
    .tp_basicsize = sizeof(TrackerObject),
    .tp_dealloc = (destructor)Tracker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SeriesTracker's state in C tables (relay.state CSeriesTracker wraps it)",
    .tp_methods = Tracker_methods,
    .tp_as_sequence = &Tracker_as_sequence,
    .tp_new = Tracker_new,
};

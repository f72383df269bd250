/* relay.native._cstage: the tracker's label statistics (values noted, swept, counted).
 *
 * Reference: relay/state/series_tracker.py, SeriesTracker._note_labels, _expire_values and the
 * counts top_labels makes: per (metric, label name) one T8 table 48-bit value hash -> generation mod 2^16.
 */
#include "cstage.h"

int unpack_pair(PyObject *item, PyObject **name, PyObject **value) {
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
int note_labels(TrackerObject *t, uint32_t m, PyObject *labels, int64_t gen) {
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
            vals->zero = g;
            continue;
        }
        uint64_t *slot = key ? t8_find(vals, key) : NULL;
        if (slot != NULL)
            *slot = key << 16 | g;
        else if ((Py_ssize_t)tbl_size(vals) < t->max_values && t8_add(vals, key, g) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* SeriesTracker.label_union: label name -> distinct values over every metric (names with none left out) */
PyObject *tracker_label_union(TrackerObject *t) {
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
        if (append_new(lst, PyLong_FromUnsignedLong(i)) < 0)
            goto fail;
    }
    PyObject *name, *lst;
    Py_ssize_t pos = 0;
    while (PyDict_Next(groups, &pos, &name, &lst)) {
        size_t total = 0;
        Py_ssize_t k = PyList_GET_SIZE(lst);
        for (Py_ssize_t j = 0; j < k; j++)
            total += tbl_size(&t->pairs[PyLong_AsUnsignedLong(PyList_GET_ITEM(lst, j))].values);
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
                const uint64_t *e = t8_entries(v);
                for (size_t b = 0; b < v->cap; b++)
                    if (e[b] != 0)
                        buf[m++] = vkey(e[b]);
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

static int value_dead(uint32_t g, void *ctx) {
    ExpireCtx *c = ctx;
    return value_gen(c->t, (uint16_t)g) < c->cutoff;
}

static int free_pair(TrackerObject *t, uint32_t i) {
    Pair *p = &t->pairs[i];
    PyObject *d = t->metrics[p->metric].pairs;
    if (d != NULL && PyDict_DelItem(d, p->name) < 0)
        return -1;
    Py_CLEAR(p->name);
    t8_free(&p->values);
    p->exists = 0;
    return append_new(t->free_pairs, PyLong_FromUnsignedLong(i));
}

/* label values last supplied before cutoff leave, then pairs left without any (SeriesTracker.
 * _expire_values); vbase moves up to the cutoff */
int values_sweep(TrackerObject *t, int64_t cutoff) {
    ExpireCtx ctx = {t, cutoff};
    for (uint32_t i = 0; i < t->npairs; i++) {
        Pair *p = &t->pairs[i];
        if (p->name == NULL)
            continue;
        if (t8_remove_if(&p->values, value_dead, &ctx) < 0)
            return -1;
        if (tbl_size(&p->values) == 0 && free_pair(t, i) < 0)
            return -1;
    }
    if (cutoff > t->vbase)
        t->vbase = cutoff;
    return 0;
}

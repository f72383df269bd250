/* relay.native._cstage.Table: the T12 table alone as a Python type, for the tables' own tests.
 *
 * Reference: a Python dict int -> int (tests/relay/native/test_native_cstage.py holds the two
 * side by side); the table itself is table.c.
 */
#include "cstage.h"

typedef struct {
    PyObject_HEAD
    T12 t;
} TableObject;

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
    E12 *e = t12_entries(t);
    for (size_t i = 0; i <= t->cap; i++) {
        uint64_t k;
        uint32_t v;
        if (i == t->cap) {
            if (!t->has_zero)
                break;
            k = 0;
            v = t->zero;
        } else {
            if (ekey(&e[i]) == 0)
                continue;
            k = ekey(&e[i]);
            v = e[i].v;
        }
        if (append_new(out, Py_BuildValue("(KI)", (unsigned long long)k, (unsigned int)v)) < 0) {
            Py_DECREF(out);
            return NULL;
        }
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
    E12 *e = t12_entries(t);
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (ekey(&e[i]) == 0)
            continue;
        n++;
        if (t12_find(t, ekey(&e[i])) != &e[i].v) {
            PyErr_SetString(PyExc_AssertionError, "a key is not found where it lies");
            return NULL;
        }
    }
    if (n != t->n) {
        PyErr_SetString(PyExc_AssertionError, "the count does not match the buckets");
        return NULL;
    }
    if (t->cap && !tbl_fits(t->n, t->cap)) {
        PyErr_SetString(PyExc_AssertionError, "over the load limit");
        return NULL;
    }
    Py_RETURN_NONE;
}

static Py_ssize_t Table_len(TableObject *self) { return (Py_ssize_t)tbl_size(&self->t); }

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

PyTypeObject TableType = {
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

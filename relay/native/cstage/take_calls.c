/* relay.native._cstage: take()'s calls back into the Python stage, for the rare branches.
 *
 * Reference: relay/state/stage.py, DestinationStage._aggregate, _collided and _admit, and
 * relay/state/limits.py's CollisionOwners.claim and .unchanged: take() calls them where the
 * reference's take would, so that what they decide stays the reference's.
 */
#include "pieces.h"

PyObject *lb_bytes(const Lb *lb) {
    if (lb->whole != NULL)
        return Py_NewRef(lb->whole);
    PyObject *out = PyBytes_FromStringAndSize(NULL, lb_len(lb));
    if (out != NULL)
        lb_write(lb, PyBytes_AS_STRING(out));
    return out;
}

static PyObject *call_method(PyObject *obj, const char *name, PyObject *const *args, size_t n) {
    PyObject *m = PyObject_GetAttrString(obj, name);
    if (m == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(m, args, n, NULL);
    Py_DECREF(m);
    return r;
}

/* stage._aggregate(decision, rest, n, in_id) for entry en, its counts added to the drops; -1 with an exception */
int aggregate_call(PyObject *stage, PyObject *en, PyObject *in_id, Drops *drops) {
    PyObject *argv[] = {PyTuple_GET_ITEM(en, 0), PyTuple_GET_ITEM(en, 1), PyTuple_GET_ITEM(en, 2), in_id};
    PyObject *r = call_method(stage, "_aggregate", argv, 4);
    if (r == NULL)
        return -1;
    int64_t a, t, h;
    int ok = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 3 && get_i64(PyTuple_GET_ITEM(r, 0), &a)
             && get_i64(PyTuple_GET_ITEM(r, 1), &t) && get_i64(PyTuple_GET_ITEM(r, 2), &h);
    Py_DECREF(r);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "DestinationStage._aggregate must return three ints");
        return -1;
    }
    if ((a && drops_add(drops, S_aggregated, a, 0) < 0) || (t && drops_add(drops, S_too_far, t, 0) < 0)
        || (h > 0 && drops_add(drops, S_agg_histogram, h, 0) < 0))
        return -1;
    return 0;
}

/* Whether input in_id may send to e's output as the owners dict stands, with no call: 1 yes, 0 the
 * reference decides (owner_call), -1 error. *sid: the output id as an int where it was needed. */
int owner_known(PyObject *owners_dict, const Entry *e, PyObject *in_id, PyObject **sid) {
    int claim = (int)(e->high & 1);
    if (!claim && PyDict_GET_SIZE(owners_dict) == 0)
        return 1;
    *sid = PyLong_FromUnsignedLongLong(e->low);
    if (*sid == NULL)
        return -1;
    PyObject *owner = PyDict_GetItemWithError(owners_dict, *sid);
    if (owner == NULL)
        return PyErr_Occurred() ? -1 : !claim; /* unchanged(): no owner, the series is its output's */
    return PyObject_RichCompareBool(owner, in_id, Py_EQ);
}

/* A change of owner, or a refusal: the reference's owners.claim(sid, in_id, in_active,
 * stage.stats.tracker_out.contains) or owners.unchanged(sid, in_id, in_active); 1 sent, 0 not, -1 error. */
int owner_call(PyObject *stage, PyObject *owners, const Entry *e, PyObject *sid, PyObject *in_id,
                      PyObject *in_active, PyObject **contains_fn) {
    PyObject *r;
    if (e->high & 1) {
        if (*contains_fn == NULL) {
            PyObject *stats = PyObject_GetAttrString(stage, "stats");
            PyObject *tr = stats ? PyObject_GetAttrString(stats, "tracker_out") : NULL;
            Py_XDECREF(stats);
            *contains_fn = tr ? PyObject_GetAttrString(tr, "contains") : NULL;
            Py_XDECREF(tr);
            if (*contains_fn == NULL)
                return -1;
        }
        PyObject *argv[] = {sid, in_id, in_active, *contains_fn};
        r = call_method(owners, "claim", argv, 4);
    } else {
        PyObject *argv[] = {sid, in_id, in_active};
        r = call_method(owners, "unchanged", argv, 3);
    }
    if (r == NULL)
        return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

/* stage._collided(label bytes); -1 with an exception */
int collided_call(PyObject *stage, const Lb *l) {
    PyObject *lb = lb_bytes(l);
    if (lb == NULL)
        return -1;
    PyObject *argv[] = {lb};
    PyObject *r = call_method(stage, "_collided", argv, 1);
    Py_DECREF(lb);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* stage._admit(id, metric, label bytes, labels_of): 1 admitted, 0 not, -1 error */
int admit_call(PyObject *stage, const Entry *e, PyObject *metric, const Lb *l, PyObject *labels_of) {
    PyObject *sid = PyLong_FromUnsignedLongLong(e->low);
    PyObject *lb = sid ? lb_bytes(l) : NULL;
    if (lb == NULL) {
        Py_XDECREF(sid);
        return -1;
    }
    PyObject *argv[] = {sid, metric, lb, labels_of};
    PyObject *r = call_method(stage, "_admit", argv, 4);
    Py_DECREF(sid);
    Py_DECREF(lb);
    if (r == NULL)
        return -1;
    int admitted = PyObject_IsTrue(r);
    Py_DECREF(r);
    return admitted;
}

/* relay.native._cstage: route_hits' view of a request of cache hits (hits, their decisions, owners).
 *
 * Reference: relay/state/pipeline.py, Pipeline.route with relay/ingest/wire.py's route loop and
 * relay/state/stage.py's DestinationStage.take, for a request whose every series is a hit in the
 * decision cache (relay/native/cdcache.c's packed entries, read in place).
 */
#include "hits.h"

const fp_wire_api *wire_api;
const fp_table_api *table_api;
Py_ssize_t n_hit_series, n_hit_requests;

/* capsule `name` of module `module`, checked for this header's API version (its first int) */
static const void *import_api(const char *name, const char *module) {
    const int *api = PyCapsule_Import(name, 0);
    if (api != NULL && *api != FP_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "%s: another fast path API version", module);
        return NULL;
    }
    return api;
}

int load_apis(void) {
    if (wire_api == NULL && (wire_api = import_api("relay.native._cwire._parse_api", "relay.native._cwire")) == NULL)
        return -1;
    if (table_api == NULL
        && (table_api = import_api("relay.native._cdcache._table_api", "relay.native._cdcache")) == NULL)
        return -1;
    return 0;
}

int hits_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric) {
    HitCtx *c = src->ctx;
    *id = c->hits[i].in_id;
    *metric = c->hits[i].metric_in;
    return 0;
}

PyObject *hits_labels(ItemSource *src, Py_ssize_t i) {
    HitCtx *c = src->ctx;
    const Hit *h = &c->hits[i];
    PyObject *key = PyBytes_FromStringAndSize((const char *)c->b + h->key_start, h->key_end - h->key_start);
    if (key == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(c->labels_of, key);
    Py_DECREF(key);
    return r;
}

int kept_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric) {
    HitCtx *c = src->ctx;
    const HitDest *d = &c->dests[c->seen[i] * c->nd + c->dest];
    *id = d->low;
    *metric = d->obj;
    return 0;
}

PyObject *kept_labels(ItemSource *src, Py_ssize_t i) {
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
int hit_dest(PyObject *table, const uint8_t *b, const Hit *h, const uint64_t *w, HitDest *d) {
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
int owner_ok(PyObject *owners, const HitDest *d, uint64_t in_id) {
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

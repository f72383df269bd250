/* relay.native._cstage: a destination's pieces: drops by reason, shard buffers, the result tuple.
 *
 * Reference: relay/state/stage.py, DestinationStage.take (its drops Counter, its per-shard
 * bytearrays and the StageResult it returns); shared by take.c and route.c.
 */
#include "pieces.h"

PyObject *S_aggregated, *S_too_far, *S_agg_histogram, *S_collision, *S_series_limit;

int drops_add(Drops *ds, PyObject *reason, int64_t samples, int series) {
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
    if (room_for_one((void **)&ds->d, ds->n, &ds->cap, sizeof(Drop), 8) < 0)
        return -1;
    i = ds->n++;
    ds->d[i].reason = reason;
    ds->d[i].samples = ds->d[i].series = 0;
found:
    ds->d[i].samples += samples;
    ds->d[i].series += series;
    return 0;
}

/* buf_reserve's slow path: the buffer doubled (from 16 KiB) until `more` bytes fit */
int buf_grow(Buf *b, size_t more) {
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
int buf_presize(Buf *b, size_t n) {
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

int shards_alloc(Shards *s, Py_ssize_t shards) {
    s->shards = shards;
    s->bufs = PyMem_RawCalloc((size_t)shards, sizeof(Buf));
    s->counts = PyMem_RawCalloc((size_t)shards, sizeof(int64_t));
    s->oldest = PyMem_RawCalloc((size_t)shards, sizeof(int64_t));
    if (s->bufs == NULL || s->counts == NULL || s->oldest == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void shards_free(Shards *s) {
    if (s->bufs != NULL)
        for (Py_ssize_t i = 0; i < s->shards; i++)
            Py_XDECREF(s->bufs[i].bytes);
    PyMem_RawFree(s->bufs);
    PyMem_RawFree(s->counts);
    PyMem_RawFree(s->oldest);
    *s = (Shards){NULL, NULL, NULL, 0};
}

PyObject *stage_result(Shards *sh, const Drops *drops, int64_t kept, int64_t routed) {
    Buf *bufs = sh->bufs;
    const int64_t *counts = sh->counts, *oldest = sh->oldest;
    Py_ssize_t shards = sh->shards;
    PyObject *pieces = PyList_New(0), *drops_out = PyList_New(0), *result = NULL;
    if (pieces == NULL || drops_out == NULL)
        goto done;
    for (Py_ssize_t s = 0; s < shards; s++) {
        if (!counts[s])
            continue;
        if (_PyBytes_Resize(&bufs[s].bytes, (Py_ssize_t)bufs[s].len) < 0)
            goto done;
        if (append_new(pieces, Py_BuildValue("(nOLL)", s, bufs[s].bytes, (long long)counts[s], (long long)oldest[s])) < 0)
            goto done;
    }
    for (Py_ssize_t i = 0; i < drops->n; i++) {
        if (append_new(drops_out, Py_BuildValue("(OLL)", drops->d[i].reason, (long long)drops->d[i].samples,
                                                (long long)drops->d[i].series)) < 0)
            goto done;
    }
    result = Py_BuildValue("(OLLO)", pieces, (long long)kept, (long long)routed, drops_out);
done:
    Py_XDECREF(pieces);
    Py_XDECREF(drops_out);
    return result;
}

/* route_hits' private types (hits.c, route.c): a request's hits, their decisions per destination.
 *
 * Reference: the tuples relay/ingest/wire.py's route loop makes for the same series (entries,
 * inputs) and the decisions relay/state/decide.py computes, read from relay/native/cdcache.c's
 * packed entries in place.
 */
#ifndef GPU_RELAY_CSTAGE_HITS_H
#define GPU_RELAY_CSTAGE_HITS_H

#include "pieces.h"

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
    HitDest *dests; /* nh x nd: hit i's decision for destination j at i * nd + j */
    Py_ssize_t nh; /* hits */
    Py_ssize_t nd; /* destinations */
    Py_ssize_t dest; /* the destination whose seen list is observed */
    Py_ssize_t *seen; /* item indexes of its kept series */
    PyObject *labels_of;
} HitCtx;

typedef struct {
    Py_ssize_t shards;
    int limited;
    PyObject *owners;   /* borrowed (the stages tuple holds it) */
    TrackerObject *tracker;
    int64_t gen;
} HitStage;

extern const fp_wire_api *wire_api;
extern const fp_table_api *table_api;
extern Py_ssize_t n_hit_series, n_hit_requests;

int load_apis(void); /* relay.native._cwire's and _cdcache's capsules; -1 with ImportError */

/* The output label bytes of destination d of hit h: written to out (room for hit_lb_len). */
static inline Py_ssize_t hit_lb_len(const Hit *h, const HitDest *d) {
    return d->lb_len + (d->high > 1 ? h->key_end - h->key_start : 0);
}

static inline void hit_lb_write(const uint8_t *b, const Hit *h, const HitDest *d, char *out) {
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

/* ItemSources over the hits (the in tracker) and over one destination's kept series (its out tracker) */
int hits_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric);
PyObject *hits_labels(ItemSource *src, Py_ssize_t i);
int kept_get(ItemSource *src, Py_ssize_t i, uint64_t *id, PyObject **metric);
PyObject *kept_labels(ItemSource *src, Py_ssize_t i);

/* Destination word w of an entry for hit h into *d (references taken); 1, or 0: not for this path. */
int hit_dest(PyObject *table, const uint8_t *b, const Hit *h, const uint64_t *w, HitDest *d);
/* the owner of out id `low` (a dict int -> int) lets input `in_id` send it without a call into the
   reference's CollisionOwners: 1 yes, 0 the reference must decide, -1 error */
int owner_ok(PyObject *owners, const HitDest *d, uint64_t in_id);

#endif /* GPU_RELAY_CSTAGE_HITS_H */

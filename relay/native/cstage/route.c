/* relay.native._cstage.route_hits: a request whose every series is a cache hit, without Python objects per series.
 *
 * Reference: relay/state/pipeline.py, Pipeline.route (its usual path: relay/ingest/wire.py's route
 * loop, the decision cache, the in tracker's observe_inputs and per destination
 * relay/state/stage.py's DestinationStage.take), in one call for the steady state: the route loop
 * (its pass 1 from relay.native._cwire), the decision cache lookups (relay.native._cdcache's packed
 * entries, read in place: no decision tuples, key or rest bytes), the in tracker's observe_inputs,
 * and per destination take()'s drops, owner and limit checks, out tracker and queue pieces. Pass 1
 * reads the request and every decision and checks everything the reference might do otherwise, with
 * no side effect: any miss (decide() would run), a decision of another kind (aggregated, stored
 * whole, None for a destination), an owner that is not the series' own, a series a limiter has not
 * admitted yet answer NotImplemented, and Pipeline.route runs its usual path on the whole request.
 * Pass 2 then has the reference's effects in the reference's order (the same observe_source for the
 * trackers).
 */
#include "hits.h"

/* Pass 2 for destination j of the hits in ctx: take()'s drops, pieces and out tracker; its
   stage_result, a new reference or NULL. */
static PyObject *route_dest(HitCtx *ctx, const HitStage *st, Py_ssize_t j, const uint8_t *is_new, Py_ssize_t *seen,
                            Drops *drops) {
    const uint8_t *b = ctx->b;
    Py_ssize_t nh = ctx->nh, nd = ctx->nd, shards = st->shards, nseen = 0;
    int64_t kept = 0, routed = 0;
    PyObject *result = NULL;
    Shards sh = {NULL, NULL, NULL, 0};
    if (shards_alloc(&sh, shards) < 0)
        goto done;
    /* each shard's piece sized once, to what it will hold: growing it by doubling copied a
       pass-through request's output about twice over (its tag, up to 10 length bytes, the entry) */
    for (Py_ssize_t i = 0; i < nh; i++) {
        const Hit *h = &ctx->hits[i];
        const HitDest *d = &ctx->dests[i * nd + j];
        if (d->kind != K_DROP)
            sh.counts[d->low % (uint64_t)shards] += (int64_t)(11 + hit_lb_len(h, d) + (h->rest_end - h->rest_start));
    }
    for (Py_ssize_t s = 0; s < shards; s++) {
        if (sh.counts[s] && buf_presize(&sh.bufs[s], (size_t)sh.counts[s]) < 0)
            goto done;
        sh.counts[s] = 0;
    }
    for (Py_ssize_t i = 0; i < nh; i++) {
        const Hit *h = &ctx->hits[i];
        const HitDest *d = &ctx->dests[i * nd + j];
        routed += h->n;
        if (d->kind == K_DROP) {
            if (drops_add(drops, d->obj, h->n, is_new[i]) < 0)
                goto done;
            continue;
        }
        seen[nseen++] = i;
        Py_ssize_t shard = (Py_ssize_t)(d->low % (uint64_t)shards);
        Py_ssize_t lbn = hit_lb_len(h, d), rn = h->rest_end - h->rest_start;
        char *p = buf_entry(&sh.bufs[shard], (size_t)(lbn + rn)); /* one WriteRequest field-1 entry */
        if (p == NULL)
            goto done;
        hit_lb_write(b, h, d, p);
        memcpy(p + lbn, b + h->rest_start, (size_t)rn);
        sh.bufs[shard].len += (size_t)(lbn + rn);
        shards_note(&sh, shard, h->n, h->ts);
        kept += h->n;
    }
    if (nseen) {
        ctx->dest = j;
        ctx->seen = seen;
        ItemSource src = {nseen, kept_get, kept_labels, ctx, NULL, ctx->labels_of, 1};
        PyObject *r = observe_source(st->tracker, &src, st->gen);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    result = stage_result(&sh, drops, kept, routed);
done:
    shards_free(&sh);
    return result;
}

PyObject *route_hits(PyObject *module, PyObject *args) {
    PyObject *body, *table, *tracker_obj, *stages_arg, *labels_of;
    long long gen_in;
    if (!PyArg_ParseTuple(args, "SOO!LOO:route_hits", &body, &table, &TrackerType, &tracker_obj, &gen_in,
                          &stages_arg, &labels_of))
        return NULL;
    if (load_apis() < 0)
        return NULL;
    if (!PyBytes_CheckExact(body) || Py_TYPE(table) != table_api->type || !PyTuple_CheckExact(stages_arg))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t nd = PyTuple_GET_SIZE(stages_arg);
    if (nd < 1 || table_api->width(table) != nd + 1)
        Py_RETURN_NOTIMPLEMENTED;
    const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(body);
    size_t dw = table_api->dest_words(table);
    fp_items it;
    int ok = wire_api->parse(b, PyBytes_GET_SIZE(body), &it);
    if (ok <= 0) {
        wire_api->items_free(&it);
        if (ok < 0)
            return PyErr_NoMemory();
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result = NULL, *metadata = NULL, *per_stage = NULL, *new_in = NULL;
    HitStage *st = NULL;
    Hit *hits = NULL;
    HitDest *dests = NULL;
    uint64_t (*hk)[2] = NULL; /* each item's key hash */
    uint8_t *is_new = NULL;
    Py_ssize_t *seen = NULL;
    Drops drops = {NULL, 0, 0};
    Py_ssize_t nh = 0; /* hits filled in (their references held) */
    Py_ssize_t series = 0, samples = 0, histograms = 0, exemplars = 0;

    st = PyMem_RawCalloc((size_t)nd, sizeof(HitStage));
    hits = PyMem_RawMalloc(sizeof(Hit) * (size_t)(it.len ? it.len : 1));
    dests = PyMem_RawCalloc((size_t)(it.len ? it.len : 1) * (size_t)nd, sizeof(HitDest));
    if (st == NULL || hits == NULL || dests == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t j = 0; j < nd; j++) { /* (shards, limited, owners dict, tracker, gen) */
        PyObject *s = PyTuple_GET_ITEM(stages_arg, j);
        if (!PyTuple_CheckExact(s) || PyTuple_GET_SIZE(s) != 5 || !PyDict_CheckExact(PyTuple_GET_ITEM(s, 2))
            || Py_TYPE(PyTuple_GET_ITEM(s, 3)) != &TrackerType || PyTuple_GET_ITEM(s, 3) == tracker_obj)
            goto not_implemented;
        int64_t shards, gen;
        if (!get_i64(PyTuple_GET_ITEM(s, 0), &shards) || shards <= 0 || !get_i64(PyTuple_GET_ITEM(s, 4), &gen))
            goto not_implemented;
        int limited = PyObject_IsTrue(PyTuple_GET_ITEM(s, 1));
        if (limited < 0)
            goto fail;
        st[j] = (HitStage){(Py_ssize_t)shards, limited, PyTuple_GET_ITEM(s, 2),
                           (TrackerObject *)PyTuple_GET_ITEM(s, 3), gen};
    }

    /* every series' key hashed, its index slot then its entry prefetched: the lookups below find
       them in the cache instead of waiting on memory one after the other */
    hk = PyMem_RawMalloc(sizeof(*hk) * (size_t)(it.len ? it.len : 1));
    if (hk == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t pending = -1; /* keys are hashed two at a time */
    for (Py_ssize_t i = 0; i < it.len; i++) {
        const fp_item *r = &it.items[i];
        if (r->metadata)
            continue;
        if (pending < 0) {
            pending = i;
            continue;
        }
        const fp_item *q = &it.items[pending];
        table_api->hash2(b + q->start, (size_t)(q->key_end - q->start), hk[pending], b + r->start,
                         (size_t)(r->key_end - r->start), hk[i]);
        table_api->prefetch(table, hk[pending], 0);
        table_api->prefetch(table, hk[i], 0);
        pending = -1;
    }
    if (pending >= 0) {
        const fp_item *q = &it.items[pending];
        table_api->hash(b + q->start, (size_t)(q->key_end - q->start), hk[pending]);
        table_api->prefetch(table, hk[pending], 0);
    }
    for (Py_ssize_t i = 0; i < it.len; i++)
        if (!it.items[i].metadata)
            table_api->prefetch(table, hk[i], 1);

    /* pass 1: every lookup as the reference's loop makes them (its one-sample guess included) */
    fp_guess guess = {0, 0, 0};
    for (Py_ssize_t i = 0; i < it.len; i++) {
        const fp_item *r = &it.items[i];
        if (r->metadata)
            continue;
        const uint64_t *e = NULL;
        Hit h;
        Py_ssize_t g = fp_guess_split(&guess, b, r);
        if (g >= 0) {
            e = g == r->key_end ? table_api->find(table, hk[i])
                                : table_api->lookup(table, b + r->start, (size_t)(g - r->start));
            if (e != NULL) {
                series++;
                samples++;
                h = (Hit){r->start, g, g, r->end, 1, guess.ts, 0, NULL};
            }
        }
        if (e == NULL) {
            fp_guess_note(&guess, r);
            series++;
            samples += r->ns;
            exemplars += r->ne;
            histograms += r->nh;
            e = table_api->find(table, hk[i]); /* the key [start, key_end) */
            if (e == NULL)
                goto not_implemented; /* a miss: decide() runs on the usual path */
            h = (Hit){r->start, r->key_end, r->key_end, r->end, r->ns + r->nh, r->oldest, 0, NULL};
        }
        if (e[3] & FP_WHOLE)
            goto not_implemented;
        h.in_id = e[2];
        HitDest *hd = &dests[nh * nd];
        for (Py_ssize_t j = 0; j < nd; j++) {
            uint64_t w[3];
            fp_dest(e, dw, (size_t)j, w);
            if (!hit_dest(table, b, &h, w, &hd[j])) {
                for (Py_ssize_t k = 0; k < j; k++) {
                    Py_CLEAR(hd[k].obj);
                    Py_CLEAR(hd[k].lbobj);
                }
                goto not_implemented;
            }
        }
        h.metric_in = Py_NewRef((PyObject *)(uintptr_t)e[3]);
        hits[nh++] = h;
    }
    /* ... and every owner and limiter check (nothing has changed them yet) */
    for (Py_ssize_t i = 0; i < nh; i++)
        for (Py_ssize_t j = 0; j < nd; j++) {
            const HitDest *d = &dests[i * nd + j];
            if (d->kind != K_SENT)
                continue;
            int o = owner_ok(st[j].owners, d, hits[i].in_id);
            if (o < 0)
                goto fail;
            if (!o || (st[j].limited && !tracker_contains(st[j].tracker, d->low, st[j].gen)))
                goto not_implemented;
        }

    /* pass 2: the in tracker, then each destination, as Pipeline.route calls them */
    HitCtx ctx = {b, hits, dests, nh, nd, 0, NULL, labels_of};
    ItemSource in_src = {nh, hits_get, hits_labels, &ctx, NULL, labels_of, 1};
    new_in = observe_source((TrackerObject *)tracker_obj, &in_src, gen_in);
    if (new_in == NULL)
        goto fail;
    is_new = PyMem_RawCalloc((size_t)(nh ? nh : 1), 1);
    seen = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(nh ? nh : 1));
    if (is_new == NULL || seen == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(new_in); k++) {
        Py_ssize_t x = PyLong_AsSsize_t(PyList_GET_ITEM(new_in, k));
        if (x >= 0 && x < nh)
            is_new[x] = 1;
    }
    per_stage = PyList_New(0);
    if (per_stage == NULL)
        goto fail;
    for (Py_ssize_t j = 0; j < nd; j++) {
        drops.n = 0;
        if (append_new(per_stage, route_dest(&ctx, &st[j], j, is_new, seen, &drops)) < 0)
            goto fail;
    }
    metadata = PyList_New(0);
    if (metadata == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < it.len; i++) {
        const fp_item *r = &it.items[i];
        if (!r->metadata)
            continue;
        if (append_new(metadata, PyBytes_FromStringAndSize((const char *)b + r->start, r->end - r->start)) < 0)
            goto fail;
    }
    result = Py_BuildValue("(nnnnOO)", series, samples, histograms, exemplars, metadata, per_stage);
    if (result != NULL) {
        n_hit_series += nh;
        n_hit_requests++;
    }
    goto done;
not_implemented:
    result = Py_NewRef(Py_NotImplemented);
    goto done;
fail:
    result = NULL;
done:
    for (Py_ssize_t i = 0; i < nh; i++) {
        Py_DECREF(hits[i].metric_in);
        for (Py_ssize_t j = 0; j < nd; j++) {
            Py_XDECREF(dests[i * nd + j].obj);
            Py_XDECREF(dests[i * nd + j].lbobj);
        }
    }
    PyMem_RawFree(drops.d);
    PyMem_RawFree(is_new);
    PyMem_RawFree(seen);
    PyMem_RawFree(st);
    PyMem_RawFree(hits);
    PyMem_RawFree(dests);
    PyMem_RawFree(hk);
    Py_XDECREF(new_in);
    Py_XDECREF(metadata);
    Py_XDECREF(per_stage);
    wire_api->items_free(&it);
    return result;
}

PyObject *hit_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(nn)", n_hit_requests, n_hit_series);
}

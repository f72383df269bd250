/* relay.native._cwire: the C twin of relay.wire's per-series route loop, and series_id (BLAKE2b-64).
 *
 * Reference: relay/ingest/wire.py, _route_loop and _py_series_id; relay/rules/label_codec.py,
 * py_decode_key.
 *
 * route_loop(buf, cache, decide, per_dest, metadata) gives exactly what wire._route_loop gives.
 * Pass 1 reads the whole request without any side effect and checks every entry as
 * relay/ingest/wire_entries.py does; it only accepts the shape the Python fast path takes (a TimeSeries
 * whose Label entries come first, then Sample/Exemplar/Histogram entries only, every one well
 * formed; metadata with the one-byte tag; other top-level fields with one-byte tags). Anything else
 * (another field order, unknown TimeSeries fields, any malformed byte) hands the WHOLE call to the
 * Python reference, so its errors and results are the reference's by construction. Pass 2 does the
 * cache lookups, decide() calls and appends in the reference's order, including its "same shape as
 * the previous series" guess (whose cache lookups are visible to a non-dict cache).
 */
#include "common.h"
#include "fastpath.h"

#include <string.h>

static PyObject *py_route_loop; /* relay.wire._route_loop, imported at the first fallback */
static PyObject *str_append, *str_get;
static Py_ssize_t n_fallbacks;

/* ---- entry checks (relay/ingest/wire_entries.py); 1: valid, 0: not handled here -------------------- */

static int utf8_ok(const uint8_t *b, Py_ssize_t start, Py_ssize_t stop)
{
    if (cw_ascii(b, start, stop))
        return 1;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)b + start, stop - start, "strict");
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(s);
    return 1;
}

static int sample_ts(const uint8_t *b, Py_ssize_t s, Py_ssize_t e, int64_t *ts)
{
    uint64_t v = 0;
    cw_field f;
    while (s < e) {
        if (!cw_next_field(b, e, &s, &f))
            return 0;
        if (f.number == 1 && f.wire_type != CW_I64)
            return 0;
        if (f.number == 2) {
            if (f.wire_type != CW_VARINT)
                return 0;
            v = cw_field_varint(b, &f);
        }
    }
    *ts = (int64_t)v;
    return 1;
}

static int label_ok(const uint8_t *b, Py_ssize_t s, Py_ssize_t e)
{
    cw_field f;
    while (s < e) {
        if (!cw_next_field(b, e, &s, &f))
            return 0;
        if (f.number == 1 || f.number == 2) {
            if (f.wire_type != CW_LEN || !utf8_ok(b, f.start, f.stop))
                return 0;
        }
    }
    return 1;
}

static int exemplar_ok(const uint8_t *b, Py_ssize_t s, Py_ssize_t e)
{
    cw_field f;
    while (s < e) {
        if (!cw_next_field(b, e, &s, &f))
            return 0;
        if (f.number == 1) {
            if (f.wire_type != CW_LEN || !label_ok(b, f.start, f.stop))
                return 0;
        } else if ((f.number == 2 && f.wire_type != CW_I64) || (f.number == 3 && f.wire_type != CW_VARINT)) {
            return 0;
        }
    }
    return 1;
}

static int metadata_ok(const uint8_t *b, Py_ssize_t s, Py_ssize_t e)
{
    cw_field f;
    while (s < e) {
        if (!cw_next_field(b, e, &s, &f))
            return 0;
        if (f.number == 1) {
            if (f.wire_type != CW_VARINT)
                return 0;
        } else if (f.number == 2 || f.number == 4 || f.number == 5) {
            if (f.wire_type != CW_LEN || !utf8_ok(b, f.start, f.stop))
                return 0;
        }
    }
    return 1;
}

/* Histogram field -> wire type (-1: unknown field); packed repeated scalars come as LEN too. */
static const int8_t HIST_WT[17] = {-1, 0, 1, 1, 0, 1, 0, 1, 2, 0, 1, 2, 0, 1, 0, 0, 1};

/* A BucketSpan: its length, and whether its (last) offset is negative. */
static int span_ok(const uint8_t *b, Py_ssize_t s, Py_ssize_t e, uint64_t *length, int *negative)
{
    cw_field f;
    *length = 0;
    *negative = 0;
    while (s < e) {
        if (!cw_next_field(b, e, &s, &f))
            return 0;
        if (f.number == 1 || f.number == 2) {
            if (f.wire_type != CW_VARINT)
                return 0;
            uint64_t v = cw_field_varint(b, &f);
            if (f.number == 1)
                *negative = (int)(v & 1); /* sint32 zigzag: odd is negative */
            else
                *length = v & 0xFFFFFFFFu;
        }
    }
    return 1;
}

static int histogram_ts(const uint8_t *b, Py_ssize_t s, Py_ssize_t e, int64_t *ts)
{
    uint64_t t = 0, span_buckets[2] = {0, 0}, spans_seen[2] = {0, 0}, deltas[2] = {0, 0}, counts[2] = {0, 0};
    int is_float = 0;
    cw_field f;
    while (s < e) {
        if (!cw_next_field(b, e, &s, &f))
            return 0;
        if (f.number > 16)
            continue; /* unknown */
        unsigned num = (unsigned)f.number;
        int positive = num >= 11;
        if (f.wire_type == CW_LEN && (num == 9 || num == 12)) { /* packed sint64 deltas */
            if (f.start < f.stop && b[f.stop - 1] >= 0x80)
                return 0;
            Py_ssize_t p = f.start;
            uint64_t v;
            while (p < f.stop) {
                if (!cw_uvarint(b, f.stop, &p, &v))
                    return 0;
                deltas[positive]++;
            }
            continue;
        }
        if (f.wire_type == CW_LEN && (num == 10 || num == 13 || num == 16)) { /* packed doubles */
            if ((f.stop - f.start) % 8)
                return 0;
            if (num != 16)
                counts[positive] += (uint64_t)(f.stop - f.start) / 8;
            continue;
        }
        if (f.wire_type != HIST_WT[num])
            return 0;
        if (num == 1 || num == 2) {
            is_float = num == 2;
        } else if (num == 8 || num == 11) {
            uint64_t length;
            int negative;
            if (!span_ok(b, f.start, f.stop, &length, &negative))
                return 0;
            if (spans_seen[positive] && negative)
                return 0;
            if (span_buckets[positive] + length < length)
                return 0; /* cannot happen below 2^32 spans; not handled here */
            span_buckets[positive] += length;
            spans_seen[positive]++;
        } else if (num == 9 || num == 12) {
            deltas[positive]++;
        } else if (num == 10 || num == 13) {
            counts[positive]++;
        } else if (num == 15) {
            t = cw_field_varint(b, &f);
        }
    }
    const uint64_t *buckets = is_float ? counts : deltas;
    if (span_buckets[0] != buckets[0] || span_buckets[1] != buckets[1])
        return 0;
    *ts = (int64_t)t;
    return 1;
}

/* ---- pass 1: the request's items, or 0 (hand it to the reference) ---------------------------- */

typedef fp_item item;
typedef fp_items items;

static item *push(items *it)
{
    if (it->len == it->cap) {
        Py_ssize_t cap = it->cap * 2;
        item *grown = it->items == it->small ? PyMem_Malloc(sizeof(item) * (size_t)cap)
                                             : PyMem_Realloc(it->items, sizeof(item) * (size_t)cap);
        if (grown == NULL)
            return NULL;
        if (it->items == it->small)
            memcpy(grown, it->small, sizeof(it->small));
        it->items = grown;
        it->cap = cap;
    }
    return &it->items[it->len++];
}

/* A one-byte entry length at b[p], or a varint; 1 with [*s, *q) inside `end`. */
static inline int entry_len(const uint8_t *b, Py_ssize_t end, Py_ssize_t p, Py_ssize_t *s, Py_ssize_t *q)
{
    if (p >= end)
        return 0;
    if (b[p] < 0x80) {
        if (b[p] > end - p - 1)
            return 0;
        *s = p + 1;
        *q = p + 1 + b[p];
        return 1;
    }
    return cw_len(b, end, &p, s, q);
}

/* One TimeSeries payload [start, end) of the shape the reference's fast path takes. */
static int series_ok(const uint8_t *b, Py_ssize_t start, Py_ssize_t end, item *r)
{
    Py_ssize_t p = start, s, q;
    while (p < end && b[p] == 0x0A) { /* Label entries: decide() validates them on a miss */
        if (!entry_len(b, end, p + 1, &s, &q))
            return 0;
        p = q;
    }
    r->key_end = p;
    r->ns = r->ne = r->nh = 0;
    int have = 0, usual = 1;
    int64_t oldest = 0, ts;
    while (p < end) {
        uint8_t t = b[p];
        if (t != 0x12 && t != 0x1A && t != 0x22)
            return 0;
        if (!entry_len(b, end, p + 1, &s, &q))
            return 0;
        if (t == 0x12) {
            r->ns++;
            int got = 0;
            if (q - s >= 12 && b[s] == 0x09 && b[s + 9] == 0x10 && b[q - 1] < 0x80) {
                Py_ssize_t v_end = s + 10;
                uint64_t v;
                if (!cw_uvarint(b, q, &v_end, &v))
                    return 0; /* the reference raises here (over 10 bytes or 64 bits) */
                if (v_end == q) {
                    ts = (int64_t)v;
                    got = 1;
                }
            }
            if (!got) {
                usual = 0;
                if (!sample_ts(b, s, q, &ts))
                    return 0;
            }
        } else if (t == 0x22) {
            r->nh++;
            if (!histogram_ts(b, s, q, &ts))
                return 0;
        } else {
            r->ne++;
            if (!exemplar_ok(b, s, q))
                return 0;
            p = q;
            continue;
        }
        if (!have || ts < oldest) {
            oldest = ts;
            have = 1;
        }
        p = q;
    }
    r->oldest = oldest;
    r->guess = r->ns == 1 && usual && !r->ne && !r->nh && r->key_end + 2 + b[r->key_end + 1] == end;
    r->metadata = 0;
    r->start = start;
    r->end = end;
    return 1;
}

static int parse_request(const uint8_t *b, Py_ssize_t n, items *it)
{
    Py_ssize_t pos = 0, s, q;
    while (pos < n) {
        uint8_t tag = b[pos];
        if (tag == 0x0A || tag == 0x1A) {
            if (!entry_len(b, n, pos + 1, &s, &q))
                return 0;
            item *r = push(it);
            if (r == NULL)
                return -1;
            if (tag == 0x0A) {
                if (!series_ok(b, s, q, r))
                    return 0;
            } else {
                if (!metadata_ok(b, s, q))
                    return 0;
                r->metadata = 1;
                r->start = pos;
                r->end = q;
            }
            pos = q;
            continue;
        }
        /* Another top-level field: skipped as the reference skips it; only one-byte tags here. */
        cw_field f;
        if (tag >= 0x80 || tag >> 3 == 1 || tag >> 3 == 3 || !cw_next_field(b, n, &pos, &f))
            return 0;
    }
    return 1;
}

/* ---- pass 2: lookups, decide() and appends, in the reference's order ------------------------- */

static int append_to(PyObject *list, PyObject *obj)
{
    if (PyList_CheckExact(list))
        return PyList_Append(list, obj);
    PyObject *r = PyObject_CallMethodOneArg(list, str_append, obj);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* for dest, d in zip(per_dest, decision): if d is not None: dest.append((d, rest, count, first)) */
static int emit(PyObject *per_dest, PyObject *decision, PyObject *rest, PyObject *count, PyObject *first)
{
    if (PyList_CheckExact(per_dest) && PyTuple_CheckExact(decision)) {
        Py_ssize_t nd = PyTuple_GET_SIZE(decision);
        for (Py_ssize_t i = 0; i < nd && i < PyList_GET_SIZE(per_dest); i++) {
            PyObject *d = PyTuple_GET_ITEM(decision, i);
            if (d == Py_None)
                continue;
            PyObject *dest = PyList_GET_ITEM(per_dest, i);
            PyObject *entry = PyTuple_Pack(4, d, rest, count, first);
            if (entry == NULL)
                return -1;
            Py_INCREF(dest);
            int rc = append_to(dest, entry);
            Py_DECREF(dest);
            Py_DECREF(entry);
            if (rc < 0)
                return -1;
        }
        return 0;
    }
    PyObject *dests = PyObject_GetIter(per_dest), *ds = NULL, *dest = NULL, *d = NULL;
    int rc = -1;
    if (dests == NULL)
        return -1;
    ds = PyObject_GetIter(decision);
    if (ds == NULL)
        goto done;
    for (;;) {
        dest = PyIter_Next(dests);
        if (dest == NULL)
            break;
        d = PyIter_Next(ds);
        if (d == NULL)
            break;
        if (d != Py_None) {
            PyObject *entry = PyTuple_Pack(4, d, rest, count, first);
            if (entry == NULL || append_to(dest, entry) < 0) {
                Py_XDECREF(entry);
                goto done;
            }
            Py_DECREF(entry);
        }
        Py_CLEAR(dest);
        Py_CLEAR(d);
    }
    if (!PyErr_Occurred())
        rc = 0;
done:
    Py_XDECREF(dest);
    Py_XDECREF(d);
    Py_XDECREF(ds);
    Py_DECREF(dests);
    return rc;
}

/* cache.get(key): a new reference, NULL for None (a miss) or on error (check PyErr_Occurred). */
static PyObject *cache_get(PyObject *cache, PyObject *get, PyObject *key)
{
    PyObject *v;
    if (get == NULL) {
        v = PyDict_GetItemWithError(cache, key);
        Py_XINCREF(v);
    } else {
        v = PyObject_CallOneArg(get, key);
    }
    if (v == Py_None) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

/* 1 for a cache whose get() has no side effect and answers what a dict would: a dict, or relay.native._cdcache's
 * DecisionTable (exact types). For these the reference's second lookup of a key that just missed is
 * skipped; any other cache sees every call the reference makes. */
static PyTypeObject *decision_table_type;
static int decision_table_looked_up;

static int pure_cache(PyObject *cache)
{
    if (PyDict_CheckExact(cache))
        return 1;
    if (!decision_table_looked_up) {
        decision_table_looked_up = 1;
        PyObject *mod = PyImport_ImportModule("relay.native._cdcache");
        if (mod == NULL) {
            PyErr_Clear();
            return 0;
        }
        PyObject *t = PyObject_GetAttrString(mod, "DecisionTable");
        Py_DECREF(mod);
        if (t == NULL || !PyType_Check(t)) {
            PyErr_Clear();
            Py_XDECREF(t);
            return 0;
        }
        decision_table_type = (PyTypeObject *)t; /* kept for the module's life */
    }
    return decision_table_type != NULL && Py_TYPE(cache) == decision_table_type;
}

static PyObject *route_items(const uint8_t *b, PyObject *buf, const items *it, PyObject *cache,
                             PyObject *decide, PyObject *per_dest, PyObject *metadata)
{
    PyObject *get = NULL, *key = NULL, *rest = NULL, *decision = NULL, *count = NULL, *first = NULL;
    PyObject *missed = NULL; /* the guessed key, which missed in a cache whose lookups have no effect */
    Py_ssize_t series = 0, samples = 0, histograms = 0, exemplars = 0, fresh = 0;
    fp_guess guess = {0, 0, 0}; /* the guessed one-sample rest */
    if (!PyDict_CheckExact(cache) && (get = PyObject_GetAttr(cache, str_get)) == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < it->len; i++) {
        const item *r = &it->items[i];
        if (r->metadata) {
            rest = PyBytes_FromStringAndSize((const char *)b + r->start, r->end - r->start);
            if (rest == NULL || append_to(metadata, rest) < 0)
                goto fail;
            Py_CLEAR(rest);
            continue;
        }
        {
            Py_ssize_t g = fp_guess_split(&guess, b, r);
            if (g >= 0) {
                if ((key = PyBytes_FromStringAndSize((const char *)b + r->start, g - r->start)) == NULL)
                    goto fail;
                decision = cache_get(cache, get, key);
                if (decision == NULL && !PyErr_Occurred() && g == r->key_end && pure_cache(cache)) {
                    missed = key; /* the same key missed: looking it up again would answer the same */
                    key = NULL;
                }
                Py_CLEAR(key);
                if (decision != NULL) {
                    series++;
                    samples++;
                    rest = PyBytes_FromStringAndSize((const char *)b + g, guess.len);
                    count = PyLong_FromLong(1);
                    first = PyLong_FromLongLong(guess.ts);
                    if (rest == NULL || count == NULL || first == NULL
                        || emit(per_dest, decision, rest, count, first) < 0)
                        goto fail;
                    Py_CLEAR(decision);
                    Py_CLEAR(rest);
                    Py_CLEAR(count);
                    Py_CLEAR(first);
                    continue;
                }
                if (PyErr_Occurred())
                    goto fail;
            }
        }
        key = missed != NULL ? missed : PyBytes_FromStringAndSize((const char *)b + r->start, r->key_end - r->start);
        int known_miss = missed != NULL;
        missed = NULL;
        rest = PyBytes_FromStringAndSize((const char *)b + r->key_end, r->end - r->key_end);
        if (key == NULL || rest == NULL)
            goto fail;
        fp_guess_note(&guess, r);
        series++;
        samples += r->ns;
        exemplars += r->ne;
        histograms += r->nh;
        decision = known_miss ? NULL : cache_get(cache, get, key);
        if (decision == NULL) {
            if (PyErr_Occurred())
                goto fail;
            decision = PyObject_CallOneArg(decide, key);
            if (decision == NULL)
                goto fail;
            Py_ssize_t nd = PyObject_Size(decision);
            if (nd < 0)
                goto fail;
            Py_ssize_t np = PyObject_Size(per_dest);
            if (np < 0)
                goto fail;
            if (nd != np) {
                PyErr_Format(PyExc_ValueError, "decide() returned %zd decisions for %zd destinations", nd, np);
                goto fail;
            }
            if ((get == NULL ? PyDict_SetItem(cache, key, decision) : PyObject_SetItem(cache, key, decision)) < 0)
                goto fail;
            fresh++;
        }
        count = PyLong_FromSsize_t(r->ns + r->nh);
        first = PyLong_FromLongLong(r->oldest);
        if (count == NULL || first == NULL || emit(per_dest, decision, rest, count, first) < 0)
            goto fail;
        Py_CLEAR(key);
        Py_CLEAR(rest);
        Py_CLEAR(decision);
        Py_CLEAR(count);
        Py_CLEAR(first);
    }
    Py_XDECREF(get);
    (void)buf;
    return Py_BuildValue("(nnnnn)", series, samples, histograms, exemplars, fresh);
fail:
    Py_XDECREF(get);
    Py_XDECREF(missed);
    Py_XDECREF(key);
    Py_XDECREF(rest);
    Py_XDECREF(decision);
    Py_XDECREF(count);
    Py_XDECREF(first);
    return NULL;
}

static PyObject *fallback(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (py_route_loop == NULL) {
        PyObject *wire = PyImport_ImportModule("relay.ingest.wire");
        if (wire == NULL)
            return NULL;
        py_route_loop = PyObject_GetAttrString(wire, "_route_loop");
        Py_DECREF(wire);
        if (py_route_loop == NULL)
            return NULL;
    }
    n_fallbacks++;
    return PyObject_Vectorcall(py_route_loop, args, (size_t)nargs, kwnames);
}

static PyObject *route_loop(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* Keywords, a wrong count (the reference's TypeError) and buffers other than bytes: the reference. */
    if (nargs != 5 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || !PyBytes_CheckExact(args[0]))
        return fallback(args, nargs, kwnames);
    PyObject *buf = args[0];
    const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(buf);
    items it = {.len = 0, .cap = 64};
    it.items = it.small;
    int ok = parse_request(b, PyBytes_GET_SIZE(buf), &it);
    PyObject *out;
    if (ok < 0)
        out = PyErr_NoMemory();
    else if (ok == 0)
        out = fallback(args, nargs, NULL);
    else
        out = route_items(b, buf, &it, args[1], args[2], args[3], args[4]);
    if (it.items != it.small)
        PyMem_Free(it.items);
    return out;
}

/* ---- series_id: BLAKE2b (RFC 7693) with an 8-byte digest, no key, read little-endian ---------- */

static const uint64_t B2_IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t B2_SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static inline uint64_t rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64(const uint8_t *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
#endif
}

#define B2_G(a, b, c, d, x, y)            \
    do {                                  \
        v[a] = v[a] + v[b] + (x);         \
        v[d] = rotr64(v[d] ^ v[a], 32);   \
        v[c] = v[c] + v[d];               \
        v[b] = rotr64(v[b] ^ v[c], 24);   \
        v[a] = v[a] + v[b] + (y);         \
        v[d] = rotr64(v[d] ^ v[a], 16);   \
        v[c] = v[c] + v[d];               \
        v[b] = rotr64(v[b] ^ v[c], 63);   \
    } while (0)

/* F: compress one 128-byte block into h; t is the byte count so far (below 2^64 here). */
static void b2_compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++)
        m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = B2_IV[i];
    }
    v[12] ^= t; /* the high word of the 128-bit counter stays 0 */
    if (last)
        v[14] = ~v[14];
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 12 /* constant message-word indices: about twice as fast */
#endif
    for (int round = 0; round < 12; round++) {
        const uint8_t *s = B2_SIGMA[round % 10];
        B2_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        B2_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        B2_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        B2_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        B2_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        B2_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        B2_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        B2_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

static uint64_t blake2b_64(const uint8_t *data, size_t len)
{
    uint64_t h[8];
    uint8_t block[128];
    memcpy(h, B2_IV, sizeof(h));
    h[0] ^= 0x01010000ULL ^ 8; /* depth 1, fanout 1, no key, 8-byte digest */
    size_t done = 0;
    while (len - done > 128) {
        b2_compress(h, data + done, (uint64_t)(done + 128), 0);
        done += 128;
    }
    memset(block, 0, sizeof(block));
    if (len > done)
        memcpy(block, data + done, len - done);
    b2_compress(h, block, (uint64_t)len, 1);
    return h[0]; /* the digest's 8 bytes are h[0] little-endian */
}

static PyObject *series_id(PyObject *self, PyObject *arg)
{
    if (PyBytes_CheckExact(arg))
        return PyLong_FromUnsignedLongLong(
            blake2b_64((const uint8_t *)PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg)));
    if (PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "Strings must be encoded before hashing");
        return NULL;
    }
    if (!PyObject_CheckBuffer(arg)) {
        PyErr_SetString(PyExc_TypeError, "object supporting the buffer API required");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t id = blake2b_64((const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(id);
}

/* ---- decode_key: relay.label_codec.decode_key for strictly canonical label bytes ---------------
 *
 * decode_key(key) -> (labels, names, True), or None where the key is not strictly canonical: every
 * Label entry exactly "0a L 0a nl name 12 vl value" with L, nl, vl under 128 and nl, vl above 0, the
 * entries back to back to the end of the key, the names strictly increasing (byte order, which is
 * code point order for UTF-8) and valid UTF-8. For such a key the reference answers the same labels,
 * names and canonical=True (its memo only holds entries it validated by the same rules); on None the
 * caller runs the reference, which gives every other answer and every error. Entries are memoised in
 * a direct-mapped table (DK_SLOTS, bounded: a slot's entry is replaced by the next one hashing there);
 * a hit is the entry's bytes compared in full, so it is exact. Names are interned, as sys.intern does. */
#define DK_SLOTS 16384 /* label_codec.MAX_ENTRIES */
#define DK_MAX_ENTRY 129
typedef struct {
    PyObject *pair; /* (name, value), or NULL: empty slot */
    uint8_t len;
    uint8_t raw[DK_MAX_ENTRY];
} dk_slot;
static dk_slot *dk_table;
static Py_ssize_t dk_used, dk_hits, dk_misses;

static inline uint32_t dk_hash(const uint8_t *b, Py_ssize_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    memcpy(&w, b + i, (size_t)(n - i));
    h = (h ^ w) * 0x94D049BB133111EBULL;
    h ^= h >> 32;
    return (uint32_t)h;
}

/* The memoised (or new) pair of the entry b[0:n); NULL with no exception: not valid UTF-8. */
static PyObject *dk_pair(const uint8_t *b, Py_ssize_t n, Py_ssize_t nl)
{
    dk_slot *slot = &dk_table[dk_hash(b, n) & (DK_SLOTS - 1)];
    if (slot->pair != NULL && slot->len == n && memcmp(slot->raw, b, (size_t)n) == 0) {
        dk_hits++;
        Py_INCREF(slot->pair);
        return slot->pair;
    }
    dk_misses++;
    PyObject *name = PyUnicode_DecodeUTF8((const char *)b + 4, nl, "strict");
    if (name == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *value = PyUnicode_DecodeUTF8((const char *)b + 6 + nl, n - 6 - nl, "strict");
    if (value == NULL) {
        PyErr_Clear();
        Py_DECREF(name);
        return NULL;
    }
    PyUnicode_InternInPlace(&name);
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        PyErr_Clear(); /* (the reference will meet the same shortage) */
        Py_DECREF(name);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, name);
    PyTuple_SET_ITEM(pair, 1, value);
    if (slot->pair == NULL)
        dk_used++;
    Py_XSETREF(slot->pair, pair);
    Py_INCREF(pair);
    slot->len = (uint8_t)n;
    memcpy(slot->raw, b, (size_t)n);
    return pair;
}

#define DK_SMALL 64
static PyObject *decode_key(PyObject *self, PyObject *arg)
{
    if (!PyBytes_CheckExact(arg))
        Py_RETURN_NONE;
    if (dk_table == NULL && (dk_table = PyMem_Calloc(DK_SLOTS, sizeof(dk_slot))) == NULL)
        return PyErr_NoMemory();
    const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    PyObject *small[DK_SMALL];
    PyObject **pairs = small;
    Py_ssize_t cap = DK_SMALL, count = 0, p = 0;
    const uint8_t *prev = NULL;
    Py_ssize_t prev_len = 0;
    PyObject *out = NULL;
    while (p < n) {
        /* 0a L 0a nl name 12 vl value, all inside the key, L = 4 + nl + vl */
        if (n - p < 6 || b[p] != 0x0A || b[p + 1] >= 0x80 || b[p + 2] != 0x0A || b[p + 3] >= 0x80)
            goto not_mine;
        Py_ssize_t len = 2 + b[p + 1], nl = b[p + 3];
        if (len > n - p || nl == 0 || 6 + nl >= len || b[p + 4 + nl] != 0x12 || b[p + 5 + nl] >= 0x80
                || 6 + nl + b[p + 5 + nl] != len)
            goto not_mine;
        const uint8_t *name = b + p + 4;
        if (prev != NULL) { /* strictly increasing names */
            int c = memcmp(prev, name, (size_t)(prev_len < nl ? prev_len : nl));
            if (c > 0 || (c == 0 && prev_len >= nl))
                goto not_mine;
        }
        prev = name;
        prev_len = nl;
        PyObject *pair = dk_pair(b + p, len, nl);
        if (pair == NULL)
            goto not_mine;
        if (count == cap) {
            Py_ssize_t grown_cap = cap * 2;
            PyObject **grown = pairs == small ? PyMem_Malloc(sizeof(PyObject *) * (size_t)grown_cap)
                                              : PyMem_Realloc(pairs, sizeof(PyObject *) * (size_t)grown_cap);
            if (grown == NULL) {
                Py_DECREF(pair);
                PyErr_NoMemory();
                goto done;
            }
            if (pairs == small)
                memcpy(grown, small, sizeof(small));
            pairs = grown;
            cap = grown_cap;
        }
        pairs[count++] = pair;
        p += len;
    }
    PyObject *labels = PyTuple_New(count), *names = NULL;
    if (labels == NULL || (names = PyTuple_New(count)) == NULL) {
        Py_XDECREF(labels);
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(pairs[i], 0);
        Py_INCREF(name);
        PyTuple_SET_ITEM(names, i, name);
        PyTuple_SET_ITEM(labels, i, pairs[i]); /* the reference taken over */
    }
    count = 0;
    out = PyTuple_Pack(3, labels, names, Py_True);
    Py_DECREF(labels);
    Py_DECREF(names);
    goto done;
not_mine:
    Py_INCREF(Py_None);
    out = Py_None;
done:
    for (Py_ssize_t i = 0; i < count; i++)
        Py_DECREF(pairs[i]);
    if (pairs != small)
        PyMem_Free(pairs);
    return out;
}

/* decode_key_memo() -> (slots, used, hits, misses, table bytes); decode_key_memo(True) also empties the
 * table (its slots stay allocated). */
static PyObject *decode_key_memo(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *out = Py_BuildValue("(nnnnn)", (Py_ssize_t)DK_SLOTS, dk_used, dk_hits, dk_misses,
                                  dk_table == NULL ? (Py_ssize_t)0 : (Py_ssize_t)(DK_SLOTS * sizeof(dk_slot)));
    if (out != NULL && nargs > 0 && PyObject_IsTrue(args[0]) == 1 && dk_table != NULL) {
        for (Py_ssize_t i = 0; i < DK_SLOTS; i++)
            Py_CLEAR(dk_table[i].pair);
        dk_used = dk_hits = dk_misses = 0;
    }
    return out;
}

static PyObject *fallbacks(PyObject *self, PyObject *unused)
{
    return PyLong_FromSsize_t(n_fallbacks);
}

/* entry_offset(key, i): where entry i of a canonical key starts (len(key) past its last entry);
 * label_codec.py_entry_offset is the reference. */
static PyObject *entry_offset(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "entry_offset(key: bytes, i: int)");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0) {
        PyErr_Format(PyExc_ValueError, "entry index must be >= 0, not %zd", i);
        return NULL;
    }
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), p = 0;
    for (Py_ssize_t e = 0; e < i && p < n; e++) {
        if (p + 1 >= n) /* (a canonical key never ends inside an entry's head) */
            return PyLong_FromSsize_t(n);
        p += 2 + k[p + 1];
    }
    return PyLong_FromSsize_t(p < n ? p : n);
}

static PyMethodDef methods[] = {
    {"entry_offset", (PyCFunction)(void (*)(void))entry_offset, METH_FASTCALL,
     "entry_offset(key, i): where entry i of a canonical label key starts (len(key) past the last)."},
    {"route_loop", (PyCFunction)(void (*)(void))route_loop, METH_FASTCALL | METH_KEYWORDS,
     "route_loop(buf, cache, decide, per_dest, metadata): relay.wire._route_loop in C."},
    {"series_id", series_id, METH_O, "series_id(label_bytes): BLAKE2b-64 of the bytes, little-endian."},
    {"decode_key", decode_key, METH_O,
     "decode_key(key): relay.label_codec.decode_key's (labels, names, True) for a strictly canonical key, else None."},
    {"decode_key_memo", (PyCFunction)(void (*)(void))decode_key_memo, METH_FASTCALL,
     "decode_key_memo([clear]): (slots, used, hits, misses, table bytes) of decode_key's entry memo; clear empties it."},
    {"fallbacks", fallbacks, METH_NOARGS,
     "fallbacks(): how many route_loop calls were handed to the Python reference so far."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "relay.native._cwire", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

static void items_free(items *it)
{
    if (it->items != it->small)
        PyMem_Free(it->items);
    it->items = it->small;
    it->len = 0;
    it->cap = 64;
}

static int parse_api(const uint8_t *b, Py_ssize_t n, items *it)
{
    it->items = it->small;
    it->len = 0;
    it->cap = 64;
    return parse_request(b, n, it);
}

static fp_wire_api wire_api = {FP_API_VERSION, parse_api, items_free};

PyMODINIT_FUNC PyInit__cwire(void)
{
    if (str_append == NULL && (str_append = PyUnicode_InternFromString("append")) == NULL)
        return NULL;
    if (str_get == NULL && (str_get = PyUnicode_InternFromString("get")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *cap = PyCapsule_New(&wire_api, "relay.native._cwire._parse_api", NULL);
    if (cap == NULL || PyModule_AddObject(m, "_parse_api", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

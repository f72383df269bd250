/* The C-level interfaces between the relay's extensions for the cache-hit fast path (issue 9).
 *
 * relay.native._cstage's route_hits() routes a whole request whose every series is in the decision cache
 * without a Python object per series. It needs two things from the other modules, exported as
 * PyCapsules (each module keeps its own code and data layout; this header is the contract):
 *
 * - relay.native._cwire "_parse_api" (fp_wire_api): pass 1 of its route loop, the request's items with
 *   every entry checked as the reference checks it (the loop's own parse_request).
 * - relay.native._cdcache "_table_api" (fp_table_api): look a key up by (pointer, length) in a
 *   DecisionTable and get the packed entry, and the table's shared objects and label edits.
 *
 * A packed entry (relay/native/cdcache.c, "entry layout"): words [h0 h1 in_id in_ref] then per
 * destination [id ref aux]. in_ref: the input's metric, or with bit FP_WHOLE the value stored whole.
 * ref: low 2 bits the kind (FP_K_*), the rest the object (the metric for SENT, the shared drop tuple
 * for SHARED, the stored tuple for TUPLE). aux (SENT): bit 0 the claim flag, bits 1-2 where the
 * output label bytes come from (FP_LB_*), then per mode: OWN aux & ~7 is the bytes object; SHARED
 * bits 3-10 index the shared objects; EDIT bits 3-7 the run's shared index + 1 (see edit()); KEY
 * and SHARED bits 11-63 the external labels' position + 1 (0: none).
 *
 * A table holds each destination in FP_DW_WIDE words [id ref aux] until one is sent under a metric
 * other than the input's; before that in FP_DW_NARROW words (8 bytes less a destination):
 * [id aux] for SENT (ref: the input's metric, in_ref), [ref FP_NARROW_OTHER] for any other kind
 * (an aux no SENT decision has: LB_KEY with bits 3-10 set). A table of one destination starts in
 * FP_DW_COMPACT, one word, while its decisions are not sent, or sent with the key's label bytes or a
 * shared object's put in at byte 1021 at the most (pass-through, with or without external labels):
 * [id] with the aux in h1's top 16 bits (FP_H1_MASK: the key hash is 112 bits), or [ref] with
 * FP_COMPACT_OTHER there. fp_dest reads any of them into [id ref aux].
 */
#ifndef GPU_RELAY_FASTPATH_H
#define GPU_RELAY_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FP_API_VERSION 3

/* ---- relay.native._cwire: the request's items ------------------------------------------------------- */

typedef struct {
    Py_ssize_t start, key_end, end; /* metadata: [start, end) is the raw tag-wrapped entry */
    Py_ssize_t ns, ne, nh;
    int64_t oldest; /* 0 when none, as `oldest or 0` */
    int8_t metadata;
    int8_t guess; /* the reference remembers this series' shape for the next one */
} fp_item;

/* The route loop's one-sample guess (relay/ingest/wire.py, route_loop): after a series of the guess
 * shape (one sample, no exemplars), the next series is first tried with a rest of the same length
 * and shape (its first 3 bytes and its bytes from 11 on the same: only the value differs), its key
 * the bytes before. relay.native._cwire's loop and relay.native._cstage's route_hits both make it. */
typedef struct {
    Py_ssize_t len, head; /* the guessed rest's length and where it was (len 0: no guess) */
    int64_t ts;           /* its timestamp */
} fp_guess;

typedef struct {
    fp_item *items;
    Py_ssize_t len, cap;
    fp_item small[64];
} fp_items;

typedef struct {
    int version;
    /* 1: every item in *it (call items_free after); 0: a shape the C loop does not take (hand the
       request to the reference); -1: MemoryError (not set: the caller sets it) */
    int (*parse)(const uint8_t *b, Py_ssize_t n, fp_items *it);
    void (*items_free)(fp_items *it);
} fp_wire_api;

/* where item r's key ends if its rest is the guessed one, else -1 */
static inline Py_ssize_t fp_guess_split(const fp_guess *g, const uint8_t *b, const fp_item *r) {
    if (g->len && g->len < r->end - r->start) {
        Py_ssize_t s = r->end - g->len;
        if (memcmp(b + s + 11, b + g->head + 11, (size_t)g->len - 11) == 0 && memcmp(b + s, b + g->head, 3) == 0)
            return s;
    }
    return -1;
}

/* item r, looked up in full: its rest is the next guess when it has the guess shape, else none is */
static inline void fp_guess_note(fp_guess *g, const fp_item *r) {
    if (r->guess) {
        g->len = r->end - r->key_end;
        g->ts = r->oldest;
        g->head = r->key_end;
    } else {
        g->len = 0;
    }
}

/* ---- relay.native._cdcache: the decision table ------------------------------------------------------- */

enum { FP_K_NONE = 0, FP_K_SENT = 1, FP_K_SHARED = 2, FP_K_TUPLE = 3 };
enum { FP_LB_KEY = 0, FP_LB_OWN = 1, FP_LB_SHARED = 2, FP_LB_EDIT = 3 };
#define FP_WHOLE 1u
#define FP_HDR 4 /* words before the destinations */
#define FP_DW_WIDE 3
#define FP_DW_NARROW 2
#define FP_DW_COMPACT 1
#define FP_NARROW_OTHER ((uint64_t)1 << 3)
#define FP_H1_MASK ((UINT64_C(1) << 48) - 1) /* the key hash's bits of word 1; above: a compact entry's aux */
#define FP_COMPACT_OTHER UINT64_C(0xffff)
/* A compact aux (16 bits): bit 0 the claim, bit 1 the label bytes from a shared object (else the
   key), bits 2-5 its index, bits 6-15 the position + 1 (at most 1022: 0xffff is FP_COMPACT_OTHER). */
#define FP_COMPACT_POS_LIMIT 1023

/* the wide aux of a compact one */
static inline uint64_t fp_compact_aux(uint64_t a) {
    return (a & 1) | ((a >> 1 & 1) ? (uint64_t)FP_LB_SHARED << 1 : (uint64_t)FP_LB_KEY << 1) | (a >> 2 & 15) << 3
           | (a >> 6) << 11;
}

/* destination j (0: the first after the input) of entry e, whose destinations take dw words each, as
   the wide words w = [id ref aux]; e is not stored whole (in_ref without FP_WHOLE) */
static inline void fp_dest(const uint64_t *e, size_t dw, size_t j, uint64_t w[3]) {
    const uint64_t *d = e + FP_HDR + dw * j;
    uint64_t aux = dw == FP_DW_NARROW ? d[1] : e[1] >> 48;
    if (dw == FP_DW_WIDE) {
        w[0] = d[0];
        w[1] = d[1];
        w[2] = d[2];
    } else if (aux == (dw == FP_DW_NARROW ? FP_NARROW_OTHER : FP_COMPACT_OTHER)) {
        w[0] = w[2] = 0;
        w[1] = d[0];
    } else {
        w[0] = d[0];
        w[1] = e[3] | FP_K_SENT;
        w[2] = dw == FP_DW_NARROW ? aux : fp_compact_aux(aux);
    }
}

typedef struct {
    int version;
    PyTypeObject *type; /* DecisionTable: callers check Py_TYPE against it */
    /* the packed entry of key p[0:n], or NULL when absent; valid until the table changes */
    const uint64_t *(*lookup)(PyObject *table, const uint8_t *p, size_t n);
    /* lookup in two halves, so that a caller can hash a request's keys and prefetch their index
       slots and entries before it reads them: the table's hash of p[0:n]; find(hash) is lookup */
    void (*hash)(const uint8_t *p, size_t n, uint64_t h[2]);
    const uint64_t *(*find)(PyObject *table, const uint64_t h[2]);
    void (*prefetch)(PyObject *table, const uint64_t h[2], int entry); /* 0: the index slot, 1: the entry */
    Py_ssize_t (*width)(PyObject *table); /* decisions per entry (0: none stored yet) */
    size_t (*dest_words)(PyObject *table); /* words a destination of its entries takes (fp_dest) */
    PyObject *(*shared)(PyObject *table, int i); /* borrowed, NULL when there is no such object */
    /* The output label bytes of an EDIT aux for key p[0:n] with the run (NULL: none): their length,
       written to out when out is not NULL; -1 when the key does not split into label entries. */
    Py_ssize_t (*edit)(const uint8_t *p, size_t n, uint64_t aux, const char *run, size_t run_len, uint8_t *out);
    /* hash of two keys at once (the same function as hash, faster than two calls) */
    void (*hash2)(const uint8_t *pa, size_t na, uint64_t ha[2], const uint8_t *pb, size_t nb, uint64_t hb[2]);
} fp_table_api;

#endif /* GPU_RELAY_FASTPATH_H */

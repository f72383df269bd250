/* relay.native._cdcache: a compact table of the pipeline's cached decisions (relay.decision_cache).

Reference: relay/state/decision_cache.py, DecisionCache (a dict a generation): a DecisionTable
answers get/put/eviction as those dicts do.

A DecisionTable maps raw label bytes to their decision (relay.wire.Decision: one tuple per
destination, element 0 the input's) like a dict, but stores neither the key bytes nor the tuples:

- Entries are keyed by 112 bits of a keyed 128-bit SipHash-1-3 of the label bytes (the other 16
  bits of its second word hold a compact entry's destination). The 128-bit key is drawn from
  os.urandom once per process, so nobody can aim for collisions; two of 5M keys collide with a
  probability around 5e6^2 / 2^113, about 2e-21: negligible, and the table treats equal hashes as
  equal keys.
- Entries live in one dense array (n entries, fixed size for the table's width: the number of
  decisions per entry), found through an open-addressing index of uint32 (entry + 1; 0 empty;
  linear probing, grown at 3/4 load, shrunk when a quarter of that, backward-shift deletion, so
  no tombstones). A removed entry's hole is filled by the last entry (popitem pops the last).
- Each decision is packed: the input as (in_id uint64, metric reference); a destination as
  (sid's low 64 bits, a tagged reference, aux), or without the reference while every destination
  sent is sent under the input's metric (a "narrow" table: 8 bytes less a destination, 48 bytes
  an entry of one), or for a table of one destination as its id alone, a 16-bit aux in the hash
  word, while it is not sent or sent with the key's or a shared object's label bytes (a "compact"
  table: a pass-through entry 40 bytes instead of 56); the first decision a layout cannot hold
  turns the table to one that can, for good, in one pass over its entries. Kinds: NONE (None),
  SENT (the reference is the metric; aux has the CLAIM bit, the external-labels position + 1, and
  where lb comes from: the key, one of the table's shared objects such as a stage's external-labels
  bytes, or its own bytes object), SHARED (a tuple stored as is and shared by many entries: drops)
  or TUPLE (anything else, stored as is: aggregated series, unusual shapes). A decision that does not fit at all
  (not a tuple of the table's width, an input tuple that is not (key, id < 2**64, metric)) is
  stored whole.
- get() rebuilds an equal tuple with the caller's key object wherever the key was.

Values hold only immutable objects (bytes, int, str and tuples of them), so the table takes no
part in cyclic GC. Not thread-safe: relay.decision_cache calls it under the pipeline's lock.
*/
#include "bigarray.h"
#include "fastpath.h"
#include "urandom.h"
#include <stdint.h>
#include <string.h>

/* ---- SipHash (Aumasson & Bernstein), 128-bit output ------------------------------------------ */

static uint64_t sip_k0, sip_k1;

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND_OF(x0, x1, x2, x3)                                                                \
    do {                                                                                           \
        x0 += x1; x1 = ROTL(x1, 13); x1 ^= x0; x0 = ROTL(x0, 32);                                  \
        x2 += x3; x3 = ROTL(x3, 16); x3 ^= x2;                                                     \
        x0 += x3; x3 = ROTL(x3, 21); x3 ^= x0;                                                     \
        x2 += x1; x1 = ROTL(x1, 17); x1 ^= x2; x2 = ROTL(x2, 32);                                  \
    } while (0)
#define SIPROUND SIPROUND_OF(v0, v1, v2, v3)

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* the last block: the bytes after the whole words, and the length in the top byte */
static inline uint64_t sip_last(const uint8_t *in, size_t len) {
    size_t full = len & ~(size_t)7;
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)in[full + i] << (8 * i);
    return b;
}

/* c compression rounds, d finalization rounds; out128: two words (else one, the 64-bit variant) */
static inline void siphash(const uint8_t *in, size_t len, uint64_t k0, uint64_t k1, int c, int d,
                           int out128, uint64_t out[2]) {
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    if (out128)
        v1 ^= 0xee;
    size_t full = len & ~(size_t)7;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = load_le64(in + i);
        v3 ^= m;
        for (int r = 0; r < c; r++)
            SIPROUND;
        v0 ^= m;
    }
    uint64_t b = sip_last(in, len);
    v3 ^= b;
    for (int r = 0; r < c; r++)
        SIPROUND;
    v0 ^= b;
    v2 ^= out128 ? 0xee : 0xff;
    for (int r = 0; r < d; r++)
        SIPROUND;
    out[0] = v0 ^ v1 ^ v2 ^ v3;
    if (!out128)
        return;
    v1 ^= 0xdd;
    for (int r = 0; r < d; r++)
        SIPROUND;
    out[1] = v0 ^ v1 ^ v2 ^ v3;
}

/* the table's hash of a key: SipHash-1-3-128, the top 16 bits of its second word 0 (FP_H1_MASK) */
static inline void key_hash(const uint8_t *p, size_t n, uint64_t h[2]) {
    siphash(p, n, sip_k0, sip_k1, 1, 3, 1, h);
    h[1] &= FP_H1_MASK;
}

/* key_hash of two keys at once, the same function. A SipRound is one chain of dependent adds,
 * rotations and xors: one key leaves most of a core's ALUs idle, two independent chains fill them
 * (issue 9's keep4: the hash was a tenth of the relay's CPU). */
#define SIPROUND_AB                                                                                \
    do {                                                                                           \
        SIPROUND_OF(a0, a1, a2, a3);                                                               \
        SIPROUND_OF(b0, b1, b2, b3);                                                               \
    } while (0)

static inline void key_hash2(const uint8_t *pa, size_t na, uint64_t ha[2], const uint8_t *pb, size_t nb,
                             uint64_t hb[2]) {
    uint64_t a0 = sip_k0 ^ 0x736f6d6570736575ULL, a1 = sip_k1 ^ 0x646f72616e646f6dULL ^ 0xee;
    uint64_t a2 = sip_k0 ^ 0x6c7967656e657261ULL, a3 = sip_k1 ^ 0x7465646279746573ULL;
    uint64_t b0 = a0, b1 = a1, b2 = a2, b3 = a3;
    size_t fa = na & ~(size_t)7, fb = nb & ~(size_t)7, common = fa < fb ? fa : fb, i;
    for (i = 0; i < common; i += 8) {
        uint64_t ma = load_le64(pa + i), mb = load_le64(pb + i);
        a3 ^= ma;
        b3 ^= mb;
        SIPROUND_AB;
        a0 ^= ma;
        b0 ^= mb;
    }
    for (size_t j = i; j < fa; j += 8) {
        uint64_t m = load_le64(pa + j);
        a3 ^= m;
        SIPROUND_OF(a0, a1, a2, a3);
        a0 ^= m;
    }
    for (size_t j = i; j < fb; j += 8) {
        uint64_t m = load_le64(pb + j);
        b3 ^= m;
        SIPROUND_OF(b0, b1, b2, b3);
        b0 ^= m;
    }
    uint64_t la = sip_last(pa, na), lb = sip_last(pb, nb);
    a3 ^= la;
    b3 ^= lb;
    SIPROUND_AB;
    a0 ^= la;
    b0 ^= lb;
    a2 ^= 0xee;
    b2 ^= 0xee;
    SIPROUND_AB;
    SIPROUND_AB;
    SIPROUND_AB;
    ha[0] = a0 ^ a1 ^ a2 ^ a3;
    hb[0] = b0 ^ b1 ^ b2 ^ b3;
    a1 ^= 0xdd;
    b1 ^= 0xdd;
    SIPROUND_AB;
    SIPROUND_AB;
    SIPROUND_AB;
    ha[1] = (a0 ^ a1 ^ a2 ^ a3) & FP_H1_MASK;
    hb[1] = (b0 ^ b1 ^ b2 ^ b3) & FP_H1_MASK;
}

/* ---- entry layout ----------------------------------------------------------------------------
   [h0 h1] [in_id, in_ref] [dest 1: id, ref, aux] ... [dest width-1]
   in_ref: the metric, or (low bit 1) the whole value stored as is.
   ref (dest): low 2 bits the kind, the rest the object pointer (NULL for NONE).
   aux (SENT): bit 0 CLAIM, bits 1-2 where lb comes from (LB_KEY, LB_OWN: aux & ~7 is the bytes
   object, LB_SHARED: bits 3-10 index the table's shared objects), bits 11-63 pos + 1 (0: none).
   LB_EDIT: lb is the key with some of its label entries left out and at most one run of bytes (a
   shared object, e.g. the external labels) put in before one of them: bits 3-7 the run's shared
   index + 1 (0: none), bits 8-13 the entry it goes before, bits 14-63 the mask of entries left out
   (entries 0-49). What rules such as prune_labels or labeldrop make, with no copy kept.
   A narrow table (dw 2) leaves the ref of a SENT destination out (it is in_ref) and keeps any other
   kind as [ref FP_NARROW_OTHER]: fastpath.h's fp_dest reads both layouts into [id ref aux]. */

enum { K_NONE = 0, K_SENT = 1, K_SHARED = 2, K_TUPLE = 3 };
enum { LB_KEY = 0, LB_OWN = 1, LB_SHARED = 2, LB_EDIT = 3 };
#define WHOLE 1u
#define MAX_SHARED 16
#define MAX_RUNS 8 /* of them, runs of bytes found in edited outputs (LB_EDIT) */
#define POS_LIMIT (1ULL << 53)
#define MAX_WIDTH 4096
#define HDR 4 /* words before the destinations: h0 h1 in_id in_ref */
/* relay/native/fastpath.h describes this layout to relay.native._cstage's route_hits */
_Static_assert((int)K_NONE == (int)FP_K_NONE && (int)K_SENT == (int)FP_K_SENT && (int)K_SHARED == (int)FP_K_SHARED && (int)K_TUPLE == (int)FP_K_TUPLE,
               "fastpath.h kinds");
_Static_assert((int)LB_KEY == (int)FP_LB_KEY && (int)LB_OWN == (int)FP_LB_OWN && (int)LB_SHARED == (int)FP_LB_SHARED && (int)LB_EDIT == (int)FP_LB_EDIT,
               "fastpath.h label modes");
_Static_assert(WHOLE == FP_WHOLE && HDR == FP_HDR, "fastpath.h entry header");

typedef struct {
    PyObject_HEAD
    Py_ssize_t width;   /* decisions per entry; 0 until the first value fixes it */
    size_t dw;          /* words a destination takes: FP_DW_NARROW until a decision needs FP_DW_WIDE */
    size_t words;       /* uint64 words per entry: HDR + dw * (width - 1) */
    uint64_t *entries;  /* n used, cap allocated */
    size_t n, cap;
    uint32_t *index;    /* isize slots, a power of two (0: none allocated) */
    size_t isize;
    size_t owned;       /* bytes of objects the entries hold that nothing else shares */
    PyObject *shared[MAX_SHARED];
    int nshared, nruns;
    size_t shared_bytes; /* the runs' bytes objects (only the table holds them) */
} Table;

static inline uint64_t *entry_at(Table *t, size_t i) { return t->entries + i * t->words; }
static inline size_t wide_words(const Table *t) { return HDR + FP_DW_WIDE * (size_t)(t->width - 1); }

static size_t obj_size(PyObject *o) {
    /* immutable sizes only (bytes, tuple); rounded as the allocator does */
    size_t s = (size_t)Py_TYPE(o)->tp_basicsize;
    if (PyBytes_CheckExact(o))
        s += (size_t)Py_SIZE(o);
    else if (PyTuple_CheckExact(o))
        s += (size_t)Py_SIZE(o) * sizeof(PyObject *) + 16; /* and its GC header */
    return (s + 15) & ~(size_t)15;
}

static size_t stored_size(PyObject *o) {
    /* memory of a value stored as is: the object and the bytes and tuples it holds (shallow) */
    size_t s = obj_size(o);
    if (PyTuple_CheckExact(o))
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++) {
            PyObject *x = PyTuple_GET_ITEM(o, i);
            if (PyBytes_CheckExact(x) || PyTuple_CheckExact(x))
                s += obj_size(x);
        }
    return s;
}

static inline int bytes_equal(PyObject *a, const char *p, Py_ssize_t n) {
    return PyBytes_GET_SIZE(a) == n && memcmp(PyBytes_AS_STRING(a), p, (size_t)n) == 0;
}

/* ---- packing ---------------------------------------------------------------------------------- */

/* Offsets of the key's field-1 entries (tag 0x0a, length, payload): their count (offs[count] is
   the end), or -1 when the key is not such a run of at most MAX_ENTRIES entries. */
#define MAX_ENTRIES 64
#define EDIT_MASK_BITS 50
static int split_entries(const uint8_t *p, size_t n, size_t *offs) {
    size_t i = 0;
    int count = 0;
    while (i < n) {
        if (count == MAX_ENTRIES || p[i] != 0x0a)
            return -1;
        size_t j = i + 1, len = 0;
        int shift = 0;
        for (;;) {
            if (j >= n || shift > 28)
                return -1;
            uint8_t b = p[j++];
            len |= (size_t)(b & 0x7f) << shift;
            if (!(b & 0x80))
                break;
            shift += 7;
        }
        if (len > n - j)
            return -1;
        offs[count++] = i;
        i = j + len;
    }
    offs[count] = n;
    return count;
}

/* Length of the edited key (aux as LB_EDIT), written to out when out is not NULL. */
static size_t edit_apply(const uint8_t *key, const size_t *offs, int count, uint64_t aux, const char *run,
                         size_t run_len, uint8_t *out) {
    uint64_t mask = aux >> 14;
    int before = (int)((aux >> 8) & 63);
    size_t n = 0;
    for (int i = 0; i <= count; i++) {
        if (i == before && run != NULL) {
            if (out)
                memcpy(out + n, run, run_len);
            n += run_len;
        }
        if (i == count)
            break;
        if (i < EDIT_MASK_BITS && (mask >> i) & 1)
            continue;
        size_t len = offs[i + 1] - offs[i];
        if (out)
            memcpy(out + n, key + offs[i], len);
        n += len;
    }
    return n;
}

/* The table's shared object equal to p[0:n], registered when new; its index, or -1 (full). */
static int shared_run(Table *t, const char *p, size_t n) {
    for (int i = 0; i < t->nshared; i++)
        if (bytes_equal(t->shared[i], p, (Py_ssize_t)n))
            return i;
    /* at most MAX_RUNS made here: runs that are not shared (a value the rules set per series) must
       not take every place from the objects that are (a stage's external labels) */
    if (t->nshared == MAX_SHARED || t->nruns == MAX_RUNS)
        return -1;
    PyObject *b = PyBytes_FromStringAndSize(p, (Py_ssize_t)n);
    if (b == NULL) {
        PyErr_Clear(); /* then the output is kept as its own bytes */
        return -1;
    }
    t->nruns++;
    t->shared_bytes += obj_size(b);
    t->shared[t->nshared] = b;
    return t->nshared++;
}

/* lb as an edit of key (LB_EDIT aux without the CLAIM bit), or 0 when it is not one. */
static uint64_t edit_of(Table *t, PyObject *key, PyObject *lb) {
    const uint8_t *k = (const uint8_t *)PyBytes_AS_STRING(key), *l = (const uint8_t *)PyBytes_AS_STRING(lb);
    size_t kn = (size_t)PyBytes_GET_SIZE(key), ln = (size_t)PyBytes_GET_SIZE(lb);
    size_t offs[MAX_ENTRIES + 1];
    int count = split_entries(k, kn, offs);
    if (count <= 0)
        return 0;
    uint64_t mask = 0;
    size_t p = 0, run_start = 0, run_len = 0;
    int before = -1;
    for (int i = 0; i < count; i++) {
        size_t len = offs[i + 1] - offs[i];
        if (len <= ln - p && memcmp(l + p, k + offs[i], len) == 0) {
            p += len;
            continue;
        }
        if (before < 0) { /* is entry i further on? then what comes before it was put in */
            for (size_t q = p + 1; q + len <= ln; q++)
                if (l[q] == 0x0a && memcmp(l + q, k + offs[i], len) == 0) {
                    before = i;
                    run_start = p;
                    run_len = q - p;
                    p = q + len;
                    break;
                }
            if (before == i)
                continue;
        }
        if (i >= EDIT_MASK_BITS)
            return 0;
        mask |= 1ULL << i; /* left out */
    }
    if (p < ln) {
        if (before >= 0)
            return 0;
        before = count;
        run_start = p;
        run_len = ln - p;
    }
    if (before > 63)
        return 0;
    uint64_t aux = ((uint64_t)LB_EDIT << 1) | (mask << 14);
    const char *run = before >= 0 && run_len ? (const char *)l + run_start : NULL;
    if (run != NULL)
        aux |= (uint64_t)before << 8;
    /* the edit must give lb exactly */
    if (edit_apply(k, offs, count, aux, run, run_len, NULL) != ln)
        return 0;
    uint8_t stack[512];
    uint8_t *buf = ln <= sizeof(stack) ? stack : PyMem_Malloc(ln);
    if (buf == NULL)
        return 0;
    edit_apply(k, offs, count, aux, run, run_len, buf);
    int same = memcmp(buf, l, ln) == 0;
    if (buf != stack)
        PyMem_Free(buf);
    if (!same)
        return 0;
    if (run != NULL) {
        int idx = shared_run(t, run, run_len);
        if (idx < 0)
            return 0;
        aux |= (uint64_t)(idx + 1) << 3;
    }
    return aux;
}

/* The bytes an LB_EDIT aux makes of key (the run held by the caller); NULL with an error set. */
static PyObject *edit_build(PyObject *key, uint64_t aux, PyObject *run) {
    size_t offs[MAX_ENTRIES + 1];
    const uint8_t *k = (const uint8_t *)PyBytes_AS_STRING(key);
    int count = split_entries(k, (size_t)PyBytes_GET_SIZE(key), offs);
    if (count < 0) {
        PyErr_SetString(PyExc_SystemError, "DecisionTable: an edited key no longer splits");
        return NULL;
    }
    const char *r = run == NULL ? NULL : PyBytes_AS_STRING(run);
    size_t rn = run == NULL ? 0 : (size_t)PyBytes_GET_SIZE(run);
    size_t n = edit_apply(k, offs, count, aux, r, rn, NULL);
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (b != NULL)
        edit_apply(k, offs, count, aux, r, rn, (uint8_t *)PyBytes_AS_STRING(b));
    return b;
}

/* Packs one destination decision into w[0..2] (new references taken); 0, or -1 with an error set. */
static int pack_dest(Table *t, PyObject *d, PyObject *key, uint64_t *w, size_t *owned) {
    w[0] = w[1] = w[2] = 0;
    if (d == Py_None)
        return 0;
    if (!PyTuple_CheckExact(d) || PyTuple_GET_SIZE(d) != 3)
        goto as_tuple;
    PyObject *lb = PyTuple_GET_ITEM(d, 0), *sid = PyTuple_GET_ITEM(d, 1), *metric = PyTuple_GET_ITEM(d, 2);
    if (!PyBytes_CheckExact(lb) || !PyLong_CheckExact(sid))
        goto as_tuple;
    int overflow = 0;
    long long small = PyLong_AsLongLongAndOverflow(sid, &overflow);
    if (small == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || (!overflow && small < 0))
        goto as_tuple; /* aggregated (negative), or unusual */
    if (small == 0 && !overflow && PyBytes_GET_SIZE(lb) == 0) {
        Py_INCREF(d); /* a drop: one tuple shared by every series dropped for that reason */
        w[1] = (uint64_t)(uintptr_t)d | K_SHARED;
        return 0;
    }
    uint64_t low, high = 0;
    if (!overflow) {
        low = (uint64_t)small;
    } else {
        low = PyLong_AsUnsignedLongLongMask(sid);
        if (low == (uint64_t)-1 && PyErr_Occurred())
            return -1;
        PyObject *sixty_four = PyLong_FromLong(64);
        if (sixty_four == NULL)
            return -1;
        PyObject *h = PyNumber_Rshift(sid, sixty_four);
        Py_DECREF(sixty_four);
        if (h == NULL)
            return -1;
        high = PyLong_AsUnsignedLongLong(h);
        Py_DECREF(h);
        if (high == (uint64_t)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            goto as_tuple;
        }
    }
    uint64_t claim = high & 1, pos1 = high >> 1;
    if (pos1 >= POS_LIMIT)
        goto as_tuple;
    uint64_t aux;
    if (lb == key || bytes_equal(lb, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))) {
        aux = claim | (LB_KEY << 1) | (pos1 << 11);
    } else if (pos1) { /* lb with a position: a stage's external labels, shared by many entries */
        int i = 0;
        while (i < t->nshared && t->shared[i] != lb)
            i++;
        if (i == t->nshared) {
            if (t->nshared == MAX_SHARED)
                goto as_tuple;
            Py_INCREF(lb);
            t->shared[t->nshared++] = lb;
        }
        aux = claim | (LB_SHARED << 1) | ((uint64_t)i << 3) | (pos1 << 11);
    } else if ((aux = edit_of(t, key, lb)) != 0) {
        aux |= claim;
    } else {
        Py_INCREF(lb);
        aux = (uint64_t)(uintptr_t)lb | claim | (LB_OWN << 1);
        *owned += obj_size(lb);
    }
    Py_INCREF(metric);
    w[0] = low;
    w[1] = (uint64_t)(uintptr_t)metric | K_SENT;
    w[2] = aux;
    return 0;
as_tuple:
    Py_INCREF(d);
    w[1] = (uint64_t)(uintptr_t)d | K_TUPLE;
    *owned += stored_size(d);
    return 0;
}

static void release_words(Table *t, uint64_t *e, size_t dw, size_t *owned);

/* Packs ``value`` for ``key`` into e, wide_words(t) words in the wide layout (hash words left
   alone); 0 or -1 with an error set and nothing held. */
static int pack(Table *t, PyObject *key, PyObject *value, uint64_t *e, size_t *owned) {
    memset(e + 2, 0, (wide_words(t) - 2) * 8);
    Py_ssize_t width = t->width;
    if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != width)
        goto whole;
    PyObject *in = PyTuple_GET_ITEM(value, 0);
    if (!PyTuple_CheckExact(in) || PyTuple_GET_SIZE(in) != 3)
        goto whole;
    PyObject *k = PyTuple_GET_ITEM(in, 0), *id = PyTuple_GET_ITEM(in, 1);
    if (!PyBytes_CheckExact(k) || !PyLong_CheckExact(id))
        goto whole;
    if (k != key && !bytes_equal(k, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)))
        goto whole;
    int overflow = 0;
    long long in_id = PyLong_AsLongLongAndOverflow(id, &overflow);
    if (in_id == -1 && PyErr_Occurred())
        return -1;
    if (overflow || in_id < 0)
        goto whole;
    size_t own = 0;
    for (Py_ssize_t j = 1; j < width; j++) {
        if (pack_dest(t, PyTuple_GET_ITEM(value, j), key, e + HDR + FP_DW_WIDE * (j - 1), &own) < 0) {
            size_t ignored = 0;
            release_words(t, e, FP_DW_WIDE, &ignored);
            return -1;
        }
    }
    PyObject *metric = PyTuple_GET_ITEM(in, 2);
    Py_INCREF(metric);
    e[2] = (uint64_t)in_id;
    e[3] = (uint64_t)(uintptr_t)metric;
    *owned += own;
    return 0;
whole:
    Py_INCREF(value);
    e[3] = (uint64_t)(uintptr_t)value | WHOLE;
    *owned += stored_size(value);
    return 0;
}

/* Drops the references of entry e, dw words a destination (its owned bytes added into *owned). */
static void release_words(Table *t, uint64_t *e, size_t dw, size_t *owned) {
    if (e[3] & WHOLE) {
        PyObject *v = (PyObject *)(uintptr_t)(e[3] & ~(uint64_t)WHOLE);
        *owned += stored_size(v);
        Py_DECREF(v);
        return;
    }
    for (Py_ssize_t j = 1; j < t->width; j++) {
        uint64_t w[3];
        fp_dest(e, dw, (size_t)(j - 1), w);
        PyObject *o = (PyObject *)(uintptr_t)(w[1] & ~(uint64_t)3);
        switch (w[1] & 3) {
        case K_SENT:
            if (((w[2] >> 1) & 3) == LB_OWN) {
                PyObject *lb = (PyObject *)(uintptr_t)(w[2] & ~(uint64_t)7);
                *owned += obj_size(lb);
                Py_DECREF(lb);
            }
            Py_DECREF(o);
            break;
        case K_TUPLE:
            *owned += stored_size(o);
            Py_DECREF(o);
            break;
        case K_SHARED:
            Py_DECREF(o);
            break;
        default:
            break;
        }
    }
    PyObject *metric = (PyObject *)(uintptr_t)e[3];
    Py_XDECREF(metric);
}

/* ---- unpacking -------------------------------------------------------------------------------- */


/* A copy of one entry in the wide layout and one reference to every object its decision is made
   of, taken before anything is allocated (an allocation may run a GC whose finalizers could reach
   the table). */
#define STACK_DESTS 16
typedef struct {
    uint64_t stack[HDR + 3 * STACK_DESTS];
    PyObject *lbs_stack[STACK_DESTS];
    uint64_t *e;
    PyObject **lbs; /* per destination of kind SENT: its lb object */
    Py_ssize_t width;
} Held;

static void held_free(Held *c) {
    if (c->e != c->stack)
        PyMem_Free(c->e);
    if (c->lbs != c->lbs_stack)
        PyMem_Free(c->lbs);
}

static void expand_entry(const Table *t, size_t dw, const uint64_t *e, uint64_t *out);

static int hold(Table *t, const uint64_t *entry, PyObject *key, Held *c) {
    c->width = t->width;
    c->e = c->stack;
    c->lbs = c->lbs_stack;
    if (t->width > STACK_DESTS) {
        c->e = PyMem_Malloc(wide_words(t) * 8);
        c->lbs = PyMem_Malloc(sizeof(PyObject *) * (size_t)t->width);
        if (c->e == NULL || c->lbs == NULL) {
            held_free(c);
            PyErr_NoMemory();
            return -1;
        }
    }
    uint64_t *e = c->e;
    expand_entry(t, t->dw, entry, e);
    if (e[3] & WHOLE) {
        Py_INCREF((PyObject *)(uintptr_t)(e[3] & ~(uint64_t)WHOLE));
        return 0;
    }
    Py_INCREF((PyObject *)(uintptr_t)e[3]);
    for (Py_ssize_t j = 1; j < t->width; j++) {
        const uint64_t *w = e + HDR + FP_DW_WIDE * (j - 1);
        PyObject *o = (PyObject *)(uintptr_t)(w[1] & ~(uint64_t)3), *lb = NULL;
        Py_XINCREF(o);
        if ((w[1] & 3) == K_SENT) {
            uint64_t aux = w[2];
            switch ((aux >> 1) & 3) {
            case LB_OWN: lb = (PyObject *)(uintptr_t)(aux & ~(uint64_t)7); break;
            case LB_SHARED: lb = t->shared[(aux >> 3) & 0xff]; break;
            case LB_EDIT: lb = (aux >> 3) & 31 ? t->shared[((aux >> 3) & 31) - 1] : NULL; break;
            default: lb = key; break;
            }
            Py_XINCREF(lb);
        }
        c->lbs[j - 1] = lb;
    }
    return 0;
}

static PyObject *sid_object(uint64_t low, uint64_t high) {
    if (!high)
        return PyLong_FromUnsignedLongLong(low);
    unsigned char buf[16];
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)(low >> (8 * i));
        buf[8 + i] = (unsigned char)(high >> (8 * i));
    }
#if PY_VERSION_HEX >= 0x030D0000
    return PyLong_FromUnsignedNativeBytes(buf, 16, Py_ASNATIVEBYTES_LITTLE_ENDIAN);
#else
    return _PyLong_FromByteArray(buf, 16, 1, 0);
#endif
}

/* Drops the references of destinations j.. of a held copy (after a failure). */
static void unhold_from(Held *c, Py_ssize_t j) {
    for (; j < c->width; j++) {
        const uint64_t *w = c->e + HDR + 3 * (j - 1);
        Py_XDECREF((PyObject *)(uintptr_t)(w[1] & ~(uint64_t)3));
        Py_XDECREF(c->lbs[j - 1]);
    }
}

/* The decision of a held copy, consuming every reference held; ``key`` (borrowed): the caller's
   key object, or None. Frees the copy's buffers. */
static PyObject *unpack(Held *c, PyObject *key) {
    const uint64_t *e = c->e;
    PyObject *out = NULL;
    if (e[3] & WHOLE) {
        out = (PyObject *)(uintptr_t)(e[3] & ~(uint64_t)WHOLE);
        goto done;
    }
    Py_ssize_t width = c->width, j = 1;
    PyObject *metric_in = (PyObject *)(uintptr_t)e[3];
    out = PyTuple_New(width);
    PyObject *in = PyTuple_New(3);
    PyObject *id = PyLong_FromUnsignedLongLong(e[2]);
    if (out == NULL || in == NULL || id == NULL) {
        Py_XDECREF(out); Py_XDECREF(in); Py_XDECREF(id);
        Py_DECREF(metric_in);
        out = NULL;
        unhold_from(c, 1);
        goto done;
    }
    Py_INCREF(key);
    PyTuple_SET_ITEM(in, 0, key);
    PyTuple_SET_ITEM(in, 1, id);
    PyTuple_SET_ITEM(in, 2, metric_in);
    int atomic = PyUnicode_CheckExact(metric_in) && (key == Py_None || PyBytes_CheckExact(key));
    if (atomic)
        PyObject_GC_UnTrack(in);
    PyTuple_SET_ITEM(out, 0, in);
    for (; j < width; j++) {
        const uint64_t *w = e + HDR + 3 * (j - 1);
        PyObject *o = (PyObject *)(uintptr_t)(w[1] & ~(uint64_t)3);
        if ((w[1] & 3) != K_SENT) {
            if (o == NULL) {
                Py_INCREF(Py_None);
                o = Py_None;
            } else if ((w[1] & 3) == K_TUPLE) {
                atomic = 0; /* stored as given: may hold anything */
            }
            PyTuple_SET_ITEM(out, j, o);
            continue;
        }
        uint64_t aux = w[2];
        int mode = (int)((aux >> 1) & 3);
        uint64_t high = mode == LB_OWN || mode == LB_EDIT ? (aux & 1) : (aux & 1) | ((aux >> 11) << 1);
        if (mode == LB_EDIT) { /* lb made from the key (None without one, as popitem and values) */
            PyObject *run = c->lbs[j - 1];
            c->lbs[j - 1] = key == Py_None ? (Py_INCREF(Py_None), Py_None) : edit_build(key, aux, run);
            Py_XDECREF(run);
            if (c->lbs[j - 1] == NULL) {
                Py_DECREF(o);
                Py_DECREF(out);
                out = NULL;
                unhold_from(c, j + 1);
                goto done;
            }
        }
        PyObject *d = PyTuple_New(3);
        PyObject *sid = sid_object(w[0], high);
        if (d == NULL || sid == NULL) {
            Py_XDECREF(d); Py_XDECREF(sid);
            Py_DECREF(out);
            out = NULL;
            unhold_from(c, j);
            goto done;
        }
        PyTuple_SET_ITEM(d, 0, c->lbs[j - 1]);
        PyTuple_SET_ITEM(d, 1, sid);
        PyTuple_SET_ITEM(d, 2, o);
        if (PyUnicode_CheckExact(o))
            PyObject_GC_UnTrack(d); /* bytes, int, str: never part of a cycle (as the GC would find) */
        else
            atomic = 0;
        PyTuple_SET_ITEM(out, j, d);
    }
    if (atomic)
        PyObject_GC_UnTrack(out); /* holds only the tuples above, None and shared drops */
done:
    held_free(c);
    return out;
}

/* ---- arrays (bigarray.h: 1 MiB and more in their own mappings, grown by mremap) ---------------- */

static inline size_t entries_bytes(const Table *t) { return t->cap * t->words * 8; }

/* ---- the index -------------------------------------------------------------------------------- */

/* Slot of the entry with hash h, or the empty slot where it would go (*found 0). */
static inline size_t find_slot(Table *t, const uint64_t h[2], int *found) {
    size_t mask = t->isize - 1, s = (size_t)h[0] & mask;
    for (;;) {
        uint32_t v = t->index[s];
        if (v == 0) {
            *found = 0;
            return s;
        }
        const uint64_t *e = entry_at(t, v - 1);
        if (e[0] == h[0] && (e[1] & FP_H1_MASK) == h[1]) {
            *found = 1;
            return s;
        }
        s = (s + 1) & mask;
    }
}

static int rebuild_index(Table *t, size_t isize) {
    uint32_t *index = arr_calloc(isize, sizeof(uint32_t));
    if (index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    arr_free(t->index, t->isize * sizeof(uint32_t));
    t->index = index;
    t->isize = isize;
    size_t mask = isize - 1;
    for (size_t i = 0; i < t->n; i++) {
        size_t s = (size_t)entry_at(t, i)[0] & mask;
        while (index[s])
            s = (s + 1) & mask;
        index[s] = (uint32_t)(i + 1);
    }
    return 0;
}

static int set_capacity(Table *t, size_t cap) {
    if (cap == 0 || cap > SIZE_MAX / 8 / t->words) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t *entries = arr_realloc(t->entries, t->entries ? entries_bytes(t) : 0, cap * t->words * 8);
    if (entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->entries = entries;
    t->cap = cap;
    return 0;
}

static void free_arrays(Table *t) {
    arr_free(t->index, t->isize * sizeof(uint32_t));
    arr_free(t->entries, entries_bytes(t));
    t->index = NULL;
    t->entries = NULL;
    t->isize = t->cap = t->n = 0;
}

/* Room for one more entry (index at most 3/4 full). */
static int reserve_one(Table *t) {
    if (t->isize == 0 || (t->n + 1) * 4 > t->isize * 3) {
        size_t isize = t->isize ? t->isize * 2 : 8;
        if (isize > ((size_t)1 << 31)) {
            PyErr_SetString(PyExc_MemoryError, "DecisionTable: too many entries");
            return -1;
        }
        if (rebuild_index(t, isize) < 0)
            return -1;
    }
    if (t->n == t->cap && set_capacity(t, t->cap ? t->cap * 2 : 6) < 0)
        return -1;
    return 0;
}

/* Removes the entry at index slot s: backward-shift the probe run, move the last entry into the
   hole. The caller has copied the entry (its references) beforehand. */
static void remove_slot(Table *t, size_t s) {
    size_t mask = t->isize - 1, hole = t->index[s] - 1, i = s, j = s;
    for (;;) { /* slot i is free: pull back the next entry of the run that may live there */
        j = (j + 1) & mask;
        uint32_t v = t->index[j];
        if (v == 0)
            break;
        size_t home = (size_t)entry_at(t, v - 1)[0] & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) { /* home not in (i, j]: move it to i */
            t->index[i] = v;
            i = j;
        }
    }
    t->index[i] = 0;
    size_t last = t->n - 1;
    if (hole != last) {
        uint64_t *from = entry_at(t, last), h[2] = {from[0], from[1] & FP_H1_MASK};
        int found;
        size_t ls = find_slot(t, h, &found);
        memcpy(entry_at(t, hole), from, t->words * 8);
        t->index[ls] = (uint32_t)(hole + 1);
    }
    t->n = last;
}

/* After a removal: free everything when empty, shrink when the index is under 3/16 full. */
static void maybe_shrink(Table *t) {
    if (t->n == 0) {
        free_arrays(t);
        return;
    }
    if (t->isize > 8 && t->n * 16 < t->isize * 3) {
        size_t isize = t->isize;
        while (isize > 8 && t->n * 16 < isize * 3)
            isize /= 2;
        if (rebuild_index(t, isize) < 0) {
            PyErr_Clear(); /* keep the bigger index: still correct */
            return;
        }
        size_t cap = t->n * 2 > 6 ? t->n * 2 : 6;
        if (cap < t->cap && set_capacity(t, cap) < 0)
            PyErr_Clear();
    }
}

/* ---- the type --------------------------------------------------------------------------------- */

static PyTypeObject TableType;

static int check_key(PyObject *key) {
    if (!PyBytes_Check(key)) {
        PyErr_Format(PyExc_TypeError, "DecisionTable keys are bytes, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    return 0;
}

static int set_width(Table *t, Py_ssize_t width) {
    if (width < 1 || width > MAX_WIDTH) {
        PyErr_Format(PyExc_ValueError, "DecisionTable width must be 1 to %d, not %zd", MAX_WIDTH, width);
        return -1;
    }
    t->width = width;
    t->dw = width == 2 ? FP_DW_COMPACT : FP_DW_NARROW;
    t->words = HDR + t->dw * (size_t)(width - 1);
    return 0;
}

#define NO_COMPACT UINT64_MAX

/* The compact aux (fastpath.h) of wide destination w of an input under metric in_ref, or NO_COMPACT:
   sent under another metric, label bytes edited or of its own, a position past the limit. */
static uint64_t compact_aux(const uint64_t *w, uint64_t in_ref) {
    if ((w[1] & 3) != K_SENT)
        return FP_COMPACT_OTHER;
    uint64_t aux = w[2], mode = (aux >> 1) & 3, idx = (aux >> 3) & 0xff, pos1 = aux >> 11;
    if ((w[1] & ~(uint64_t)3) != in_ref || (mode != LB_KEY && mode != LB_SHARED) || idx > 15
        || pos1 >= FP_COMPACT_POS_LIMIT)
        return NO_COMPACT;
    return (aux & 1) | (uint64_t)(mode == LB_SHARED) << 1 | idx << 2 | pos1 << 6;
}

/* The layout (words a destination) entry e (wide layout) needs at the least: wide once a destination
   is sent under a metric other than the input's. */
static size_t layout_for(const Table *t, const uint64_t *e) {
    if (e[3] & WHOLE)
        return FP_DW_COMPACT;
    size_t need = t->width == 2 ? FP_DW_COMPACT : FP_DW_NARROW;
    for (Py_ssize_t j = 1; j < t->width; j++) {
        const uint64_t *w = e + HDR + FP_DW_WIDE * (j - 1);
        if ((w[1] & 3) == K_SENT && (w[1] & ~(uint64_t)3) != e[3])
            return FP_DW_WIDE;
        if (need == FP_DW_COMPACT && compact_aux(w, e[3]) == NO_COMPACT)
            need = FP_DW_NARROW;
    }
    return need;
}

/* Entry e (wide layout, the key hash without an aux) into dst, dw words a destination (a layout
   layout_for allows). No SENT aux is FP_NARROW_OTHER (LB_KEY's bits 3-10 are 0), no compact one
   FP_COMPACT_OTHER (its position is under the limit). */
static void put_entry(const Table *t, size_t dw, uint64_t *dst, const uint64_t *e) {
    if (dw == FP_DW_WIDE) {
        memcpy(dst, e, wide_words(t) * 8);
        return;
    }
    memcpy(dst, e, HDR * 8);
    int whole = (e[3] & WHOLE) != 0;
    for (Py_ssize_t j = 1; j < t->width; j++) {
        const uint64_t *w = e + HDR + FP_DW_WIDE * (j - 1);
        uint64_t *d = dst + HDR + dw * (size_t)(j - 1);
        int sent = (w[1] & 3) == K_SENT && !whole;
        d[0] = sent ? w[0] : w[1];
        if (dw == FP_DW_NARROW)
            d[1] = sent ? w[2] : FP_NARROW_OTHER;
        else if (!whole)
            dst[1] |= compact_aux(w, e[3]) << 48;
    }
}

/* Entry e, dw words a destination, into the wide layout at out (the key hash without an aux). */
static void expand_entry(const Table *t, size_t dw, const uint64_t *e, uint64_t *out) {
    memcpy(out, e, HDR * 8);
    out[1] &= FP_H1_MASK;
    for (Py_ssize_t j = 1; j < t->width; j++) {
        uint64_t *w = out + HDR + FP_DW_WIDE * (j - 1);
        if (e[3] & WHOLE)
            w[0] = w[1] = w[2] = 0;
        else
            fp_dest(e, dw, (size_t)(j - 1), w);
    }
}

/* The table's entries in a layout of dw (more) words a destination, for good: in place, from the
   last entry down (each one's new place starts at or after its old one, which is read whole
   first); -1 with MemoryError and the table as it was. */
static int widen(Table *t, size_t dw) {
    size_t words = HDR + dw * (size_t)(t->width - 1), old = t->words, ww = wide_words(t);
    if (t->entries != NULL) {
        uint64_t stack[HDR + 3 * 15];
        uint64_t *tmp = ww <= sizeof(stack) / 8 ? stack : PyMem_Malloc(ww * 8);
        uint64_t *entries = NULL;
        if (tmp != NULL && t->cap <= SIZE_MAX / 8 / words)
            entries = arr_realloc(t->entries, entries_bytes(t), t->cap * words * 8);
        if (entries == NULL) {
            if (tmp != stack)
                PyMem_Free(tmp);
            PyErr_NoMemory();
            return -1;
        }
        t->entries = entries;
        for (size_t i = t->n; i-- > 0;) {
            expand_entry(t, t->dw, entries + i * old, tmp);
            put_entry(t, dw, entries + i * words, tmp);
        }
        if (tmp != stack)
            PyMem_Free(tmp);
    }
    t->dw = dw;
    t->words = words;
    return 0;
}

static int Table_init(Table *t, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"width", NULL};
    Py_ssize_t width = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:DecisionTable", kwlist, &width))
        return -1;
    if (t->n || t->width) {
        PyErr_SetString(PyExc_TypeError, "DecisionTable is already initialised");
        return -1;
    }
    return width ? set_width(t, width) : 0;
}

static void clear_all(Table *t) {
    /* detach first, then drop references (a finalizer then sees an empty table) */
    uint64_t *entries = t->entries;
    size_t n = t->n, words = t->words, dw = t->dw, ebytes = entries_bytes(t);
    PyObject *shared[MAX_SHARED];
    int nshared = t->nshared;
    memcpy(shared, t->shared, sizeof(shared));
    arr_free(t->index, t->isize * sizeof(uint32_t));
    t->index = NULL;
    t->entries = NULL;
    t->isize = t->cap = t->n = 0;
    t->owned = 0;
    t->nshared = t->nruns = 0;
    t->shared_bytes = 0;
    size_t ignored = 0;
    for (size_t i = 0; i < n; i++)
        release_words(t, entries + i * words, dw, &ignored);
    arr_free(entries, ebytes);
    for (int i = 0; i < nshared; i++)
        Py_DECREF(shared[i]);
}

static void Table_dealloc(Table *t) {
    clear_all(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t Table_len(Table *t) { return (Py_ssize_t)t->n; }

/* The decision for key, a new reference; NULL without an error when absent. */
static PyObject *lookup(Table *t, PyObject *key) {
    if (t->n == 0)
        return NULL;
    uint64_t h[2];
    key_hash((const uint8_t *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), h);
    int found;
    size_t s = find_slot(t, h, &found);
    if (!found)
        return NULL;
    Held c;
    if (hold(t, entry_at(t, t->index[s] - 1), key, &c) < 0)
        return NULL;
    return unpack(&c, key);
}

static PyObject *Table_get(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    if (check_key(args[0]) < 0)
        return NULL;
    PyObject *r = lookup(t, args[0]);
    if (r == NULL && !PyErr_Occurred()) {
        r = nargs == 2 ? args[1] : Py_None;
        Py_INCREF(r);
    }
    return r;
}

static PyObject *Table_subscript(Table *t, PyObject *key) {
    if (check_key(key) < 0)
        return NULL;
    PyObject *r = lookup(t, key);
    if (r == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    return r;
}

static int Table_contains(Table *t, PyObject *key) {
    if (check_key(key) < 0)
        return -1;
    if (t->n == 0)
        return 0;
    uint64_t h[2];
    key_hash((const uint8_t *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), h);
    int found;
    find_slot(t, h, &found);
    return found;
}

static int store(Table *t, PyObject *key, PyObject *value) {
    if (t->width == 0) {
        Py_ssize_t w = PyTuple_CheckExact(value) ? PyTuple_GET_SIZE(value) : 1;
        if (set_width(t, w >= 1 && w <= MAX_WIDTH ? w : 1) < 0)
            return -1;
    }
    uint64_t h[2];
    key_hash((const uint8_t *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), h);
    uint64_t stack[HDR + 3 * 15];
    size_t ww = wide_words(t);
    uint64_t *fresh = ww <= sizeof(stack) / 8 ? stack : PyMem_Malloc(ww * 8); /* the wide layout */
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    fresh[0] = h[0];
    fresh[1] = h[1];
    size_t own = 0;
    int rc = pack(t, key, value, fresh, &own);
    if (rc < 0)
        goto done;
    size_t need = layout_for(t, fresh);
    if (need > t->dw && widen(t, need) < 0) {
        size_t ignored = 0;
        release_words(t, fresh, FP_DW_WIDE, &ignored);
        rc = -1;
        goto done;
    }
    int found = 0;
    size_t s = 0;
    if (t->n)
        s = find_slot(t, h, &found);
    if (found) { /* replace: swap in the new entry, then drop the old one's references */
        uint64_t *e = entry_at(t, t->index[s] - 1);
        uint64_t *old = PyMem_Malloc(t->words * 8);
        if (old == NULL) {
            size_t ignored = 0;
            release_words(t, fresh, FP_DW_WIDE, &ignored);
            PyErr_NoMemory();
            rc = -1;
            goto done;
        }
        memcpy(old, e, t->words * 8);
        put_entry(t, t->dw, e, fresh);
        size_t freed = 0;
        t->owned += own;
        release_words(t, old, t->dw, &freed);
        t->owned -= freed;
        PyMem_Free(old);
        goto done;
    }
    if (reserve_one(t) < 0) {
        size_t ignored = 0;
        release_words(t, fresh, FP_DW_WIDE, &ignored);
        rc = -1;
        goto done;
    }
    s = find_slot(t, h, &found);
    put_entry(t, t->dw, entry_at(t, t->n), fresh);
    t->index[s] = (uint32_t)(t->n + 1);
    t->n++;
    t->owned += own;
done:
    if (fresh != stack)
        PyMem_Free(fresh);
    return rc;
}

/* Removes the entry at slot s and returns its decision (key: the caller's key or None). */
static PyObject *take_slot(Table *t, size_t s, PyObject *key) {
    Held c;
    if (hold(t, entry_at(t, t->index[s] - 1), key, &c) < 0) /* what unpack consumes */
        return NULL;
    remove_slot(t, s);
    size_t freed = 0;
    release_words(t, c.e, FP_DW_WIDE, &freed); /* the entry's own references (the copy is wide) */
    t->owned -= freed;
    maybe_shrink(t);
    return unpack(&c, key);
}

static int remove_key(Table *t, PyObject *key, PyObject **out) {
    /* 1 removed (*out its decision, if out), 0 absent, -1 error */
    if (t->n == 0)
        return 0;
    uint64_t h[2];
    key_hash((const uint8_t *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), h);
    int found;
    size_t s = find_slot(t, h, &found);
    if (!found)
        return 0;
    PyObject *r = take_slot(t, s, key);
    if (r == NULL)
        return -1;
    if (out)
        *out = r;
    else
        Py_DECREF(r);
    return 1;
}

static int Table_ass_subscript(Table *t, PyObject *key, PyObject *value) {
    if (check_key(key) < 0)
        return -1;
    if (value != NULL)
        return store(t, key, value);
    int rc = remove_key(t, key, NULL);
    if (rc == 0)
        PyErr_SetObject(PyExc_KeyError, key);
    return rc > 0 ? 0 : -1;
}

static PyObject *Table_pop(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "pop expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    if (check_key(args[0]) < 0)
        return NULL;
    PyObject *r = NULL;
    int rc = remove_key(t, args[0], &r);
    if (rc < 0)
        return NULL;
    if (rc == 0) {
        if (nargs == 1) {
            PyErr_SetObject(PyExc_KeyError, args[0]);
            return NULL;
        }
        r = args[1];
        Py_INCREF(r);
    }
    return r;
}

static PyObject *Table_popitem(Table *t, PyObject *Py_UNUSED(ignored)) {
    if (t->n == 0) {
        PyErr_SetString(PyExc_KeyError, "popitem(): DecisionTable is empty");
        return NULL;
    }
    const uint64_t *last = entry_at(t, t->n - 1);
    unsigned char digest[16];
    for (int i = 0; i < 8; i++) {
        digest[i] = (unsigned char)(last[0] >> (8 * i));
        digest[8 + i] = (unsigned char)((last[1] & FP_H1_MASK) >> (8 * i));
    }
    PyObject *d = PyBytes_FromStringAndSize((const char *)digest, 16);
    if (d == NULL)
        return NULL;
    int found;
    uint64_t h[2] = {last[0], last[1] & FP_H1_MASK};
    size_t s = find_slot(t, h, &found);
    PyObject *v = take_slot(t, s, Py_None);
    if (v == NULL) {
        Py_DECREF(d);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, d, v);
    Py_DECREF(d);
    Py_DECREF(v);
    return r;
}

static PyObject *Table_clear(Table *t, PyObject *Py_UNUSED(ignored)) {
    clear_all(t);
    Py_RETURN_NONE;
}

static PyObject *Table_nbytes(Table *t, PyObject *Py_UNUSED(ignored)) {
    if (t->n == 0)
        return PyLong_FromLong(0);
    size_t n = t->isize * sizeof(uint32_t) + t->n * t->words * 8 + t->owned + t->shared_bytes;
    return PyLong_FromSize_t(n);
}

static PyObject *Table_values(Table *t, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < t->n; i++) {
        Held c;
        if (hold(t, entry_at(t, i), Py_None, &c) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *v = unpack(&c, Py_None);
        if (v == NULL || PyList_Append(out, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    return out;
}

static PyObject *Table_get_width(Table *t, void *Py_UNUSED(closure)) { return PyLong_FromSsize_t(t->width); }

static PyObject *Table_get_words(Table *t, void *Py_UNUSED(closure)) { return PyLong_FromSize_t(t->words); }

static PyMethodDef Table_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Table_get, METH_FASTCALL,
     "get(key, default=None): the decision stored for key (rebuilt, with this key object), or default"},
    {"pop", (PyCFunction)(void (*)(void))Table_pop, METH_FASTCALL,
     "pop(key[, default]): remove key and return its decision; KeyError (or default) when absent"},
    {"popitem", (PyCFunction)Table_popitem, METH_NOARGS,
     "popitem() -> (16-byte digest of the key, decision with None where the key was): removes some "
     "entry (the last stored); KeyError when empty"},
    {"clear", (PyCFunction)Table_clear, METH_NOARGS, "remove every entry"},
    {"nbytes", (PyCFunction)Table_nbytes, METH_NOARGS,
     "memory of the entries: index, packed entries and the objects only they hold (0 when empty)"},
    {"values", (PyCFunction)Table_values, METH_NOARGS,
     "every decision, None where the key was (keys are not stored); for tests and debugging"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Table_getset[] = {
    {"width", (getter)Table_get_width, NULL, "decisions per entry (0 until the first value)", NULL},
    {"words", (getter)Table_get_words, NULL,
     "8-byte words an entry takes: 4, then a destination 1 (compact: one destination, sent with the key's "
     "or a shared object's label bytes, or not sent), 2 (narrow: every destination sent under the input's "
     "metric) or 3 once one was not; 0 until the first value", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMappingMethods Table_mapping = {
    (lenfunc)Table_len, (binaryfunc)Table_subscript, (objobjargproc)Table_ass_subscript,
};

static PySequenceMethods Table_sequence = {
    .sq_contains = (objobjproc)Table_contains,
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "relay.native._cdcache.DecisionTable",
    .tp_doc = "DecisionTable(width=0): label bytes -> decision, packed, keyed by a keyed 128-bit hash "
              "(width: decisions per entry; 0: fixed by the first value stored)",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
    .tp_getset = Table_getset,
    .tp_as_mapping = &Table_mapping,
    .tp_as_sequence = &Table_sequence,
    .tp_hash = PyObject_HashNotImplemented,
};

/* ---- the C-level API (relay/native/fastpath.h) ------------------------------------------------------ */

static const uint64_t *api_lookup(PyObject *table, const uint8_t *p, size_t n) {
    Table *t = (Table *)table;
    if (t->n == 0)
        return NULL;
    uint64_t h[2];
    key_hash(p, n, h);
    int found;
    size_t s = find_slot(t, h, &found);
    return found ? entry_at(t, t->index[s] - 1) : NULL;
}

static void api_hash(const uint8_t *p, size_t n, uint64_t h[2]) { key_hash(p, n, h); }

static void api_hash2(const uint8_t *pa, size_t na, uint64_t ha[2], const uint8_t *pb, size_t nb,
                      uint64_t hb[2]) {
    key_hash2(pa, na, ha, pb, nb, hb);
}

static const uint64_t *api_find(PyObject *table, const uint64_t h[2]) {
    Table *t = (Table *)table;
    if (t->n == 0)
        return NULL;
    int found;
    size_t s = find_slot(t, h, &found);
    return found ? entry_at(t, t->index[s] - 1) : NULL;
}

static void api_prefetch(PyObject *table, const uint64_t h[2], int entry) {
    Table *t = (Table *)table;
    if (t->n == 0 || t->isize == 0)
        return;
    const uint32_t *slot = &t->index[(size_t)h[0] & (t->isize - 1)];
    if (!entry) {
        __builtin_prefetch(slot);
        return;
    }
    uint32_t v = *slot;
    if (v != 0 && v <= t->n) {
        const uint64_t *e = entry_at(t, v - 1);
        __builtin_prefetch(e);
        __builtin_prefetch(e + t->words - 1);
    }
}

static Py_ssize_t api_width(PyObject *table) { return ((Table *)table)->width; }

static size_t api_dest_words(PyObject *table) { return ((Table *)table)->dw; }

static PyObject *api_shared(PyObject *table, int i) {
    Table *t = (Table *)table;
    return i >= 0 && i < t->nshared ? t->shared[i] : NULL;
}

static Py_ssize_t api_edit(const uint8_t *p, size_t n, uint64_t aux, const char *run, size_t run_len,
                           uint8_t *out) {
    size_t offs[MAX_ENTRIES + 1];
    int count = split_entries(p, n, offs);
    if (count < 0)
        return -1;
    return (Py_ssize_t)edit_apply(p, offs, count, aux, run, run_len, out);
}

static fp_table_api table_api = {FP_API_VERSION, &TableType, api_lookup, api_hash, api_find, api_prefetch,
                                  api_width, api_dest_words, api_shared, api_edit, api_hash2};

/* ---- module functions ------------------------------------------------------------------------- */

static PyObject *mod_digest(PyObject *Py_UNUSED(m), PyObject *key) {
    if (check_key(key) < 0)
        return NULL;
    uint64_t h[2];
    key_hash((const uint8_t *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), h);
    unsigned char out[16];
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(h[0] >> (8 * i));
        out[8 + i] = (unsigned char)(h[1] >> (8 * i));
    }
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

/* (digest(a), digest(b)) computed by key_hash2: what the route's paired hashing gives */
static PyObject *mod_digest_pair(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO:digest_pair", &a, &b) || check_key(a) < 0 || check_key(b) < 0)
        return NULL;
    uint64_t h[2][2];
    key_hash2((const uint8_t *)PyBytes_AS_STRING(a), (size_t)PyBytes_GET_SIZE(a), h[0],
              (const uint8_t *)PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b), h[1]);
    unsigned char out[2][16];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 8; i++) {
            out[k][i] = (unsigned char)(h[k][0] >> (8 * i));
            out[k][8 + i] = (unsigned char)(h[k][1] >> (8 * i));
        }
    PyObject *da = PyBytes_FromStringAndSize((const char *)out[0], 16);
    PyObject *db = PyBytes_FromStringAndSize((const char *)out[1], 16);
    PyObject *r = da && db ? PyTuple_Pack(2, da, db) : NULL;
    Py_XDECREF(da);
    Py_XDECREF(db);
    return r;
}

static PyObject *mod_siphash(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer key, data;
    int c, d, size;
    if (!PyArg_ParseTuple(args, "y*y*iii:siphash", &key, &data, &c, &d, &size))
        return NULL;
    PyObject *r = NULL;
    if (key.len != 16 || c < 1 || c > 8 || d < 1 || d > 8 || (size != 8 && size != 16)) {
        PyErr_SetString(PyExc_ValueError, "siphash(key of 16 bytes, data, c 1-8, d 1-8, size 8 or 16)");
        goto out;
    }
    uint64_t h[2] = {0, 0};
    siphash(data.buf, (size_t)data.len, load_le64(key.buf), load_le64((const uint8_t *)key.buf + 8), c, d,
            size == 16, h);
    unsigned char o[16];
    for (int i = 0; i < 8; i++) {
        o[i] = (unsigned char)(h[0] >> (8 * i));
        o[8 + i] = (unsigned char)(h[1] >> (8 * i));
    }
    r = PyBytes_FromStringAndSize((const char *)o, size);
out:
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return r;
}

static PyMethodDef module_methods[] = {
    {"digest", (PyCFunction)mod_digest, METH_O,
     "digest(key): the table's 16-byte keyed hash of key (112 bits: its last 2 bytes are 0)"},
    {"digest_pair", (PyCFunction)mod_digest_pair, METH_VARARGS,
     "digest_pair(a, b): (digest(a), digest(b)) as the two-key hash computes them"},
    {"siphash", (PyCFunction)mod_siphash, METH_VARARGS,
     "siphash(key16, data, c, d, size): SipHash-c-d with an 8 or 16-byte output (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "relay.native._cdcache",
    "A compact table of the pipeline's cached decisions (see relay/native/cdcache.c).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cdcache(void) {
    uint8_t rnd[16];
    if (native_urandom(rnd, 16) < 0)
        return NULL;
    sip_k0 = load_le64(rnd);
    sip_k1 = load_le64(rnd + 8);
    if (PyType_Ready(&TableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "DecisionTable", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *cap = PyCapsule_New(&table_api, "relay.native._cdcache._table_api", NULL);
    if (cap == NULL || PyModule_AddObject(m, "_table_api", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

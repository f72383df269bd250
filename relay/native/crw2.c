/* relay.native._crw2: Remote-Write 2.0 Request bytes -> Remote-Write 1.0 WriteRequest bytes, in C.
 *
 * Reference: relay/ingest/wire_v2.py, py_v2_to_v1.
 *
 * The C twin of relay/ingest/wire_v2.py's reference ``v2_to_v1`` (same bytes, same counts). It only
 * handles what it can prove the reference handles the same way: every varint minimal and at most
 * 64 bits, every known field with its own wire type, UTF-8 symbols, refs in range, no duplicate
 * label names, histograms already in the shape protobuf serialises them (so the reference's
 * re-serialisation gives back the same bytes). On anything else (any malformed input, any error,
 * an output past max_bytes) ``transcode`` answers None and ``v2_to_v1`` hands the whole request to
 * the Python reference, so errors (status and message) are the reference's by construction. The
 * output buffer never grows past max_bytes.
 *
 * Every read is checked against the end of its message first. The GIL is held throughout, so the
 * module's scratch buffers (reused between calls) need no lock.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "bigarray.h"
#include <stdint.h>
#include <string.h>

#define OK 0
#define NO (-1) /* not handled here: the reference decides */

/* ---- scratch storage, reused across calls --------------------------------------------------- */

typedef struct {
    const uint8_t *p;  /* the symbol's bytes in the request */
    const uint8_t *lp; /* its length varint there (minimal: as a v1 string field's) */
    uint32_t len;
    uint32_t flen; /* length varint + bytes: a v1 string field is one tag byte + these */
} Sym;

typedef struct {
    uint32_t name, value; /* symbol refs */
} Pair;

typedef struct {
    uint64_t type;
    const uint8_t *fam;
    uint32_t fam_len;
    uint32_t help, unit; /* symbol refs */
    uint32_t hash;
} Meta;

static Sym *g_syms;
static size_t g_syms_cap;
static uint32_t *g_refs; /* a series' labels_refs */
static size_t g_refs_cap;
static uint32_t *g_xrefs; /* an exemplar's labels_refs */
static size_t g_xrefs_cap;
static Pair *g_pairs;
static size_t g_pairs_cap;
static Meta *g_meta;
static size_t g_meta_cap;
static uint32_t *g_mtab; /* open addressing: index + 1 into g_meta, 0 = empty */
static size_t g_mtab_cap;  /* a power of two */
static uint8_t *g_out;
static size_t g_out_cap;

/* Scratch memory comes back after a large request: every array lives in bigarray.h's arrays (one of
   1 MiB and more is a mapping of its own, so freeing it returns it to the system at once), and after
   each call an array over its keep size is freed: the output buffer over KEEP_OUT_CAP, the others
   (symbols, refs, pairs, metadata and its index) over KEEP_SCRATCH. A request of 32 MiB of empty
   symbols grows the symbol array to 384 MB; it is gone when the call returns, accepted or refused. */
#define KEEP_OUT_CAP (4u << 20)
#define KEEP_SCRATCH BIG_BYTES

static int grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return OK;
    size_t n = *cap ? *cap : 64;
    while (n < need) {
        if (n > ((size_t)PTRDIFF_MAX / 2) / elem)
            return NO;
        n *= 2;
    }
    void *p = arr_realloc(*buf, *cap * elem, n * elem);
    if (!p)
        return NO;
    *buf = p;
    *cap = n;
    return OK;
}

#define GROW(buf, cap, need) grow((void **)&(buf), &(cap), (need), sizeof(*(buf)))

/* ---- protobuf primitives -------------------------------------------------------------------- */

/* A minimal varint of at most 64 bits (a longer, non-minimal or truncated one: NO). */
static inline int rd_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) {
        *out = *p;
        *pp = p + 1;
        return OK;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return NO;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            if (b == 0 || (i == 9 && b > 1))
                return NO; /* non-minimal, or past 64 bits */
            *out = v;
            *pp = p;
            return OK;
        }
    }
    return NO;
}

static inline size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *wr_varint(uint8_t *o, uint64_t v)
{
    while (v >= 0x80) {
        *o++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *o++ = (uint8_t)v;
    return o;
}

/* One field's tag: field number >= 1, a wire type of 0, 1, 2 or 5 (groups: NO). For LEN fields
 * vs and ve bound the payload; for others the value bytes. *pp moves past the field. */
static inline int rd_field(const uint8_t **pp, const uint8_t *end, uint32_t *num, int *wt,
                           const uint8_t **vs, const uint8_t **ve)
{
    uint64_t tag, n;
    if (rd_varint(pp, end, &tag) || tag > 0xFFFFFFFFu || (tag >> 3) == 0)
        return NO;
    *num = (uint32_t)(tag >> 3);
    *wt = (int)(tag & 7);
    const uint8_t *p = *pp;
    switch (*wt) {
    case 0:
        *vs = p;
        if (rd_varint(&p, end, &n))
            return NO;
        break;
    case 1:
        if (end - p < 8)
            return NO;
        *vs = p;
        p += 8;
        break;
    case 2:
        if (rd_varint(&p, end, &n) || n > (uint64_t)(end - p))
            return NO;
        *vs = p;
        p += n;
        break;
    case 5:
        if (end - p < 4)
            return NO;
        *vs = p;
        p += 4;
        break;
    default:
        return NO;
    }
    *ve = p;
    *pp = p;
    return OK;
}

static inline uint64_t rd_u64le(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* only compared with 0 and copied back as bytes: byte order does not matter */
}

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF), as upb checks strings. */
static int utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80)
                return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0)
                return 0; /* overlong */
            if (c == 0xED && s[i + 1] > 0x9F)
                return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90)
                return 0; /* overlong */
            if (c == 0xF4 && s[i + 1] > 0x8F)
                return 0; /* past U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* ---- the request ---------------------------------------------------------------------------- */

typedef struct {
    const Sym *syms;
    uint32_t nsyms;
    uint8_t *out; /* g_out */
    size_t len;   /* bytes written */
    size_t limit; /* max_bytes */
    size_t meta_bytes; /* the metadata entries still to write at the end */
    size_t nmeta;
    uint64_t samples, histograms, exemplars;
} Ctx;

/* One v1 Label entry's size: tag, length, inner (name field 1, value field 2, empty ones left out). */
static inline size_t label_inner(const Sym *n, const Sym *v)
{
    return (n->len ? 1 + (size_t)n->flen : 0) + (v->len ? 1 + (size_t)v->flen : 0);
}

static inline size_t label_size(const Sym *n, const Sym *v)
{
    size_t inner = label_inner(n, v);
    return 1 + vlen(inner) + inner;
}

/* labels_refs of a TimeSeries or Exemplar (field 1, packed or not) appended to *refs. */
static int add_refs(uint32_t **refs, size_t *cap, size_t *count, int wt, const uint8_t *vs, const uint8_t *ve)
{
    uint64_t v;
    if (wt == 0) {
        const uint8_t *p = vs;
        if (rd_varint(&p, ve, &v) || v > 0xFFFFFFFFu)
            return NO;
        if (grow((void **)refs, cap, *count + 1, sizeof(uint32_t)))
            return NO;
        (*refs)[(*count)++] = (uint32_t)v;
        return OK;
    }
    if (wt != 2)
        return NO;
    /* at most one ref per byte */
    if (grow((void **)refs, cap, *count + (size_t)(ve - vs), sizeof(uint32_t)))
        return NO;
    const uint8_t *p = vs;
    uint32_t *r = *refs;
    size_t c = *count;
    while (p < ve) {
        if (*p < 0x80) {
            r[c++] = *p++;
            continue;
        }
        if (rd_varint(&p, ve, &v) || v > 0xFFFFFFFFu)
            return NO;
        r[c++] = (uint32_t)v;
    }
    *count = c;
    return OK;
}

/* Size of the sorted v1 labels of ``refs`` (refs validated: even count, in range). */
static int labels_size(const Ctx *c, const uint32_t *refs, size_t n, size_t *size)
{
    if (n & 1)
        return NO;
    size_t s = 0;
    for (size_t i = 0; i < n; i += 2) {
        if (refs[i] >= c->nsyms || refs[i + 1] >= c->nsyms)
            return NO;
        s += label_size(&c->syms[refs[i]], &c->syms[refs[i + 1]]);
    }
    *size = s;
    return OK;
}

static inline int name_cmp(const Sym *a, const Sym *b)
{
    if (a->len && b->len && a->p[0] != b->p[0]) /* most names differ in their first byte */
        return a->p[0] < b->p[0] ? -1 : 1;
    size_t m = a->len < b->len ? a->len : b->len;
    int r = m ? memcmp(a->p, b->p, m) : 0;
    if (r)
        return r;
    return a->len < b->len ? -1 : a->len > b->len ? 1 : 0;
}

#define SMALL_SET 32
static const Sym *g_sort_syms; /* qsort's comparator has no context argument */

static int pair_cmp(const void *a, const void *b)
{
    return name_cmp(&g_sort_syms[((const Pair *)a)->name], &g_sort_syms[((const Pair *)b)->name]);
}

/* Writes the Label entries of ``refs`` sorted by name; two equal names: NO (the reference's order
 * for them depends on the values; a rare invalid series, left to it). */
static int write_labels(const Ctx *c, uint8_t *o, const uint32_t *refs, size_t n, uint8_t **end)
{
    size_t np = n / 2;
    if (GROW(g_pairs, g_pairs_cap, np))
        return NO;
    Pair *pairs = g_pairs;
    const Sym *syms = c->syms;
    if (np > SMALL_SET) { /* O(n log n) for a long label set, then no two names equal */
        for (size_t i = 0; i < np; i++)
            pairs[i] = (Pair){refs[2 * i], refs[2 * i + 1]};
        g_sort_syms = syms;
        qsort(pairs, np, sizeof(Pair), pair_cmp);
        for (size_t i = 1; i < np; i++)
            if (!name_cmp(&syms[pairs[i - 1].name], &syms[pairs[i].name]))
                return NO;
    } else { /* insertion sort: Prometheus sends them sorted already */
        for (size_t i = 0; i < np; i++) {
            Pair pr = {refs[2 * i], refs[2 * i + 1]};
            size_t j = i;
            while (j > 0) {
                int r = name_cmp(&syms[pairs[j - 1].name], &syms[pr.name]);
                if (r == 0)
                    return NO;
                if (r < 0)
                    break;
                pairs[j] = pairs[j - 1];
                j--;
            }
            pairs[j] = pr;
        }
    }
    for (size_t i = 0; i < np; i++) {
        const Sym *nm = &syms[pairs[i].name], *v = &syms[pairs[i].value];
        size_t inner = label_inner(nm, v);
        *o++ = 0x0A;
        if (inner < 0x80)
            *o++ = (uint8_t)inner;
        else
            o = wr_varint(o, inner);
        if (nm->len) {
            *o++ = 0x0A;
            memcpy(o, nm->lp, nm->flen);
            o += nm->flen;
        }
        if (v->len) {
            *o++ = 0x12;
            memcpy(o, v->lp, v->flen);
            o += v->flen;
        }
    }
    *end = o;
    return OK;
}

/* A Sample: value bits (field 1) and timestamp (field 2); start_timestamp (3) and unknown fields
 * are read and dropped. The last occurrence of a field wins, as in protobuf. */
static int parse_sample(const uint8_t *p, const uint8_t *end, uint64_t *bits, uint64_t *ts)
{
    uint32_t num;
    int wt;
    const uint8_t *vs, *ve;
    uint64_t v;
    *bits = 0;
    *ts = 0;
    while (p < end) {
        if (rd_field(&p, end, &num, &wt, &vs, &ve))
            return NO;
        if (num == 1) {
            if (wt != 1)
                return NO;
            *bits = rd_u64le(vs);
        } else if (num == 2 || num == 3) {
            if (wt != 0)
                return NO;
            if (num == 2) {
                const uint8_t *q = vs;
                if (rd_varint(&q, ve, &v))
                    return NO;
                *ts = v;
            }
        }
    }
    return OK;
}

static inline size_t sample_size(uint64_t bits, uint64_t ts)
{
    return 2 + (bits ? 9 : 0) + (ts ? 1 + vlen(ts) : 0);
}

static inline uint8_t *write_sample(uint8_t *o, const uint8_t *p, const uint8_t *end)
{
    uint64_t bits, ts;
    parse_sample(p, end, &bits, &ts); /* validated by the sizing pass */
    *o++ = 0x12;
    *o++ = (uint8_t)(sample_size(bits, ts) - 2);
    if (bits) {
        *o++ = 0x09;
        memcpy(o, &bits, 8);
        o += 8;
    }
    if (ts) {
        *o++ = 0x10;
        o = wr_varint(o, ts);
    }
    return o;
}

/* An Exemplar: labels_refs (1) into g_xrefs, value bits (2), timestamp (3). */
static int parse_exemplar(const uint8_t *p, const uint8_t *end, size_t *nrefs, uint64_t *bits, uint64_t *ts)
{
    uint32_t num;
    int wt;
    const uint8_t *vs, *ve;
    *nrefs = 0;
    *bits = *ts = 0;
    while (p < end) {
        if (rd_field(&p, end, &num, &wt, &vs, &ve))
            return NO;
        if (num == 1) {
            if (add_refs(&g_xrefs, &g_xrefs_cap, nrefs, wt, vs, ve))
                return NO;
        } else if (num == 2) {
            if (wt != 1)
                return NO;
            *bits = rd_u64le(vs);
        } else if (num == 3) {
            const uint8_t *q = vs;
            if (wt != 0 || rd_varint(&q, ve, ts))
                return NO;
        }
    }
    return OK;
}

static int exemplar_size(const Ctx *c, const uint8_t *p, const uint8_t *end, size_t *size)
{
    size_t nrefs, lab;
    uint64_t bits, ts;
    if (parse_exemplar(p, end, &nrefs, &bits, &ts) || labels_size(c, g_xrefs, nrefs, &lab))
        return NO;
    size_t body = lab + (bits ? 9 : 0) + (ts ? 1 + vlen(ts) : 0);
    *size = 1 + vlen(body) + body;
    return OK;
}

static int write_exemplar(const Ctx *c, uint8_t *o, const uint8_t *p, const uint8_t *end, uint8_t **oend)
{
    size_t nrefs, lab;
    uint64_t bits, ts;
    if (parse_exemplar(p, end, &nrefs, &bits, &ts) || labels_size(c, g_xrefs, nrefs, &lab))
        return NO;
    size_t body = lab + (bits ? 9 : 0) + (ts ? 1 + vlen(ts) : 0);
    *o++ = 0x1A;
    o = wr_varint(o, body);
    if (write_labels(c, o, g_xrefs, nrefs, &o))
        return NO;
    if (bits) {
        *o++ = 0x11;
        memcpy(o, &bits, 8);
        o += 8;
    }
    if (ts) {
        *o++ = 0x18;
        o = wr_varint(o, ts);
    }
    *oend = o;
    return OK;
}

/* A BucketSpan exactly as protobuf writes it: offset (1) then length (2), both non-zero 32-bit. */
static int span_ok(const uint8_t *p, const uint8_t *end)
{
    uint32_t num, last = 0;
    int wt;
    const uint8_t *vs, *ve;
    uint64_t v;
    while (p < end) {
        if (rd_field(&p, end, &num, &wt, &vs, &ve) || wt != 0 || num > 2 || num <= last)
            return NO;
        const uint8_t *q = vs;
        if (rd_varint(&q, ve, &v) || v == 0 || v > 0xFFFFFFFFu)
            return NO;
        last = num;
    }
    return OK;
}

/* A packed repeated field: non-empty; varints minimal (sint64) or whole doubles. */
static int packed_ok(const uint8_t *p, const uint8_t *end, int doubles)
{
    if (p == end)
        return NO;
    if (doubles)
        return ((end - p) % 8) ? NO : OK;
    uint64_t v;
    while (p < end)
        if (rd_varint(&p, end, &v))
            return NO;
    return OK;
}

/* A Histogram already in the shape protobuf serialises it (fields 1-17 in order, repeated spans
 * together, no defaults but for the oneofs, packed arrays, no unknown fields): the reference
 * re-serialises it without start_timestamp (17), i.e. these bytes up to field 17. *keep: their length. */
static int histogram_ok(const uint8_t *p, const uint8_t *end, size_t *keep)
{
    const uint8_t *start = p;
    uint32_t num, last = 0;
    int wt;
    const uint8_t *vs, *ve, *fs;
    uint64_t v;
    int count_seen = 0, zero_seen = 0;
    *keep = (size_t)(end - start);
    while (p < end) {
        fs = p;
        if (rd_field(&p, end, &num, &wt, &vs, &ve) || num > 17)
            return NO;
        if (num < last || (num == last && num != 8 && num != 11))
            return NO;
        last = num;
        switch (num) {
        case 1: /* count_int, oneof: any value */
        case 6: /* zero_count_int, oneof */
        case 17: /* start_timestamp: dropped */
            if (wt != 0 || rd_varint(&vs, ve, &v))
                return NO;
            if (num == 1 && count_seen++)
                return NO;
            if (num == 6 && zero_seen++)
                return NO;
            if (num == 17)
                *keep = (size_t)(fs - start);
            break;
        case 2: /* count_float, oneof */
        case 7: /* zero_count_float, oneof */
            if (wt != 1)
                return NO;
            if (num == 2 && count_seen++)
                return NO;
            if (num == 7 && zero_seen++)
                return NO;
            break;
        case 3: /* sum */
        case 5: /* zero_threshold */
            if (wt != 1 || rd_u64le(vs) == 0)
                return NO;
            break;
        case 4: /* schema, sint32 */
            if (wt != 0 || rd_varint(&vs, ve, &v) || v == 0 || v > 0xFFFFFFFFu)
                return NO;
            break;
        case 14: /* reset_hint, enum */
            if (wt != 0 || rd_varint(&vs, ve, &v) || v == 0 || v > 0x7FFFFFFFu)
                return NO;
            break;
        case 15: /* timestamp, int64 */
            if (wt != 0 || rd_varint(&vs, ve, &v) || v == 0)
                return NO;
            break;
        case 8:
        case 11: /* spans */
            if (wt != 2 || span_ok(vs, ve))
                return NO;
            break;
        case 9:
        case 12: /* deltas, packed sint64 */
            if (wt != 2 || packed_ok(vs, ve, 0))
                return NO;
            break;
        case 10:
        case 13:
        case 16: /* counts, custom_values: packed double */
            if (wt != 2 || packed_ok(vs, ve, 1))
                return NO;
            break;
        default:
            return NO;
        }
    }
    return OK;
}

/* Metadata: type (1), help_ref (3), unit_ref (4). */
static int parse_metadata(const uint8_t *p, const uint8_t *end, uint64_t *type, uint64_t *help, uint64_t *unit)
{
    uint32_t num;
    int wt;
    const uint8_t *vs, *ve;
    *type = *help = *unit = 0;
    while (p < end) {
        if (rd_field(&p, end, &num, &wt, &vs, &ve))
            return NO;
        uint64_t *dst = num == 1 ? type : num == 3 ? help : num == 4 ? unit : NULL;
        if (!dst)
            continue;
        if (wt != 0 || rd_varint(&vs, ve, dst))
            return NO;
    }
    /* type is an int32 enum (larger values would be read negative), the refs uint32 */
    if (*type > 0x7FFFFFFFu || *help > 0xFFFFFFFFu || *unit > 0xFFFFFFFFu)
        return NO;
    return OK;
}

/* The family names are the client's: an unkeyed hash (FNV-1a was here) lets it aim them all at one
 * probe run (quadratic). Python's bytes hash is SipHash keyed per process, as the reference's dict. */
static inline uint32_t name_hash(const uint8_t *p, size_t n)
{
#if PY_VERSION_HEX >= 0x030E0000
    return (uint32_t)Py_HashBuffer(p, (Py_ssize_t)n);
#else
    return (uint32_t)_Py_HashBytes(p, (Py_ssize_t)n);
#endif
}

static size_t meta_entry_size(const Ctx *c, const Meta *m)
{
    size_t hl = c->syms[m->help].len, ul = c->syms[m->unit].len;
    size_t body = (m->type ? 1 + vlen(m->type) : 0) + 1 + vlen(m->fam_len) + m->fam_len +
                  (hl ? 1 + vlen(hl) + hl : 0) + (ul ? 1 + vlen(ul) + ul : 0);
    return 1 + vlen(body) + body;
}

static int meta_find(const Meta *m)
{
    size_t mask = g_mtab_cap - 1;
    for (size_t i = m->hash & mask;; i = (i + 1) & mask) {
        uint32_t k = g_mtab[i];
        if (!k)
            return (int)i * -1 - 1; /* not there: -(slot + 1) */
        const Meta *o = &g_meta[k - 1];
        if (o->hash == m->hash && o->fam_len == m->fam_len && !memcmp(o->fam, m->fam, m->fam_len))
            return 1;
    }
}

/* The series' metadata as the reference builds it: help and unit refs checked, the family name
 * from the first __name__ label (classic histogram/summary suffixes removed), first one kept. */
static int add_metadata(Ctx *c, const uint8_t *p, const uint8_t *end, const uint32_t *refs, size_t nrefs)
{
    uint64_t type, help, unit;
    if (parse_metadata(p, end, &type, &help, &unit) || help >= c->nsyms || unit >= c->nsyms)
        return NO;
    const Sym *name = NULL;
    for (size_t i = 0; i < nrefs; i += 2) {
        const Sym *n = &c->syms[refs[i]];
        if (n->len == 8 && !memcmp(n->p, "__name__", 8)) {
            name = &c->syms[refs[i + 1]];
            break;
        }
    }
    if (!name || !name->len || (type == 0 && !c->syms[help].len && !c->syms[unit].len))
        return OK;
    Meta m = {type, name->p, name->len, (uint32_t)help, (uint32_t)unit, 0};
    static const char *hist[] = {"_bucket", "_count", "_sum", NULL};
    static const char *summ[] = {"_count", "_sum", NULL};
    const char **suffixes = (type == 3 || type == 4) ? hist : type == 5 ? summ : NULL;
    for (; suffixes && *suffixes; suffixes++) {
        size_t sl = strlen(*suffixes);
        if (m.fam_len > sl && !memcmp(m.fam + m.fam_len - sl, *suffixes, sl)) {
            m.fam_len -= (uint32_t)sl;
            break;
        }
    }
    m.hash = name_hash(m.fam, m.fam_len);
    if (c->nmeta * 2 + 2 > g_mtab_cap) { /* keep the table at most half full */
        size_t cap = g_mtab_cap ? g_mtab_cap * 2 : 64;
        while (cap < c->nmeta * 2 + 2)
            cap *= 2;
        uint32_t *t = arr_calloc(cap, sizeof(uint32_t));
        if (!t)
            return NO;
        arr_free(g_mtab, g_mtab_cap * sizeof(uint32_t));
        g_mtab = t;
        g_mtab_cap = cap;
        for (size_t k = 0; k < c->nmeta; k++) {
            int slot = meta_find(&g_meta[k]);
            g_mtab[-(slot + 1)] = (uint32_t)(k + 1);
        }
    }
    int slot = meta_find(&m);
    if (slot >= 0)
        return OK;
    size_t size = meta_entry_size(c, &m);
    if (size > c->limit - c->len - c->meta_bytes)
        return NO;
    if (GROW(g_meta, g_meta_cap, c->nmeta + 1))
        return NO;
    g_meta[c->nmeta] = m;
    g_mtab[-(slot + 1)] = (uint32_t)(++c->nmeta);
    c->meta_bytes += size;
    return OK;
}

static uint8_t *write_len_field(uint8_t *o, uint8_t tag, const uint8_t *p, size_t n)
{
    *o++ = tag;
    o = wr_varint(o, n);
    memcpy(o, p, n);
    return o + n;
}

static void write_meta(const Ctx *c, const Meta *m, uint8_t *o)
{
    const Sym *h = &c->syms[m->help], *u = &c->syms[m->unit];
    size_t body = (m->type ? 1 + vlen(m->type) : 0) + 1 + vlen(m->fam_len) + m->fam_len +
                  (h->len ? 1 + vlen(h->len) + h->len : 0) + (u->len ? 1 + vlen(u->len) + u->len : 0);
    *o++ = 0x1A;
    o = wr_varint(o, body);
    if (m->type) {
        *o++ = 0x08;
        o = wr_varint(o, m->type);
    }
    o = write_len_field(o, 0x12, m->fam, m->fam_len);
    if (h->len)
        o = write_len_field(o, 0x22, h->p, h->len);
    if (u->len)
        write_len_field(o, 0x2A, u->p, u->len);
}

static int ensure_out(Ctx *c, size_t n)
{
    /* never past max_bytes, counting the metadata still to come */
    if (n > c->limit - c->len - c->meta_bytes)
        return NO;
    size_t need = c->len + n;
    if (need > g_out_cap) { /* doubling, but never past max_bytes */
        size_t cap = g_out_cap < 4096 ? 4096 : g_out_cap * 2;
        if (cap > c->limit)
            cap = c->limit;
        if (cap < need)
            cap = need;
        uint8_t *p = arr_realloc(g_out, g_out_cap, cap);
        if (!p)
            return NO;
        g_out = p;
        g_out_cap = cap;
    }
    c->out = g_out;
    return OK;
}

/* One TimeSeries: sized first (every field validated), then written. */
static int series(Ctx *c, const uint8_t *s, const uint8_t *e)
{
    const uint8_t *p = s, *vs = NULL, *ve = NULL, *md = NULL, *md_end = NULL;
    uint32_t num;
    int wt;
    size_t nrefs = 0, size = 0, x;
    uint64_t ns = 0, ne = 0, nh = 0, bits, ts;
    while (p < e) {
        if (rd_field(&p, e, &num, &wt, &vs, &ve))
            return NO;
        switch (num) {
        case 1:
            if (add_refs(&g_refs, &g_refs_cap, &nrefs, wt, vs, ve))
                return NO;
            break;
        case 2:
            if (wt != 2 || parse_sample(vs, ve, &bits, &ts))
                return NO;
            size += sample_size(bits, ts);
            ns++;
            break;
        case 3:
            if (wt != 2 || histogram_ok(vs, ve, &x))
                return NO;
            size += 1 + vlen(x) + x;
            nh++;
            break;
        case 4:
            if (wt != 2 || exemplar_size(c, vs, ve, &x))
                return NO;
            size += x;
            ne++;
            break;
        case 5:
            if (wt != 2 || md)
                return NO; /* a second one would be merged into the first */
            md = vs;
            md_end = ve;
            break;
        default:
            break; /* unknown fields are skipped */
        }
    }
    if (labels_size(c, g_refs, nrefs, &x))
        return NO;
    size += x;
    if (ensure_out(c, 1 + vlen(size) + size))
        return NO;
    uint8_t *o = c->out + c->len, *start;
    *o++ = 0x0A;
    o = wr_varint(o, size);
    start = o;
    if (write_labels(c, o, g_refs, nrefs, &o))
        return NO;
    for (p = s; ns && p < e;) {
        rd_field(&p, e, &num, &wt, &vs, &ve);
        if (num == 2)
            o = write_sample(o, vs, ve);
    }
    for (p = s; ne && p < e;) {
        rd_field(&p, e, &num, &wt, &vs, &ve);
        if (num == 4 && write_exemplar(c, o, vs, ve, &o))
            return NO;
    }
    for (p = s; nh && p < e;) {
        rd_field(&p, e, &num, &wt, &vs, &ve);
        if (num == 3) {
            histogram_ok(vs, ve, &x);
            o = write_len_field(o, 0x22, vs, x);
        }
    }
    if ((size_t)(o - start) != size)
        return NO; /* cannot happen: the sizing pass and the writer disagree */
    c->len = (size_t)(o - c->out);
    c->samples += ns;
    c->exemplars += ne;
    c->histograms += nh;
    if (md && add_metadata(c, md, md_end, g_refs, nrefs))
        return NO;
    return OK;
}

static int request(Ctx *c, const uint8_t *buf, size_t n)
{
    const uint8_t *p = buf, *end = buf + n, *vs = NULL, *ve = NULL;
    uint32_t num = 0;
    int wt;
    size_t nsyms = 0;
    /* first the symbol table: symbols (4) and timeseries (5) may come in any order */
    while (p < end) {
        if (rd_field(&p, end, &num, &wt, &vs, &ve))
            return NO;
        if (num == 4 || num == 5) {
            if (wt != 2)
                return NO;
            if (num == 4) {
                if ((size_t)(ve - vs) > 0xFFFFFF00u || GROW(g_syms, g_syms_cap, nsyms + 1) ||
                    !utf8_ok(vs, (size_t)(ve - vs)))
                    return NO;
                uint32_t len = (uint32_t)(ve - vs);
                g_syms[nsyms].p = vs;
                g_syms[nsyms].len = len;
                g_syms[nsyms].lp = vs - vlen(len);
                g_syms[nsyms].flen = (uint32_t)vlen(len) + len;
                nsyms++;
            }
        }
    }
    if (nsyms > 0xFFFFFFFFu || (nsyms && g_syms[0].len))
        return NO;
    c->syms = g_syms;
    c->nsyms = (uint32_t)nsyms;
    for (p = buf; p < end;) {
        rd_field(&p, end, &num, &wt, &vs, &ve);
        if (num == 5 && series(c, vs, ve))
            return NO;
    }
    if (c->meta_bytes) {
        size_t meta = c->meta_bytes;
        c->meta_bytes = 0;
        if (ensure_out(c, meta))
            return NO;
        for (size_t i = 0; i < c->nmeta; i++) {
            write_meta(c, &g_meta[i], c->out + c->len);
            c->len += meta_entry_size(c, &g_meta[i]);
        }
    }
    return OK;
}

/* *buf (cap elements of elem bytes) freed when it holds more than keep bytes; 1 when freed */
static int drop_scratch(void **buf, size_t *cap, size_t elem, size_t keep)
{
    if (*cap * elem <= keep)
        return 0;
    arr_free(*buf, *cap * elem);
    *buf = NULL;
    *cap = 0;
    return 1;
}

#define DROP_SCRATCH(buf, cap, keep) drop_scratch((void **)&(buf), &(cap), sizeof(*(buf)), (keep))

static void release_scratch(const Ctx *c)
{
    DROP_SCRATCH(g_out, g_out_cap, KEEP_OUT_CAP);
    DROP_SCRATCH(g_syms, g_syms_cap, KEEP_SCRATCH);
    DROP_SCRATCH(g_refs, g_refs_cap, KEEP_SCRATCH);
    DROP_SCRATCH(g_xrefs, g_xrefs_cap, KEEP_SCRATCH);
    DROP_SCRATCH(g_pairs, g_pairs_cap, KEEP_SCRATCH);
    DROP_SCRATCH(g_meta, g_meta_cap, KEEP_SCRATCH);
    if (!DROP_SCRATCH(g_mtab, g_mtab_cap, 4096 * sizeof(uint32_t)) && g_mtab && c->nmeta)
        memset(g_mtab, 0, g_mtab_cap * sizeof(uint32_t));
}

/* ---- Python API ----------------------------------------------------------------------------- */

static PyObject *g_reference; /* relay.wire_v2's Python v2_to_v1 */
static PyObject *g_counts;    /* relay.wire_v2.V2Counts */
static PyObject *g_default_max;

/* (v1 bytes, samples, histograms, exemplars), or None: not handled here (the reference decides).
 * Any Python-level error (not bytes, a bad max_bytes) is also None: the reference raises it. */
static PyObject *transcode_impl(PyObject *raw, PyObject *max_obj)
{
    if (!PyBytes_CheckExact(raw) || !PyLong_CheckExact(max_obj))
        Py_RETURN_NONE;
    int overflow = 0;
    long long max = PyLong_AsLongLongAndOverflow(max_obj, &overflow);
    if (overflow > 0)
        max = LLONG_MAX;
    if ((max == -1 && PyErr_Occurred()) || overflow < 0 || max < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Ctx c;
    memset(&c, 0, sizeof c);
    c.limit = (unsigned long long)max > (size_t)PTRDIFF_MAX ? (size_t)PTRDIFF_MAX : (size_t)max;
    c.out = g_out;
    int rc = request(&c, (const uint8_t *)PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw));
    PyObject *res = NULL;
    if (rc == OK) {
        res = Py_BuildValue("(y#KKK)", (const char *)(c.len ? g_out : (const uint8_t *)""), (Py_ssize_t)c.len,
                            (unsigned long long)c.samples, (unsigned long long)c.histograms,
                            (unsigned long long)c.exemplars);
    }
    release_scratch(&c);
    if (rc != OK)
        Py_RETURN_NONE;
    return res;
}

static PyObject *py_transcode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "transcode(raw, max_bytes) takes 2 arguments");
        return NULL;
    }
    return transcode_impl(args[0], args[1]);
}

static PyObject *py_v2_to_v1(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"raw", "max_bytes", NULL};
    PyObject *raw, *max_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:v2_to_v1", kw, &raw, &max_obj))
        return NULL;
    if (!g_reference) {
        PyErr_SetString(PyExc_RuntimeError, "relay.native._crw2.configure() was not called");
        return NULL;
    }
    if (!max_obj)
        max_obj = g_default_max;
    PyObject *r = transcode_impl(raw, max_obj);
    if (!r)
        return NULL;
    if (r == Py_None) {
        Py_DECREF(r);
        return PyObject_CallFunctionObjArgs(g_reference, raw, max_obj, NULL);
    }
    PyObject *counts = PyObject_CallFunctionObjArgs(g_counts, PyTuple_GET_ITEM(r, 1), PyTuple_GET_ITEM(r, 2),
                                                    PyTuple_GET_ITEM(r, 3), NULL);
    PyObject *out = counts ? PyTuple_Pack(2, PyTuple_GET_ITEM(r, 0), counts) : NULL;
    Py_XDECREF(counts);
    Py_DECREF(r);
    return out;
}

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    PyObject *ref, *counts, *dflt;
    if (!PyArg_ParseTuple(args, "OOO!:configure", &ref, &counts, &PyLong_Type, &dflt))
        return NULL;
    Py_INCREF(ref);
    Py_INCREF(counts);
    Py_INCREF(dflt);
    Py_XSETREF(g_reference, ref);
    Py_XSETREF(g_counts, counts);
    Py_XSETREF(g_default_max, dflt);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"transcode", (PyCFunction)(void (*)(void))py_transcode, METH_FASTCALL,
     "transcode(raw, max_bytes) -> (v1 bytes, samples, histograms, exemplars), or None when the request "
     "is left to the Python reference (malformed, an error, over max_bytes, an unusual shape)."},
    {"v2_to_v1", (PyCFunction)(void (*)(void))py_v2_to_v1, METH_VARARGS | METH_KEYWORDS,
     "v2_to_v1(raw, max_bytes=DEFAULT_MAX_BYTES) -> (v1 bytes, V2Counts): relay.wire_v2.v2_to_v1 in C, "
     "handing the request to the reference where transcode answers None."},
    {"configure", py_configure, METH_VARARGS,
     "configure(reference, counts_type, default_max_bytes): what v2_to_v1 falls back to and returns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "relay.native._crw2",
                                    "Remote-Write 2.0 to 1.0 transcoding in C (relay.wire_v2's twin).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__crw2(void)
{
    return PyModule_Create(&module);
}

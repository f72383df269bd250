/* relay.native._csnappy: a raw snappy block decoder writing straight into the bytes object it returns.

Reference: relay/ingest/wire.py, py_decompress (python-snappy / cramjam).

The reference is python-snappy 0.7's uncompress (cramjam's snappy decoder): relay.wire.decompress
calls it where this module is absent or declines (wire.py_decompress). It zero-fills its
output buffer and copies it into a bytes object afterwards; here the bytes object is allocated
once, uninitialised, and every output byte is written exactly by the elements (the block must fill
it exactly), so nothing is cleared or copied twice.

Format (google/snappy format_description.txt): a varint of the uncompressed length (cramjam reads
up to 10 bytes and refuses a value over 2^32 - 1), then elements until the input ends. The tag's
low 2 bits give the kind:
  00 literal: length - 1 in the tag's top 6 bits, or 60..63 for 1..4 little-endian bytes after it
              (cramjam's decoder, snap, reads those as a 4-byte word: it refuses such a literal when
              fewer than 4 input bytes follow its tag, even where the spec's bytes would fit);
  01 copy-1:  length 4 + bits 2-4, offset bits 5-7 << 8 | the next byte;
  10 copy-2:  length 1 + the top 6 bits, offset the next 2 bytes (little-endian);
  11 copy-4:  as copy-2 with a 4-byte offset.
A copy repeats the output `offset` bytes back; offset 0 or one past what is written is an error,
as is any element running past the input or past the announced length, and an output shorter
than announced. An element after the output is full has no room: trailing input is an error.

uncompress(data, max_bytes) answers the block's bytes, or None for anything that is not a valid
block: the caller then hands the whole call to the reference, which raises its own error (so the
errors are the reference's by construction). A block announcing more than max_bytes raises
ValueError before anything is allocated. The GIL is held throughout (short work: releasing it
costs a thread hand-off).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <zlib.h>
#include <string.h>

#define SNAPPY_MAX_LEN 0xFFFFFFFFULL /* the format's (and cramjam's) largest block */

/* The length header as cramjam reads it: 1-10 varint bytes. 0 (decline) when truncated, longer
 * than 10 bytes, a 10th byte over 1 (bits past 64, which cramjam drops: the reference decides),
 * or a value over 2^32 - 1. */
static int read_header(const uint8_t *b, size_t n, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < 10; i++) {
        if (i >= n)
            return 0;
        uint8_t c = b[i];
        if (i == 9 && c > 1)
            return 0;
        v |= (uint64_t)(c & 0x7F) << (7 * i);
        if (c < 0x80) {
            if (v > SNAPPY_MAX_LEN)
                return 0;
            *pos = i + 1;
            *out = v;
            return 1;
        }
    }
    return 0;
}

static inline uint32_t le_bytes(const uint8_t *p, unsigned k)
{
    uint32_t v = 0;
    for (unsigned i = 0; i < k; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

/* n bytes (rounded up to 16) in 16-byte moves; the caller checked both ends have that room, and
 * for a copy within the output that src is at least 16 bytes before dst. */
static inline void copy16s(uint8_t *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i += 16)
        memcpy(dst + i, src + i, 16);
}

/* Copy `len` bytes from `off` back to op: the caller checked 0 < off <= written and len <= room.
 * An overlapping copy (off < len) repeats the last `off` bytes: each memcpy reads only bytes
 * already written (from op - off up to op + done, a whole number of periods) and never overlaps
 * its destination, and the span doubles each time. */
static inline void copy_back(uint8_t *op, size_t off, size_t len)
{
    const uint8_t *src = op - off;
    if (off >= len) {
        memcpy(op, src, len);
        return;
    }
    size_t done = 0;
    while (done < len) {
        size_t n = off + done; /* bytes available from src: [src, op + done) */
        if (n > len - done)
            n = len - done;
        memcpy(op + done, src, n);
        done += n;
    }
}

/* Decode the elements in [ip, iend) into out[0..len): 1 when they fill it exactly. */
static int decode(const uint8_t *ip, const uint8_t *iend, uint8_t *out, size_t len)
{
    uint8_t *op = out;
    uint8_t *oend = out + len;
    while (ip < iend) {
        uint8_t tag = *ip++;
        size_t room = (size_t)(oend - op);
        size_t have = (size_t)(iend - ip);
        if ((tag & 3) == 0) {
            uint64_t n = tag >> 2;
            if (n >= 60) {
                unsigned k = (unsigned)n - 59; /* 1..4 length bytes */
                if (have < 4) /* cramjam (snap) refuses a long literal with under 4 bytes after its tag */
                    return 0;
                n = le_bytes(ip, k);
                ip += k;
                have -= k;
            }
            n += 1; /* 1 .. 2^32, in 64 bits */
            if (n > (uint64_t)have || n > (uint64_t)room)
                return 0;
            size_t ln = (size_t)n;
            size_t span = (ln + 15) & ~(size_t)15;
            if (ln <= 64 && have >= span && room >= span)
                copy16s(op, ip, ln); /* the bytes past ln are written over by later elements */
            else
                memcpy(op, ip, ln);
            op += ln;
            ip += ln;
            continue;
        }
        size_t ln, off;
        if ((tag & 3) == 1) {
            if (have < 1)
                return 0;
            ln = 4 + ((tag >> 2) & 7);
            off = ((size_t)(tag >> 5) << 8) | ip[0];
            ip += 1;
        } else if ((tag & 3) == 2) {
            if (have < 2)
                return 0;
            ln = 1 + (size_t)(tag >> 2);
            off = le_bytes(ip, 2);
            ip += 2;
        } else {
            if (have < 4)
                return 0;
            ln = 1 + (size_t)(tag >> 2);
            off = le_bytes(ip, 4);
            ip += 4;
        }
        if (off == 0 || off > (size_t)(op - out) || ln > room)
            return 0;
        if (off >= 16 && room >= ((ln + 15) & ~(size_t)15)) {
            /* 16 bytes at a time from at least 16 back: each chunk reads only bytes written before
             * it (an earlier chunk's, when off < ln) and never its own destination; the excess
             * past ln stays inside the output and is written over by later elements */
            copy16s(op, op - off, ln);
        } else {
            copy_back(op, off, ln);
        }
        op += ln;
    }
    return op == oend;
}

static PyObject *py_uncompress(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "uncompress() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[1]);
    if (max_bytes == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *b = (const uint8_t *)view.buf;
    size_t n = (size_t)view.len;
    size_t pos;
    uint64_t len;
    if (!read_header(b, n, &pos, &len)) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    if (max_bytes < 0 || len > (uint64_t)max_bytes) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "snappy block of %llu bytes exceeds max_bytes (%zd)",
                     (unsigned long long)len, max_bytes);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int ok;
    if (len == 0)
        ok = pos == n; /* the shared empty bytes object: never written; any element is trailing */
    else
        ok = decode(b + pos, b + n, (uint8_t *)PyBytes_AS_STRING(out), (size_t)len);
    PyBuffer_Release(&view);
    if (!ok) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

/* crc32(data, value=0): zlib.crc32(data, value), with the GIL held. zlib.crc32 releases it for any
buffer over 5 KiB, which is most queue rows: a thread hand-off per row put (relay.queue_codec).
Anything but (buffer) or (buffer, int) goes to zlib.crc32 itself, so odd arguments get its own
results and errors. */
static PyObject *zlib_crc32; /* the reference, imported at module init */

static PyObject *py_crc32(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2 || (nargs == 2 && !PyLong_CheckExact(args[1])))
        return PyObject_Vectorcall(zlib_crc32, args, (size_t)nargs, NULL);
    unsigned long value = 0;
    if (nargs == 2) {
        value = PyLong_AsUnsignedLongMask(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const Bytef *p = (const Bytef *)view.buf;
    Py_ssize_t left = view.len;
    value &= 0xFFFFFFFFUL;
    while (left > 0) { /* zlib takes a uInt length */
        uInt n = left > (Py_ssize_t)0x40000000 ? 0x40000000U : (uInt)left;
        value = crc32(value, p, n);
        p += n;
        left -= n;
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(value & 0xFFFFFFFFUL);
}

/* ---- compression -----------------------------------------------------------------------------
compress(data) -> a raw snappy block of data (any valid block decodes to the same bytes: this one
is what google/snappy's reference compressor builds, fragment by fragment). The input is cut into
fragments of 64 KiB compressed on their own (every copy's offset fits copy-2); a hash table of
the last position of each 4-byte sequence (up to 2^14 slots, as many as the fragment needs) finds
a candidate match, checked byte for byte; where none is found the search steps further the longer
it has failed (incompressible input is passed over quickly), and what it passes over is emitted as
literals. Output bound: 32 + n + n/6 bytes (snappy's MaxCompressedLength). The GIL is held. */

enum { FRAGMENT = 1 << 16, TABLE_BITS_MAX = 14, INPUT_MARGIN = 15 };

static inline uint32_t load32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint32_t hash32(uint32_t v, int shift) { return (v * 0x1e35a7bdU) >> shift; }

static inline size_t match_length(const uint8_t *s1, const uint8_t *s2, const uint8_t *end)
{
    /* s1 < s2 < end: the equal bytes at s1 and s2, counting no byte at or past end */
    size_t n = 0;
    while ((size_t)(end - s2) >= n + 8) {
        uint64_t a, b;
        memcpy(&a, s1 + n, 8);
        memcpy(&b, s2 + n, 8);
        if (a != b)
            return n + ((size_t)__builtin_ctzll(a ^ b) >> 3);
        n += 8;
    }
    while (s2 + n < end && s1[n] == s2[n])
        n++;
    return n;
}

static uint8_t *emit_literal(uint8_t *op, const uint8_t *lit, size_t len)
{
    size_t n = len - 1; /* len >= 1; a fragment's literal is at most 2^16 bytes */
    if (n < 60) {
        *op++ = (uint8_t)(n << 2);
    } else if (n < 256) {
        *op++ = 60 << 2;
        *op++ = (uint8_t)n;
    } else {
        *op++ = 61 << 2;
        *op++ = (uint8_t)(n & 0xFF);
        *op++ = (uint8_t)(n >> 8);
    }
    memcpy(op, lit, len);
    return op + len;
}

static inline uint8_t *emit_copy2(uint8_t *op, size_t offset, size_t len)
{
    *op++ = (uint8_t)(2 | ((len - 1) << 2));
    *op++ = (uint8_t)(offset & 0xFF);
    *op++ = (uint8_t)(offset >> 8);
    return op;
}

static uint8_t *emit_copy(uint8_t *op, size_t offset, size_t len)
{
    /* 0 < offset < 2^16, len >= 4 */
    while (len >= 68) {
        op = emit_copy2(op, offset, 64);
        len -= 64;
    }
    if (len > 64) {
        op = emit_copy2(op, offset, 60);
        len -= 60;
    }
    if (len < 12 && offset < 2048) {
        *op++ = (uint8_t)(1 | ((len - 4) << 2) | ((offset >> 8) << 5));
        *op++ = (uint8_t)(offset & 0xFF);
        return op;
    }
    return emit_copy2(op, offset, len);
}

static uint8_t *compress_fragment(const uint8_t *in, size_t n, uint8_t *op, uint16_t *table)
{
    const uint8_t *ip = in, *end = in + n, *next_emit = in;
    if (n >= INPUT_MARGIN) {
        int bits = 8;
        while (bits < TABLE_BITS_MAX && ((size_t)1 << bits) < n)
            bits++;
        const int shift = 32 - bits;
        memset(table, 0, sizeof(uint16_t) << bits);
        const uint8_t *limit = end - INPUT_MARGIN; /* 4-byte loads at or before it stay inside */
        uint32_t next_hash = hash32(load32(++ip), shift);
        for (;;) {
            uint32_t skip = 32;
            const uint8_t *next_ip = ip, *candidate;
            do { /* a 4-byte match: stepping further the longer none is found */
                ip = next_ip;
                uint32_t h = next_hash;
                next_ip = ip + (skip++ >> 5);
                if (next_ip > limit)
                    goto remainder;
                next_hash = hash32(load32(next_ip), shift);
                candidate = in + table[h];
                table[h] = (uint16_t)(ip - in);
            } while (load32(ip) != load32(candidate));
            op = emit_literal(op, next_emit, (size_t)(ip - next_emit));
            do { /* copies, as long as the next position starts a match too */
                const uint8_t *at = ip;
                size_t matched = 4 + match_length(candidate + 4, ip + 4, end);
                ip += matched;
                op = emit_copy(op, (size_t)(at - candidate), matched);
                next_emit = ip;
                if (ip >= limit)
                    goto remainder;
                table[hash32(load32(ip - 1), shift)] = (uint16_t)(ip - 1 - in);
                uint32_t h = hash32(load32(ip), shift);
                candidate = in + table[h];
                table[h] = (uint16_t)(ip - in);
            } while (load32(ip) == load32(candidate));
            next_hash = hash32(load32(++ip), shift);
        }
    }
remainder:
    if (next_emit < end)
        op = emit_literal(op, next_emit, (size_t)(end - next_emit));
    return op;
}

static PyObject *py_compress(PyObject *Py_UNUSED(m), PyObject *data)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t n = (size_t)view.len;
    if ((uint64_t)n > 0xFFFFFFFFULL) { /* the format's length is 32 bits: the reference says so */
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    /* into a scratch buffer, then copied into a bytes object of the exact size: shrinking the
       bound-sized object in place would leave a hole of ~n/6 + what was saved behind every row the
       queue keeps (heap fragmentation: the relay's RSS grew by about that much) */
    uint8_t *start = PyMem_RawMalloc(32 + n + n / 6), *op = start;
    if (start == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    size_t v = n;
    while (v >= 0x80) {
        *op++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *op++ = (uint8_t)v;
    uint16_t table[1 << TABLE_BITS_MAX];
    const uint8_t *in = (const uint8_t *)view.buf;
    for (size_t pos = 0; pos < n; pos += FRAGMENT) {
        size_t len = n - pos < FRAGMENT ? n - pos : FRAGMENT;
        op = compress_fragment(in + pos, len, op, table);
    }
    PyBuffer_Release(&view);
    PyObject *out = PyBytes_FromStringAndSize((const char *)start, (Py_ssize_t)(op - start));
    PyMem_RawFree(start);
    return out;
}

static PyMethodDef methods[] = {
    {"compress", (PyCFunction)py_compress, METH_O,
     "compress(data) -> a raw snappy block of data (None past the format's 2^32 - 1 bytes)."},
    {"crc32", (PyCFunction)(void (*)(void))py_crc32, METH_FASTCALL,
     "crc32(data, value=0) -> zlib.crc32(data, value), the GIL held (zlib's releases it over 5 KiB)."},
    {"uncompress", (PyCFunction)(void (*)(void))py_uncompress, METH_FASTCALL,
     "uncompress(data, max_bytes) -> bytes, or None when data is not a valid raw snappy block (the "
     "caller asks the reference which error); ValueError when it announces more than max_bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "relay.native._csnappy",
                                    "Raw snappy blocks in C: uncompress and compress (python-snappy's twins), and zlib's crc32 "
                                    "with the GIL held.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__csnappy(void)
{
    if (zlib_crc32 == NULL) {
        PyObject *zlib = PyImport_ImportModule("zlib");
        if (zlib == NULL)
            return NULL;
        zlib_crc32 = PyObject_GetAttrString(zlib, "crc32");
        Py_DECREF(zlib);
        if (zlib_crc32 == NULL)
            return NULL;
    }
    return PyModule_Create(&module);
}

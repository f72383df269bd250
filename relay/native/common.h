/* Small protobuf wire-format readers shared by the relay's C extensions (relay/native/<name>.c).
 *
 * Every reader is bounded: it is given the end of the region it may read and answers 0 ("not
 * handled") rather than read past it. A 0 never says which error the Python reference raises;
 * callers hand the whole input to the reference for that (relay/common/protowire.py is the reference).
 * Self-contained: include it first (it includes Python.h, which must come before system headers).
 */
#ifndef GPU_RELAY_COMMON_H
#define GPU_RELAY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#define CW_MAX_FIELD_NUMBER ((1ULL << 29) - 1) /* protowire.MAX_FIELD_NUMBER */

enum { CW_VARINT = 0, CW_I64 = 1, CW_LEN = 2, CW_I32 = 5 };

/* The unsigned varint at *pos, read before `end`, as protowire.uvarint reads it: at most 10
 * bytes, value below 2^64 (non-canonical encodings such as 0x85 0x00 are accepted, as there).
 * 1: *out is the value and *pos moves past it; 0: truncated, longer than 10 bytes or over 64 bits. */
static inline int cw_uvarint(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, uint64_t *out)
{
    Py_ssize_t p = *pos;
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (p >= end)
            return 0;
        uint8_t c = b[p++];
        if (shift == 63 && c > 1)
            return 0; /* the 10th byte may only add bit 63 and must end the varint */
        v |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80) {
            *pos = p;
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* A LEN payload whose length varint is at *pos: 1 with [*start, *stop) inside `end`, *pos = *stop. */
static inline int cw_len(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, Py_ssize_t *start,
                         Py_ssize_t *stop)
{
    uint64_t ln;
    if (!cw_uvarint(b, end, pos, &ln))
        return 0;
    if (ln > (uint64_t)(end - *pos))
        return 0;
    *start = *pos;
    *stop = *pos + (Py_ssize_t)ln;
    *pos = *stop;
    return 1;
}

/* One field as protowire.fields gives it: number, wire type, value bounds (a LEN field's payload). */
typedef struct {
    uint64_t number;
    int wire_type;
    Py_ssize_t start, stop;
} cw_field;

/* The field at *pos inside [*pos, end): 1 and *pos past it, or 0 where protowire.fields raises
 * (field number 0 or over 2^29-1, groups and wire types 6 and 7, anything past `end`). */
static inline int cw_next_field(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, cw_field *f)
{
    uint64_t tag, skipped;
    if (!cw_uvarint(b, end, pos, &tag))
        return 0;
    f->number = tag >> 3;
    f->wire_type = (int)(tag & 7);
    if (f->number == 0 || f->number > CW_MAX_FIELD_NUMBER)
        return 0;
    switch (f->wire_type) {
    case CW_VARINT:
        f->start = *pos;
        if (!cw_uvarint(b, end, pos, &skipped))
            return 0;
        break;
    case CW_I64:
    case CW_I32: {
        Py_ssize_t width = f->wire_type == CW_I64 ? 8 : 4;
        if (end - *pos < width)
            return 0;
        f->start = *pos;
        *pos += width;
        break;
    }
    case CW_LEN:
        return cw_len(b, end, pos, &f->start, &f->stop);
    default:
        return 0;
    }
    f->stop = *pos;
    return 1;
}

/* The varint value of a field of wire type 0 (already bounded by cw_next_field). */
static inline uint64_t cw_field_varint(const uint8_t *b, const cw_field *f)
{
    Py_ssize_t p = f->start;
    uint64_t v = 0;
    (void)cw_uvarint(b, f->stop, &p, &v);
    return v;
}

/* 1 when [start, stop) is all ASCII (then it is valid UTF-8 without asking anyone). */
static inline int cw_ascii(const uint8_t *b, Py_ssize_t start, Py_ssize_t stop)
{
    uint8_t any = 0;
    for (Py_ssize_t i = start; i < stop; i++)
        any |= b[i];
    return any < 0x80;
}

#endif /* GPU_RELAY_COMMON_H */

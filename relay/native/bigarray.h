/* Arrays of BIG_BYTES and more in a mapping of their own, smaller ones from PyMem_Raw* (relay.native._cstage's
   tables, relay.native._cdcache's index and entries).

   glibc's dynamic mmap threshold rises after a large mapped block is freed (each table rebuild frees
   one), so later tables would land in the main heap and leave holes there when they are freed in turn.
   A mapping goes back whole. Every function returns NULL with no exception set when out of memory. */
#ifndef RELAY_BIGARRAY_H
#define RELAY_BIGARRAY_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define BIG_BYTES ((size_t)1 << 20)

static inline void *arr_map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* n * size zeroed bytes; NULL on overflow or when out of memory */
static inline void *arr_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size)
        return NULL;
    return n * size < BIG_BYTES ? PyMem_RawCalloc(n ? n : 1, size ? size : 1) : arr_map(n * size);
}

/* frees an array of `bytes` bytes from arr_calloc or arr_realloc (given the same size) */
static inline void arr_free(void *p, size_t bytes) {
    if (p == NULL)
        return;
    if (bytes < BIG_BYTES)
        PyMem_RawFree(p);
    else
        munmap(p, bytes);
}

/* p (old bytes, NULL: none) resized to new bytes, contents kept up to the smaller; NULL (p left as
   it was) when out of memory */
static inline void *arr_realloc(void *p, size_t old, size_t new) {
    if (p == NULL)
        return new < BIG_BYTES ? PyMem_RawMalloc(new) : arr_map(new);
    if (old < BIG_BYTES && new < BIG_BYTES)
        return PyMem_RawRealloc(p, new);
    if (old >= BIG_BYTES && new >= BIG_BYTES) {
        void *q = mremap(p, old, new, MREMAP_MAYMOVE);
        return q == MAP_FAILED ? NULL : q;
    }
    void *q = new < BIG_BYTES ? PyMem_RawMalloc(new) : arr_map(new);
    if (q == NULL)
        return NULL;
    memcpy(q, p, old < new ? old : new);
    arr_free(p, old);
    return q;
}

#endif

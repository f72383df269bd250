/* relay.native._cstage: the tables T12 (uint64 id -> uint32) and T8 (48-bit key -> 16-bit generation).
 *
 * Reference: the Python dicts of relay/state/series_tracker.py (SeriesTracker._series, the label
 * value dicts of SeriesTracker._note_labels): a table answers what such a dict answers, in 12 or 8
 * bytes an entry. One implementation serves both kinds: the helpers below take the entry kind
 * (cstage.h, K12 and K8) and are always inlined, so each wrapper is compiled for its own kind.
 */
#include "cstage.h"

uint64_t t12_key;

/* place an entry whose key (not 0) is known absent, with no growth check */
CS_INLINE void tbl_place(void *e, size_t cap, const void *entry, const TblKind *k) {
    size_t i = tbl_pos(k->key(entry), cap);
    while (k->key(tbl_at(e, i, k)) != 0)
        i = tbl_next(i, cap);
    memcpy(tbl_at(e, i, k), entry, k->size);
}

/* the table moved into cap buckets (at least TBL_MIN_CAP); -1 with MemoryError */
CS_INLINE int tbl_rebuild(Tbl *t, size_t cap, const TblKind *k) {
    if (cap < TBL_MIN_CAP)
        cap = TBL_MIN_CAP;
    void *e = arr_calloc(cap, k->size);
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < t->cap; i++)
        if (k->key(tbl_at(t->e, i, k)) != 0)
            tbl_place(e, cap, tbl_at(t->e, i, k), k);
    arr_free(t->e, t->cap * k->size);
    t->e = e;
    t->cap = cap;
    return 0;
}

/* an entry whose key is known absent (key 0 aside, with `value` as its value) */
CS_INLINE int tbl_add(Tbl *t, const void *entry, uint32_t value, const TblKind *k) {
    if (k->key(entry) == 0) {
        t->has_zero = 1;
        t->zero = value;
        return 0;
    }
    if (!tbl_fits(t->n + 1, t->cap)) {
        size_t cap = t->cap < TBL_MIN_CAP ? TBL_MIN_CAP : t->cap + t->cap / TBL_GROW_DIV;
        if (tbl_rebuild(t, cap, k) < 0)
            return -1;
    }
    tbl_place(t->e, t->cap, entry, k);
    t->n++;
    return 0;
}

CS_INLINE void tbl_del_at(Tbl *t, size_t i, const TblKind *k) {
    size_t j = i;
    for (;;) {
        j = tbl_next(j, t->cap);
        uint64_t kj = k->key(tbl_at(t->e, j, k));
        if (kj == 0)
            break;
        if (!tbl_stays(i, j, tbl_pos(kj, t->cap))) {
            memcpy(tbl_at(t->e, i, k), tbl_at(t->e, j, k), k->size);
            i = j;
        }
    }
    memset(tbl_at(t->e, i, k), 0, k->size);
    t->n--;
}

/* whether key (not 0) was there */
CS_INLINE int tbl_del(Tbl *t, uint64_t key, const TblKind *k) {
    char *b = tbl_find(t, key, k);
    if (b == NULL)
        return 0;
    tbl_del_at(t, (size_t)(b - (char *)t->e) / k->size, k);
    return 1;
}

CS_INLINE void tbl_free(Tbl *t, const TblKind *k) {
    arr_free(t->e, t->cap * k->size);
    t->e = NULL;
    t->cap = t->n = 0;
    t->has_zero = 0;
}

CS_INLINE Py_ssize_t tbl_remove_if(Tbl *t, tbl_pred dead, tbl_each gone, void *ctx, const TblKind *k) {
    size_t n_dead = 0;
    for (size_t i = 0; i < t->cap; i++) {
        const void *b = tbl_at(t->e, i, k);
        if (k->key(b) != 0 && dead(k->val(b), ctx))
            n_dead++;
    }
    Py_ssize_t total = (Py_ssize_t)n_dead;
    if (t->has_zero && dead(t->zero, ctx)) {
        t->has_zero = 0;
        if (gone)
            gone(t->zero, ctx);
        total++;
    }
    if (n_dead == 0)
        return total;
    if (n_dead * 2 > t->n) {
        size_t left = t->n - n_dead;
        size_t cap = left * 2 < TBL_MIN_CAP ? TBL_MIN_CAP : left * 2;
        void *e = arr_calloc(cap, k->size);
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < t->cap; i++) {
            const void *b = tbl_at(t->e, i, k);
            if (k->key(b) == 0)
                continue;
            if (!dead(k->val(b), ctx))
                tbl_place(e, cap, b, k);
            else if (gone)
                gone(k->val(b), ctx);
        }
        arr_free(t->e, t->cap * k->size);
        t->e = e;
        t->cap = cap;
        t->n = left;
        return total;
    }
    uint64_t *keys = PyMem_RawMalloc(n_dead * sizeof(uint64_t));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t m = 0;
    for (size_t i = 0; i < t->cap; i++) {
        const void *b = tbl_at(t->e, i, k);
        if (k->key(b) != 0 && dead(k->val(b), ctx)) {
            keys[m++] = k->key(b);
            if (gone)
                gone(k->val(b), ctx);
        }
    }
    for (size_t i = 0; i < m; i++)
        tbl_del(t, keys[i], k);
    PyMem_RawFree(keys);
    /* give memory back once a table is a quarter full (after deletions) */
    if (t->cap > TBL_MIN_CAP && t->n * 4 < t->cap && tbl_rebuild(t, t->n * 2, k) < 0)
        return -1;
    return total;
}

/* ---- T12 ---------------------------------------------------------------------------------------- */

void t12_free(T12 *t) { tbl_free(t, &K12); }

int t12_put(T12 *t, uint64_t k, uint32_t v) {
    uint32_t *p = t12_find(t, k);
    if (p != NULL) {
        *p = v;
        return 0;
    }
    E12 e = {(uint32_t)k, (uint32_t)(k >> 32), v};
    return tbl_add(t, &e, v, &K12);
}

int t12_del(T12 *t, uint64_t k) {
    if (k == 0) {
        int had = t->has_zero;
        t->has_zero = 0;
        return had;
    }
    return tbl_del(t, k, &K12);
}

Py_ssize_t t12_remove_if(T12 *t, tbl_pred dead, tbl_each gone, void *ctx) {
    return tbl_remove_if(t, dead, gone, ctx, &K12);
}

/* ---- T8 ----------------------------------------------------------------------------------------- */

void t8_free(T8 *t) { tbl_free(t, &K8); }

int t8_add(T8 *t, uint64_t k, uint16_t g) {
    uint64_t e = k << 16 | g;
    return tbl_add(t, &e, g, &K8);
}

Py_ssize_t t8_remove_if(T8 *t, tbl_pred dead, void *ctx) { return tbl_remove_if(t, dead, NULL, ctx, &K8); }

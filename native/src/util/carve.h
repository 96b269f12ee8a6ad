/* carve.h — several arrays in one allocation: lay the pieces out with carve(), allocate the total
 * once, and find each piece at its offset. A decode step's layers make many short-lived buffers;
 * one malloc/free pair per call instead of one per buffer (glibc's allocator was ~4 % of a small
 * model's step). */
#ifndef STRATA_UTIL_CARVE_H
#define STRATA_UTIL_CARVE_H

#include <stddef.h>

/* Places a piece of `bytes` (aligned to `align`, a power of two) at the end of the block being laid
 * out: returns its offset and grows *total. */
static inline size_t carve(size_t *total, size_t bytes, size_t align) {
    const size_t at = (*total + align - 1) & ~(align - 1);
    *total = at + bytes;
    return at;
}

#endif

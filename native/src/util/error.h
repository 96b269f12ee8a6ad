/* error.h — the per-thread last-error message behind strata_last_error(). */
#ifndef STRATA_UTIL_ERROR_H
#define STRATA_UTIL_ERROR_H

#include "strata.h"

/* Formats the message into this thread's buffer and returns `status` (for one-line returns:
 * `return strata_fail(STRATA_ERR_FORMAT, "%s: ...", path);`). Truncates long messages. */
strata_status strata_fail(strata_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

/* error.c — per-thread error messages. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char g_last_error[1024];

strata_status strata_fail(strata_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *strata_last_error(void) { return g_last_error; }

const char *strata_status_str(strata_status status) {
    switch (status) {
    case STRATA_OK: return "ok";
    case STRATA_ERR_INVALID_ARG: return "invalid argument";
    case STRATA_ERR_IO: return "I/O error";
    case STRATA_ERR_FORMAT: return "format error";
    case STRATA_ERR_UNSUPPORTED: return "unsupported";
    case STRATA_ERR_NOMEM: return "out of memory";
    case STRATA_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case STRATA_ERR_NOT_FOUND: return "not found";
    case STRATA_ERR_NO_DEVICE: return "no device";
    case STRATA_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

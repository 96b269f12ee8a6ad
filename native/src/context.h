/* context.h — what subsystems may use of a strata_context (its pool). */
#ifndef STRATA_CONTEXT_H
#define STRATA_CONTEXT_H

#include "strata.h"
#include "util/threadpool.h"

/* The context's persistent worker pool; NULL for a NULL context (run on the caller). */
strata_pool *strata_context_pool(strata_context *ctx);

#endif

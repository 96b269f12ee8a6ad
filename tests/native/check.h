/* check.h — the native unit tests' assertion: a failed CHECK prints where, what and the library's last
 * error, counts the failure and goes on, so one run reports every failure; main returns g_failed != 0.
 * One copy per test binary (each includes this once). */
#ifndef STRATA_TESTS_CHECK_H
#define STRATA_TESTS_CHECK_H

#include <stdio.h>

#include "strata.h"

static int g_failed = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,  \
                    __LINE__, #cond, strata_last_error());                           \
            g_failed++;                                                              \
        }                                                                            \
    } while (0)

#endif

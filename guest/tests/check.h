/* The host unit tests' check macro and counters (defined in test_main.c). */
#ifndef CHECK_H
#define CHECK_H

#include <stdio.h>

extern int failures, checks;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(c)) {                                                                                \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
        }                                                                                          \
    } while (0)

void test_apf_waiters(void);

#endif

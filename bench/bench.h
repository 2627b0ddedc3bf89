/* What the C benchmarks share: a monotonic clock in ns, an ascending sort of doubles, and one
   line of percentiles (p50, p99, max) of n samples in ns, printed in `unit` (ns per unit given). */
#ifndef MOKKA_BENCH_H
#define MOKKA_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline void sort_doubles(double *v, size_t n)
{
    qsort(v, n, sizeof(double), cmp_double);
}

static inline void report_percentiles(const char *what, int width, double *v, int n, double ns_per_unit,
                                      const char *unit, int decimals)
{
    sort_doubles(v, (size_t)n);
    printf("%-*s p50 %8.*f %s   p99 %8.*f %s   max %8.*f %s\n", width, what, decimals, v[n / 2] / ns_per_unit,
           unit, decimals, v[n * 99 / 100] / ns_per_unit, unit, decimals, v[n - 1] / ns_per_unit, unit);
}

#endif

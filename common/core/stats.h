/* stats.h: the median, for every timing of the course (a run's step time,
 * the benchmarks' repeats). */
#ifndef STATS_H
#define STATS_H

/* Median of n values (n > 0); the array is reordered. */
double median(double *values, int n);

#endif

"""The one timing helper of the benchmarks (recops_tf.bench, tools/bench_layers.py, the
multi-worker collective benchmark)."""
import statistics
import time


def median_seconds(fn, warmup=1, reps=5):
    """Median wall time of ``fn()`` in seconds over ``reps`` calls, after ``warmup`` calls
    (traces, first-touch allocations, connections)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)

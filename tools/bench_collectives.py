#!/usr/bin/env python3
"""Throughput of recops_tf.distributed.all_to_all between local worker processes (one run):

    python tools/bench_collectives.py                       # 2 workers, 64 MB each, even split
    python tools/bench_collectives.py --workers 3 --split skewed --mb 16

Each worker sends MB megabytes (1 KiB rows) split among the ranks; the table shows the median
time of an all_to_all, its payload throughput, the same bytes through TensorFlow's equal
all-to-all (no count exchange, no padding) and through a local memory copy (numpy), and the
bytes the padded design moves per rank (R x the largest chunk).
"""
import argparse
import sys

from recops_tf.testing.drivers import multiworker


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mb", type=float, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--split", choices=("even", "skewed"), default="even")
    args = parser.parse_args(argv)
    outcomes = multiworker.launch("bench", args.workers, timeout=600, env={
        "RECOPS_BENCH_MB": str(args.mb), "RECOPS_BENCH_REPS": str(args.reps),
        "RECOPS_BENCH_SPLIT": args.split})
    print(f"all_to_all, {args.workers} workers on 127.0.0.1, {args.mb:g} MB per worker, "
          f"{args.split} split, median of {args.reps}")
    print(f"{'rank':>4} {'a2a ms':>9} {'MB/s':>8} {'equal a2a ms':>13} {'memcpy ms':>10} "
          f"{'a2a / memcpy':>13} {'moved / payload':>16}")
    for rank, (code, r, tail) in enumerate(outcomes):
        if code != 0 or not r:
            print(f"rank {rank} failed ({code}):\n{tail}")
            return 1
        payload, seconds = float(r["payload_bytes"]), float(r["seconds"])
        print(f"{rank:>4} {seconds * 1e3:>9.1f} {payload / seconds / 1e6:>8.0f} "
              f"{float(r['equal_seconds']) * 1e3:>13.1f} {float(r['copy_seconds']) * 1e3:>10.1f} "
              f"{seconds / float(r['copy_seconds']):>12.1f}x "
              f"{float(r['moved_bytes']) / payload:>15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

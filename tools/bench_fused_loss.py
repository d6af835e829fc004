#!/usr/bin/env python3
"""The fused loss across the acceptance grid of issue 53: ``fused_linear_cross_entropy``
forward and forward + backward (the gradients of states and items) at positions x items x
width, as a share of the machine's matmul rate of the same dtype measured in the same run.

    python tools/bench_fused_loss.py                       # float32, the default grid
    python tools/bench_fused_loss.py --dtype bfloat16 --grid 2100x12000x64,13000x12000x50

"rate" counts the useful FLOPs, those a composite would do too: 2·P·N·d forward, 6·P·N·d
forward + backward (the backward's recomputed logits, another 2·P·N·d, are not counted).
Forward + backward is timed twice: the forward then the backward ("fwd+bwd"), and the
forward that makes the gradients as it goes (``gradients_in_forward=True``, "one pass", the
trainer's training step), whose products are the 6·P·N·d counted.
The matmul ceiling (``recops_tf.bench.matmul_ceiling_gflops``, a 2048-square
``tf.linalg.matmul``) is measured before each case and the case's share is of that
measurement, so a neighbour on the machine moves both. No composite here: at 1,000,000
items its [P, N] logits do not fit (``tools/bench.py fused_linear_cross_entropy`` times it at
the ops table's sizes).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import recops_tf  # noqa: E402
from recops_tf.bench import matmul_ceiling_gflops  # noqa: E402

GRID = "2100x12000x50,13000x12000x50,2100x100000x50,2000x1000000x50,2100x12000x128,2100x12000x256"


def _grid(text):
    try:
        cases = [tuple(int(v) for v in c.split("x")) for c in text.split(",") if c]
    except ValueError:
        cases = []
    if not cases or any(len(c) != 3 or min(c) < 1 for c in cases):
        raise argparse.ArgumentTypeError(f"expected PxNxD[,PxNxD...] of positive integers, "
                                         f"got {text!r}")
    return cases


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=_grid, default=_grid(GRID),
                        help=f"cases as PxNxD, comma separated (default {GRID})")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--reps", type=int, default=3, help="timed calls a case (the fastest "
                        "counts)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    return args


def _best(fn, reps):
    [x.numpy() for x in tf.nest.flatten(fn())]  # trace and warm up
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        [x.numpy() for x in tf.nest.flatten(fn())]
        best = min(best, time.perf_counter() - start)
    return best


def run_case(p, n, d, dtype, reps):
    rng = np.random.default_rng(0)
    states = tf.cast(rng.standard_normal((p, d), np.float32) * 0.1, dtype)
    items = tf.cast(rng.standard_normal((n, d), np.float32) * 0.1, dtype)
    targets = tf.constant(rng.integers(0, n, p), tf.int32)

    @tf.function
    def forward():
        return tf.reduce_sum(recops_tf.fused_linear_cross_entropy(states, items, targets))

    def forward_backward(one_pass):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                tape.watch([states, items])
                loss = tf.reduce_sum(recops_tf.fused_linear_cross_entropy(
                    states, items, targets, gradients_in_forward=one_pass))
            return tape.gradient(loss, [states, items])
        return step

    ceiling = matmul_ceiling_gflops(2048, dtype=dtype)
    fwd = _best(forward, reps)
    both = _best(forward_backward(False), reps)
    one = _best(forward_backward(True), reps)
    return ceiling, fwd, both, one


def main(argv=None):
    args = parse(argv)
    dtype = tf.as_dtype(args.dtype)
    print(f"fused_linear_cross_entropy, {args.dtype}, fastest of {args.reps} calls; "
          f"% of the {args.dtype} matmul measured just before each case")
    print(f"{'P':>7} {'N':>9} {'d':>5}  {'matmul GF/s':>11}  {'fwd ms':>9} {'% mm':>5}  "
          f"{'fwd+bwd ms':>10} {'% mm':>5}  {'one pass ms':>11} {'% mm':>5}")
    for p, n, d in args.grid:
        ceiling, fwd, both, one = run_case(p, n, d, dtype, args.reps)
        flops = p * n * d  # multiply-adds of one product: the forward makes 1, the gradients 3

        def share(seconds, products):
            return 100 * 2 * products * flops / seconds / 1e9 / ceiling

        print(f"{p:>7,} {n:>9,} {d:>5}  {ceiling:>11.0f}  {fwd * 1e3:>9.1f} "
              f"{share(fwd, 1):>4.0f}%  {both * 1e3:>10.1f} {share(both, 3):>4.0f}%  "
              f"{one * 1e3:>11.1f} {share(one, 3):>4.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

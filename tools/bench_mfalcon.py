#!/usr/bin/env python3
"""M-FALCON against the naive reruns: one user's history of L tokens, m ranking candidates
scored through a stack of HSTUBlocks (recops_tf.recommender.mfalcon), both in the same run:

    python tools/bench_mfalcon.py                    # L = 200, 1000; m = 64, 512, 2048
    python tools/bench_mfalcon.py --quick            # L = 200; m = 64, 512; 2 rounds
    python tools/bench_mfalcon.py --heads 1 --head-dim 32 --micro-batch 64 --rounds 7
    python tools/bench_mfalcon.py --layouts          # + one paged call per micro-batch

Per (L, m): ``history_cache`` (the history's forward once, its keys/values paged),
``score_targets`` on that cache (the candidates only: one paged attention call per block, the
micro-batches of ``--micro-batch`` candidates its sequences), their sum (the M-FALCON cost of
a request) and ``rerun_targets`` (each micro-batch with the whole history through the blocks'
``call``). Every path is a tf.function traced once with ``[None, d_model]`` signatures (no
Python overhead on either side); the rounds run the paths alternately (a shared, noisy
machine) and the table gives medians, the speed-up of M-FALCON (cache build included) over
the reruns, and the largest difference of their outputs. ``--layouts`` adds the candidates'
time with one paged call per micro-batch (a tf.while_loop, ``micro_batches_per_call=1``).
"""
import argparse
import statistics
import sys
import time

import numpy as np


def _median_ms(times):
    return 1e3 * statistics.median(times)


def bench(lengths, candidates, micro_batch, d_model, num_blocks, heads, head_dim, page_size,
          rounds, layouts=False, precision="f32", seed=0):
    import keras
    import tensorflow as tf

    from recops_tf.layers import HSTUBlock
    from recops_tf.recommender import mfalcon

    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy({"f32": "float32", "bf16": "mixed_bfloat16"}[precision])
    try:
        keras.utils.set_random_seed(seed)
        # max_seq_len: the reruns read L + b_m tokens (and 1 / max_seq_len is the SiLU scale).
        blocks = [HSTUBlock(heads, head_dim, max(lengths) + micro_batch, target_group_size=1,
                            name=f"block_{i}") for i in range(num_blocks)]
        for block in blocks:
            block.build((None, d_model))
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    spec = tf.TensorSpec([None, d_model], tf.float32)

    @tf.function(input_signature=[spec])
    def cache_of(history):
        return mfalcon.history_cache(blocks, history, page_size)

    @tf.function(reduce_retracing=True)
    def score(cache, targets):
        return mfalcon.score_targets(blocks, cache, targets, micro_batch)

    @tf.function(reduce_retracing=True)
    def score_looped(cache, targets):
        return mfalcon.score_targets(blocks, cache, targets, micro_batch,
                                     micro_batches_per_call=1)

    @tf.function(input_signature=[spec, spec])
    def mfalcon_total(history, targets):
        return mfalcon.score_targets(blocks, mfalcon.history_cache(blocks, history, page_size),
                                     targets, micro_batch)

    @tf.function(input_signature=[spec, spec])
    def rerun(history, targets):
        return mfalcon.rerun_targets(blocks, history, targets, micro_batch)

    rng = np.random.default_rng(seed)
    results = []
    for L in lengths:
        history = tf.constant(rng.uniform(-1, 1, (L, d_model)), tf.float32)
        for m in candidates:
            targets = tf.constant(rng.uniform(-1, 1, (m, d_model)), tf.float32)
            cache = cache_of(history)
            paths = {"cache": lambda: cache_of(history),
                     "score": lambda: score(cache, targets),
                     "total": lambda: mfalcon_total(history, targets),
                     "rerun": lambda: rerun(history, targets)}
            if layouts:
                paths["looped"] = lambda: score_looped(cache, targets)
            outputs = {name: fn() for name, fn in paths.items()}  # warm-up (traces)
            times = {name: [] for name in paths}
            for _ in range(rounds):
                for name, fn in paths.items():
                    start = time.perf_counter()
                    out = fn()
                    tf.nest.map_structure(lambda t: t.numpy(), out)
                    times[name].append(time.perf_counter() - start)
            as64 = lambda t: tf.cast(t, tf.float64).numpy()  # noqa: E731
            diff = float(np.abs(as64(outputs["total"]) - as64(outputs["rerun"])).max())
            diff_layout = (float(np.abs(as64(outputs["looped"]) - as64(outputs["score"])).max())
                           if layouts else None)
            row = dict(L=L, m=m, **{name: _median_ms(t) for name, t in times.items()},
                       diff=diff, diff_layout=diff_layout)
            results.append(row)
            print(f"L={L} m={m}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()
                                               if k in times), file=sys.stderr, flush=True)
    return results


def table(results, micro_batch, layouts):
    head = ("| L | m | b_m | cache build (ms) | score, cached (ms) | M-FALCON total (ms) "
            "| rerun (ms) | rerun / M-FALCON | max abs diff |")
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['L']} | {r['m']} | {micro_batch} | {r['cache']:.1f} | "
                     f"{r['score']:.1f} | {r['total']:.1f} | {r['rerun']:.1f} | "
                     f"{r['rerun'] / r['total']:.1f}x | {r['diff']:.2e} |")
    if layouts:
        lines += ["", "| L | m | score, one paged call (ms) | score, a call per micro-batch (ms) "
                  "| ratio | max abs diff |", "|---:|---:|---:|---:|---:|---:|"]
        for r in results:
            lines.append(f"| {r['L']} | {r['m']} | {r['score']:.1f} | {r['looped']:.1f} | "
                         f"{r['looped'] / r['score']:.2f}x | {r['diff_layout']:.2e} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 1000],
                        help="history lengths L")
    parser.add_argument("--candidates", type=int, nargs="+", default=[64, 512, 2048],
                        help="numbers of candidates m")
    parser.add_argument("--micro-batch", type=int, default=64, help="b_m")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--page-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians)")
    parser.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                        help="bf16: the blocks under Keras' mixed_bfloat16 policy")
    parser.add_argument("--layouts", action="store_true",
                        help="also time one paged call per micro-batch")
    parser.add_argument("--quick", action="store_true",
                        help="L = 200, m = 64 and 512, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.candidates, args.rounds = [200], [64, 512], 2
    results = bench(args.lengths, args.candidates, args.micro_batch, args.d_model, args.blocks,
                    args.heads, args.head_dim, args.page_size, args.rounds, args.layouts,
                    args.precision)
    print(f"M-FALCON vs reruns: {args.blocks} blocks, d_model {args.d_model}, {args.heads} "
          f"heads of {args.head_dim}, page size {args.page_size}, {args.precision}, medians of "
          f"{args.rounds} rounds\n")
    print(table(results, args.micro_batch, args.layouts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

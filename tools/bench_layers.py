#!/usr/bin/env python3
"""Fused vs stock-TF benchmark of the composite Keras layers (one run; median of repetitions):

    python tools/bench_layers.py                    # HSTUBlock, B=32, L uniform in [1, 512]
    python tools/bench_layers.py --batch 8 --max-len 128 --reps 3
    python tools/bench_layers.py --precision bf16   # both builds under mixed_bfloat16

The stock build is the same layer with ``use_fused=False`` (same weights): padded attention
composite, matmul + SiLU + split, LayerNorm · U. Times the forward and the forward + backward
(gradients of every weight and of the input rows) inside tf.function.
"""
import argparse
import sys

import numpy as np
import tensorflow as tf

from recops_tf._timing import median_seconds


def bench_hstu_block(batch, max_len, d_model, heads, warmup, reps, seed=0, precision="f32"):
    """Fused vs stock HSTUBlock; ``precision="bf16"`` builds both under Keras' mixed_bfloat16
    policy (bf16 compute and kernels, f32 variables)."""
    import keras

    from recops_tf.layers import HSTUBlock

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=batch)
    rows = rng.uniform(-1, 1, size=(int(lengths.sum()), d_model)).astype(np.float32)
    x = tf.RaggedTensor.from_row_lengths(rows, lengths)
    head_dim = d_model // heads
    keras.utils.set_random_seed(seed)
    blocks = {}
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy({"f32": "float32", "bf16": "mixed_bfloat16"}[precision])
    try:
        for fused in (True, False):
            blocks[fused] = HSTUBlock(num_heads=heads, head_dim=head_dim, max_seq_len=max_len,
                                      use_fused=fused)
            blocks[fused](x)
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    blocks[False].set_weights(blocks[True].get_weights())
    results = []
    for fused, block in blocks.items():
        forward = tf.function(lambda x, b=block: b(x, training=True).values)

        @tf.function
        def forward_backward(x, b=block):
            with tf.GradientTape() as tape:
                tape.watch(x.values)
                loss = tf.reduce_sum(tf.cast(b(x, training=True).values, tf.float32) ** 2)
            return tape.gradient(loss, b.trainable_variables + [x.values])

        results.append((fused, 1e3 * median_seconds(lambda: forward(x), warmup, reps),
                        1e3 * median_seconds(lambda: forward_backward(x), warmup,
                                                           reps)))
    label = f"HSTUBlock {precision} B={batch} L<={max_len} d_model={d_model} H={heads}"
    (_, f_fwd, f_all), (_, s_fwd, s_all) = results
    print(f"{label}: forward fused {f_fwd:.1f} ms, stock {s_fwd:.1f} ms, {s_fwd / f_fwd:.2f}x; "
          f"forward+backward fused {f_all:.1f} ms, stock {s_all:.1f} ms, {s_all / f_all:.2f}x")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                        help="bf16: both builds under Keras' mixed_bfloat16 policy")
    args = parser.parse_args(argv)
    bench_hstu_block(args.batch, args.max_len, args.d_model, args.heads, args.warmup,
                     args.reps, precision=args.precision)
    return 0


if __name__ == "__main__":
    sys.exit(main())

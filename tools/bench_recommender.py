#!/usr/bin/env python3
"""Training-step time of the main job's recommender (``recops-tf train``'s step: forward,
backward, optimizer) on random ragged batches, in one run:

* sampled softmax at catalogues of 1,000 and 1,000,000 items (the step must not grow with the
  catalogue: it touches the batch's items and its B x N negatives only), next to the full
  softmax at the same sizes while that fits, and the sampled softmax with its negatives drawn
  per position (the defaults' loss on long histories; on a catalogue of at most
  ``DENSE_NEGATIVES_PER_ITEM`` x 128 items its logits come from the catalogue's logits);
  (each catalogue item has its row in the growing table first: the steady state after an
  epoch, not the allocation of new rows);
* the fused build against ``--no-fused`` (stock TF: Keras Embedding + Adam, the blocks'
  reference paths) on the same batches.

    python tools/bench_recommender.py [--preset hstu] [--reps 10] [--batch 128] [--json F]

Times are medians of ``--reps`` steps after ``--warmup`` steps; cases alternate so that drift
of the shared machine hits all of them alike.
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from recops_tf.recommender import model as model_module  # noqa: E402
from recops_tf.recommender import training  # noqa: E402


def batches(num_items, batch, max_len, count, seed):
    """`count` ragged (items, timestamps) batches of `batch` histories of 2..max_len + 1
    items drawn uniformly from the catalogue (lengths uniform, mean about max_len / 2)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        lengths = rng.integers(2, max_len + 2, size=batch)
        items = rng.integers(1, num_items + 1, size=lengths.sum())
        stamps = np.concatenate([np.sort(rng.integers(0, 10**8, size=n)) for n in lengths])
        out.append((tf.RaggedTensor.from_row_lengths(items, lengths),
                    tf.RaggedTensor.from_row_lengths(stamps, lengths)))
    return out


def _composite_full_softmax(model, states, targets, training, read, label_smoothing,
                            matrix=None):
    """The full softmax as it was before the fused loss: the [P, num_items] logits built,
    soft-maxed and differentiated by stock TF (the baseline of the "full-composite" rows),
    from the catalogue's rows the step looked up (`matrix`, raw) when it did."""
    if matrix is None:
        logits, target = model_module._catalogue_logits(model, states, targets, training, read)
    else:
        head = tf.math.l2_normalize(matrix, axis=-1, epsilon=1e-12) if model.l2_norm else matrix
        logits = model.scores(states.flat_values, training=training, matrix=head)
        if model.seen_bias and read is not None:
            logits += model_module._seen_bias_full(model, states, read)
        target = tf.gather(logits, targets.flat_values - 1, batch_dims=1)
    return model_module._cross_entropy(logits, target, label_smoothing)


def make_case(preset, num_items, loss, fused, args):
    if loss == "full-composite":  # traced (in the warm-up steps below) with the composite
        fused_loss = model_module._fused_full_softmax
        model_module._fused_full_softmax = _composite_full_softmax
        try:
            return make_case(preset, num_items, "full", fused, args)
        finally:
            model_module._fused_full_softmax = fused_loss
    per = "position" if loss == "per-position" else "sequence"
    config = training.Config.from_preset(preset, loss="sampled" if per == "position" else loss,
                                         negatives_per=per, use_fused=fused,
                                         precision=args.precision,
                                         batch_size=args.batch, max_seq_len=args.max_len)
    model = training.build_model(config, num_items)
    optimizer = training.make_optimizer(config)
    step = training.train_step(model, optimizer, tf.random.Generator.from_seed(0), config,
                               num_items)
    data = batches(num_items, args.batch, args.max_len, args.warmup + args.reps, seed=1)
    if fused:  # steady state: every catalogue item has its row (as after a first epoch)
        for first in range(1, num_items + 1, 1 << 18):
            ids = tf.range(first, min(first + (1 << 18), num_items + 1), dtype=tf.int64)
            model.item_embedding(ids, training=True)
    for b in data[:args.warmup]:
        step(*b).numpy()
    return step, data[args.warmup:]


def peak_memory(args):
    """Peak resident memory (ru_maxrss) of a process that builds one case and runs
    ``--warmup + --reps`` steps, for the sampled and the full softmax at the last catalogue
    size: each in a child process of its own (a process's peak covers everything it did)."""
    import subprocess
    import sys
    n = int(args.catalogues.split(",")[-1])
    out = {}
    for loss in ("sampled", "full"):
        code = ("import resource, sys; sys.argv = ['bench']; import bench_recommender as b; "
                f"args = b.parse([*{args.passthrough!r}]); "
                f"step, data = b.make_case(args.preset, {n}, {loss!r}, True, args); "
                "[step(*x).numpy() for x in data]; "
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
        if done.returncode != 0:
            out[loss] = None
            print(f"{loss} softmax at {n:,} items: failed ({done.returncode}): "
                  f"{done.stderr.strip().splitlines()[-1:]}")
            continue
        out[loss] = int(done.stdout.split()[-1]) / 1024.0
        print(f"{loss} softmax at {n:,} items: peak memory {out[loss]:,.0f} MiB")
    if out.get("sampled") and out.get("full"):
        print(f"full / sampled peak memory at {n:,} items: {out['full'] / out['sampled']:.2f}x")
    return out


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="hstu", choices=sorted(training.PRESETS))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--catalogues", default="1000,1000000")
    parser.add_argument("--full-up-to", type=int, default=100_000,
                        help="also time the full softmax at catalogues up to this size")
    parser.add_argument("--composite-up-to", type=int, default=12_000,
                        help="also time the full softmax's stock-TF composite (the [P, N] "
                        "logits built) at catalogues up to this size")
    parser.add_argument("--precision", default="f32", choices=sorted(training.PRECISIONS))
    parser.add_argument("--memory", action="store_true",
                        help="instead of timing, the peak memory of the sampled and the full "
                        "softmax at the last catalogue size, each in a process of its own")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    args.passthrough = [a for a in (argv if argv is not None else __import__("sys").argv[1:])
                        if a != "--memory"]
    return args


def main(argv=None):
    args = parse(argv)
    if args.memory:
        memory = peak_memory(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "peak_mib": memory}, f, indent=1)
        return 0
    sizes = [int(s) for s in args.catalogues.split(",")]
    cases = {}
    for n in sizes:
        cases[("sampled", n, True)] = make_case(args.preset, n, "sampled", True, args)
        if n <= args.full_up_to:
            cases[("full", n, True)] = make_case(args.preset, n, "full", True, args)
            cases[("per-position", n, True)] = make_case(args.preset, n, "per-position", True,
                                                         args)
        if n <= args.composite_up_to:
            cases[("full-composite", n, True)] = make_case(args.preset, n, "full-composite",
                                                           True, args)
    if args.precision == "f32":  # (--no-fused under bf16 does not build: see the docs)
        cases[("sampled", sizes[0], False)] = make_case(args.preset, sizes[0], "sampled",
                                                        False, args)
    times = {key: [] for key in cases}
    for i in range(args.reps):  # alternate the cases, step by step
        for key, (step, data) in cases.items():
            start = time.perf_counter()
            step(*data[i]).numpy()
            times[key].append(time.perf_counter() - start)
    median = {key: float(np.median(t)) for key, t in times.items()}
    print(f"--preset {args.preset}, --precision {args.precision}, batch {args.batch}, "
          f"histories of 1..{args.max_len} "
          f"items, median of {args.reps} steps")
    print(f"{'loss':<15}{'catalogue':>11}  {'build':<10}{'ms/step':>9}")
    for (loss, n, fused), t in median.items():
        print(f"{loss:<15}{n:>11,}  {'fused' if fused else 'no-fused':<10}{t * 1e3:>9.1f}")
    for n in sizes:
        if ("full", n, True) in median:
            print(f"full softmax / sampled at {n:,} items: "
                  f"{median[('full', n, True)] / median[('sampled', n, True)]:.2f}x")
        if ("full-composite", n, True) in median:
            print(f"full softmax, stock-TF composite / fused loss at {n:,} items: "
                  f"{median[('full-composite', n, True)] / median[('full', n, True)]:.2f}x")
        if ("per-position", n, True) in median:
            print(f"per-position / full softmax at {n:,} items: "
                  f"{median[('per-position', n, True)] / median[('full', n, True)]:.2f}x")
    small, large = sizes[0], sizes[-1]
    growth = median[("sampled", large, True)] / median[("sampled", small, True)]
    speedup = (median[("sampled", small, False)] / median[("sampled", small, True)]
               if ("sampled", small, False) in median else float("nan"))
    print(f"sampled softmax: step at {large:,} items / at {small:,} items: {growth:.2f}x")
    print(f"fused vs --no-fused at {small:,} items: {speedup:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "growth": growth, "fused_speedup": speedup,
                       "ms_per_step": {f"{k[0]}/{k[1]}/{'fused' if k[2] else 'no-fused'}":
                                       v * 1e3 for k, v in median.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

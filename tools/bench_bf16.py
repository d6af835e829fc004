#!/usr/bin/env python3
"""bfloat16 against float32 HSTU attention in one run: the fused kernel's time in each dtype,
call by call alternately (these machines are shared and noisy: a ratio measured in one run,
interleaved, is the figure to trust), beside TensorFlow's float32 and bfloat16 matmul
ceilings measured in the same process. With --paths, each instruction-set path this CPU has
(RECOPS_ISA, kernels/common/dispatch.h) runs in a child process of its own and the table has a
row per path: the bfloat16 path's gain over bfloat16 computed in float FMAs is then the
`avx512bf16` row against the `avx512` one, and on a CPU with AMX-BF16 the tiles' gain the `amx`
row against the `avx512bf16` one (`amx` is the default path where the CPU and OS allow it).

    python tools/bench_bf16.py                      # this CPU's best path
    python tools/bench_bf16.py --paths avx512bf16 avx512 --rounds 3
    python tools/bench_bf16.py --paths amx avx512bf16 --rounds 3   # an AMX machine
    python tools/bench_bf16.py --max-len 256 --loop 20   # short sequences, per graph-loop step

With --loop STEPS, each timed call runs STEPS steps in a graph loop (tf.while_loop) and the
table gives the time per step: the kernel without the cost of a tf.function call (0.45-0.7 ms
on a 2-core Zen 4 with these ragged inputs), which a model pays once per training step, not
per op.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _measure(args):
    import numpy as np
    import tensorflow as tf

    import recops_tf as rt
    from recops_tf.bench import _looped, matmul_ceiling_gflops

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, args.max_len + 1, args.batch)
    total = int(lengths.sum())
    h, d = args.heads, args.dim
    flops_fwd = 2 * h * (d + d) * float((lengths.astype(np.float64) ** 2).sum()) / 2
    base = rng.uniform(-1, 1, (3, total, h, d)).astype(np.float32)
    steps = {}
    for dtype in (tf.float32, tf.bfloat16):
        q, k, v = (tf.RaggedTensor.from_row_lengths(tf.constant(x, dtype), lengths) for x in base)
        upstream = tf.cast(tf.constant(rng.uniform(-1, 1, (total, h, d)), tf.float32), dtype)

        @tf.function
        def forward(q, k, v, upstream):
            return rt.hstu_attention(q, k, v, max_seq_len=args.max_len).flat_values

        @tf.function
        def forward_backward(q, k, v, upstream):
            with tf.GradientTape() as tape:
                tape.watch([q.flat_values, k.flat_values, v.flat_values])
                out = rt.hstu_attention(q, k, v, max_seq_len=args.max_len).flat_values
            return out, tape.gradient(out, [q.flat_values, k.flat_values, v.flat_values],
                                      output_gradients=upstream)

        if args.loop > 0:
            forward, forward_backward = (_looped(f, args.loop)
                                         for f in (forward, forward_backward))
        inputs = (q, k, v, upstream)
        steps[dtype.name] = {"forward": (forward, inputs, flops_fwd),
                             "forward+backward": (forward_backward, inputs, 3 * flops_fwd)}
    ceilings = {"float32": matmul_ceiling_gflops(args.matmul_n),
                "bfloat16": matmul_ceiling_gflops(args.matmul_n, dtype=tf.bfloat16)}
    rows = []
    for mode in ("forward", "forward+backward"):
        times = {"float32": [], "bfloat16": []}
        for name in times:  # warm up (traces, thread-local scratch)
            fn, inputs, _ = steps[name][mode]
            for _ in range(args.warmup):
                tf.nest.map_structure(lambda t: t.numpy(), fn(*inputs))
        for _ in range(args.reps):
            for name in times:
                fn, inputs, _ = steps[name][mode]
                start = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy(), fn(*inputs))
                times[name].append(time.perf_counter() - start)
        f32, bf16 = (statistics.median(times[n]) / max(args.loop, 1)
                     for n in ("float32", "bfloat16"))
        flops = steps["float32"][mode][2]
        rows.append({"mode": mode, "float32_ms": 1e3 * f32, "bfloat16_ms": 1e3 * bf16,
                     "speedup": f32 / bf16, "float32_gflops": flops / f32 / 1e9,
                     "bfloat16_gflops": flops / bf16 / 1e9,
                     "float32_of_ceiling": flops / f32 / 1e9 / ceilings["float32"],
                     "bfloat16_of_ceiling": flops / bf16 / 1e9 / ceilings["bfloat16"]})
    return {"ceilings": ceilings, "rows": rows, "loop": args.loop}


def _table(path, report):
    c = report["ceilings"]
    lines = [f"[{path}] matmul ceilings: float32 {c['float32']:.0f} GFLOP/s, "
             f"bfloat16 {c['bfloat16']:.0f} GFLOP/s"
             + (f"; per step in graph loops of {report['loop']}" if report.get("loop") else
                "; per tf.function call")]
    for r in report["rows"]:
        lines.append(
            f"[{path}] {r['mode']:<17} float32 {r['float32_ms']:8.2f} ms "
            f"({100 * r['float32_of_ceiling']:4.1f}% of f32 ceiling)  bfloat16 "
            f"{r['bfloat16_ms']:8.2f} ms ({100 * r['bfloat16_of_ceiling']:4.1f}% of bf16 "
            f"ceiling)  bf16 speedup {r['speedup']:.2f}x")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--matmul-n", type=int, default=2048)
    parser.add_argument("--loop", type=int, default=0, metavar="STEPS",
                        help="time STEPS steps per call in a graph loop (per step figures)")
    parser.add_argument("--paths", nargs="*", default=None,
                        help="RECOPS_ISA paths to run, each in a child process")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --paths: rounds over the paths, alternating")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop < 0:
        parser.error("--loop must be >= 0")
    if args.paths is None:
        report = _measure(args)
        if args.json:
            print(json.dumps(report))
        else:
            print(_table(os.environ.get("RECOPS_ISA", "best"), report))
        return 0
    child = [sys.executable, os.path.abspath(__file__), "--json", "--batch", str(args.batch),
             "--max-len", str(args.max_len), "--heads", str(args.heads), "--dim", str(args.dim),
             "--warmup", str(args.warmup), "--reps", str(args.reps),
             "--matmul-n", str(args.matmul_n), "--loop", str(args.loop)]
    for _ in range(args.rounds):
        for path in args.paths:
            env = dict(os.environ, RECOPS_ISA=path, TF_CPP_MIN_LOG_LEVEL="3")
            out = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
            said = [x for x in out.stderr.splitlines() if "RECOPS_ISA=" in x]
            print(_table(path, json.loads(out.stdout.strip().splitlines()[-1])))
            if said:
                print(f"[{path}] {said[0]}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

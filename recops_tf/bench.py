"""Benchmark: every op stem, fused kernel vs its pure-TF composite reference.

For each benchmark shape of the ops table it times the forward and, where the op has a
gradient, forward+backward (a vector-Jacobian product with a fixed upstream gradient), both
wrapped in ``tf.function``, with warm-up and repetitions, and reports the median. Each row shows
the fused op's rate (GB/s for memory-bound stems, GFLOP/s for compute-bound ones) and its
fraction of a machine ceiling measured in the same run: a large array copy (numpy copyto,
counting read + write; one thread, as in the build notes, and also one thread per core, since
the kernels use every core) for memory-bound ops, a large ``tf.linalg.matmul`` for compute-bound
ones.

Run it as ``python tools/bench.py`` or ``recops-tf bench``; ``--size tiny`` is the quick run the
test suite uses so the benchmark cannot rot.
"""
import argparse
import concurrent.futures
import json
import os
import platform
import sys

import numpy as np
import tensorflow as tf

from recops_tf import _ops_table
from recops_tf._timing import median_seconds
from recops_tf.testing import cases

CEILING_SIZES = {"tiny": {"copy_mb": 8, "matmul_n": 256},
                 "full": {"copy_mb": 256, "matmul_n": 2048}}
TINY_NOTE = ("size tiny: toy shapes that only check the benchmark runs. Their times, rates and "
             "% of ceiling measure per-call overhead, not the kernels or the machine; use "
             "--size full (the default) for real figures.")


def copy_ceilings_gbps(megabytes, warmup=2, reps=5):
    """Large array copy (numpy copyto), GB/s counting the bytes read plus the bytes written:
    (one thread, one thread per core each copying its slice; copyto releases the GIL)."""
    n = megabytes * 1024 * 1024 // 8
    src = np.random.default_rng(0).random(n)
    dst = np.empty_like(src)
    threads = os.cpu_count() or 1
    bounds = [n * i // threads for i in range(threads + 1)]
    pool = concurrent.futures.ThreadPoolExecutor(threads)

    def threaded():
        list(pool.map(lambda i: np.copyto(dst[bounds[i]:bounds[i + 1]],
                                          src[bounds[i]:bounds[i + 1]]), range(threads)))

    try:
        single = median_seconds(lambda: np.copyto(dst, src), warmup, reps)
        multi = median_seconds(threaded, warmup, reps)
    finally:
        pool.shutdown()
    return 2 * src.nbytes / single / 1e9, 2 * src.nbytes / multi / 1e9


def matmul_ceiling_gflops(n, warmup=2, reps=5, dtype=tf.float32):
    """Large tf.linalg.matmul of ``dtype`` (TensorFlow's oneDNN: AMX or AVX512-BF16 for
    bfloat16 where the CPU has them), GFLOP/s."""
    a = tf.cast(tf.random.stateless_uniform([n, n], seed=[1, 2]), dtype)
    b = tf.cast(tf.random.stateless_uniform([n, n], seed=[3, 4]), dtype)
    mm = tf.function(tf.linalg.matmul)
    t = median_seconds(lambda: mm(a, b).numpy(), warmup, reps)
    return 2 * n ** 3 / t / 1e9


def vjp(fn, diff, upstream):
    """A tf.function returning fn's outputs and the dense gradients of args[diff] for a fixed
    upstream: the forward+backward step the benchmark times (and the concurrency test runs)."""
    @tf.function
    def forward_backward(*args):
        args = list(args)
        watched = [args[i] for i in diff]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            out = tf.nest.flatten(fn(*args))
        grads = tape.gradient(out, watched, output_gradients=upstream)
        # Dense gradients (a gather's gradient is IndexedSlices until densified), and the
        # forward outputs returned too, so graph pruning cannot drop the forward.
        return out, [tf.convert_to_tensor(g) for g in grads]

    return forward_backward


def _run(fn, args):
    # A tf.function call on the CPU returns when its outputs are computed.
    return fn(*args)


def _looped(fn, steps):
    """One tf.function running the step `fn` `steps` times in a graph loop: a step's time
    without the cost of a tf.function call (0.25-0.5 ms here), which dominates short steps."""
    @tf.function
    def loop(*args):
        kept = tf.constant(0.0)
        for _ in tf.range(steps):
            # The loop carries one element of each output, so that a step returning values (a
            # lookup) is computed whole every iteration rather than pruned.
            for out in [o for o in tf.nest.flatten(fn(*args)) if o is not None]:
                kept += tf.reduce_sum(tf.cast(tf.reshape(out, [-1])[:1], tf.float32))
        return kept

    return loop


def bench_case(row, case, warmup, reps, ceilings, loop=0, dtype=tf.float32):
    """Rows (dicts) for one case: forward, and forward+backward when differentiable; a
    stateful stem's case is one step (a table lookup or update, an optimizer step), timed per
    call, or per step in a graph loop of `loop` steps when `loop` > 0."""
    results = []
    if row.stateful and loop > 0:
        modes = [(f"step (loop of {loop})", _looped(case.fused, loop),
                  _looped(case.benchmark_baseline, loop), case.bytes_forward, case.flops_forward)]
        per_call = loop
    else:
        modes = [("step" if row.stateful else "forward", tf.function(case.fused),
                  tf.function(case.benchmark_baseline), case.bytes_forward, case.flops_forward)]
        per_call = 1
    if case.diff:
        upstream = case.upstream()
        modes.append(("forward+backward", vjp(case.fused, case.diff, upstream),
                      vjp(case.benchmark_baseline, case.diff, upstream),
                      case.bytes_forward + case.bytes_backward,
                      case.flops_forward + case.flops_backward))
    for mode, fused, reference, nbytes, flops in modes:
        t_fused = median_seconds(lambda: _run(fused, case.args), warmup, reps) / per_call
        t_ref = median_seconds(lambda: _run(reference, case.args), warmup, reps) / per_call
        if (case.bound or row.bound) == "memory":
            rate, unit, ceiling = nbytes / t_fused / 1e9, "GB/s", ceilings["copy_GBps"]
            threaded = rate / ceilings["copy_threaded_GBps"]
        else:  # against the matmul of the case's dtype (bf16's where the kernels run bf16)
            key = "matmul_bf16_GFLOPs" if tf.as_dtype(dtype) == tf.bfloat16 else "matmul_GFLOPs"
            rate, unit, ceiling = flops / t_fused / 1e9, "GFLOP/s", ceilings[key]
            threaded = None
        results.append({
            "stem": row.stem, "case": case.label, "mode": mode,
            "fused_ms": t_fused * 1e3, "reference_ms": t_ref * 1e3,
            "speedup": t_ref / t_fused, "rate": rate, "unit": unit,
            "fraction_of_ceiling": rate / ceiling, "fraction_of_threaded_copy": threaded,
            "payload_MB": nbytes / 1e6,
        })
    return results


def run(stems=None, size="full", warmup=2, reps=10, json_path=None, progress=True,
        dtype="float32", loop=0):
    """Runs the benchmark and returns {"ceilings", "rows", "machine"}; writes JSON if asked.
    loop > 0 times the stateful stems' steps in graph loops of that many steps."""
    rows = [r for r in _ops_table.OPS if not stems or r.stem in stems]
    unknown = set(stems or ()) - {r.stem for r in _ops_table.OPS}
    if unknown:
        raise ValueError(f"unknown stems: {sorted(unknown)}")
    sizes = CEILING_SIZES[size]
    copy_1t, copy_nt = copy_ceilings_gbps(sizes["copy_mb"])
    ceilings = {"copy_GBps": copy_1t, "copy_threaded_GBps": copy_nt,
                "matmul_GFLOPs": matmul_ceiling_gflops(sizes["matmul_n"]),
                "matmul_bf16_GFLOPs": matmul_ceiling_gflops(sizes["matmul_n"],
                                                            dtype=tf.bfloat16)}
    work = [(row, shape) for row in rows for shape in row.bench[size]]
    bar = None
    if progress:
        import keras

        bar = keras.utils.Progbar(len(work), unit_name="case")
    results = []
    for i, (row, shape) in enumerate(work):
        case = cases.build(row.stem, shape, dtype=tf.as_dtype(dtype))
        results += bench_case(row, case, warmup, reps, ceilings, loop, dtype)
        if bar is not None:
            bar.update(i + 1)
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu": cpu_model(), "cpus": os.cpu_count(),
                    "tensorflow": tf.__version__,
                    "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()},
        "size": size, "dtype": dtype, "warmup": warmup, "reps": reps, "loop": loop,
        "ceilings": ceilings, "rows": results,
    }
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    return report


def cpu_model():
    """The CPU's model name (Linux: /proc/cpuinfo; elsewhere platform.processor()) and the
    instruction-set extensions the kernels choose between (avx2, avx512f, avx512_bf16,
    amx_bf16) that it has."""
    name, flags = platform.processor() or "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in flags]
    return f"{name} ({', '.join(isa)})" if isa else name


def format_table(report):
    c = report["ceilings"]
    lines = [TINY_NOTE] if report.get("size") == "tiny" else []
    lines += [f"ceilings: copy {c['copy_GBps']:.1f} GB/s one thread, "
              f"{c['copy_threaded_GBps']:.1f} GB/s all cores (read+write); "
              f"matmul {c['matmul_GFLOPs']:.0f} GFLOP/s float32, "
              f"{c.get('matmul_bf16_GFLOPs', float('nan')):.0f} GFLOP/s bfloat16",
              "% ceil: of the one-thread copy (memory-bound) or the matmul of the case's dtype "
              "(compute-bound); "
              "% all-core copy: of the all-core copy",
              f"{'stem':<22} {'case':<40} {'mode':<17} {'fused ms':>9} {'ref ms':>9} "
              f"{'speedup':>8} {'rate':>14} {'% ceil':>7} {'% all-core copy':>16}"]
    for r in report["rows"]:
        threaded = r["fraction_of_threaded_copy"]
        threaded = f"{100 * threaded:>15.1f}%" if threaded is not None else f"{'-':>16}"
        lines.append(f"{r['stem']:<22} {r['case']:<40} {r['mode']:<17} {r['fused_ms']:>9.3f} "
                     f"{r['reference_ms']:>9.3f} {r['speedup']:>7.2f}x "
                     f"{r['rate']:>8.2f} {r['unit']:<5} {100 * r['fraction_of_ceiling']:>6.1f}% "
                     f"{threaded}")
    return "\n".join(lines)


def markdown_table(report):
    """The report as a markdown table (one row per stem, case and mode)."""
    c = report["ceilings"]
    lines = [f"Measured ceilings: copy {c['copy_GBps']:.1f} GB/s one thread, "
             f"{c['copy_threaded_GBps']:.1f} GB/s all cores; matmul "
             f"{c['matmul_GFLOPs']:.0f} GFLOP/s float32, "
             f"{c.get('matmul_bf16_GFLOPs', float('nan')):.0f} GFLOP/s bfloat16. "
             + (f"CPU: {report['machine']['cpu']}, {report['machine']['cpus']} cores. "
                if report["machine"].get("cpu") else "")
             + f"TensorFlow {report['machine']['tensorflow']}, "
             f"size {report['size']}, median of {report['reps']}"
             + (f", stateful steps in graph loops of {report['loop']}" if report.get("loop")
                else "") + ".",
             "",
             *([TINY_NOTE, ""] if report.get("size") == "tiny" else []),
             "| stem | case | mode | fused ms | reference ms | speedup | rate | % of ceiling |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['stem']} | {r['case']} | {r['mode']} | {r['fused_ms']:.3f} | "
                     f"{r['reference_ms']:.3f} | {r['speedup']:.2f}x | "
                     f"{r['rate']:.2f} {r['unit']} | {100 * r['fraction_of_ceiling']:.0f}% |")
    return "\n".join(lines) + "\n"


def speedup_chart(report, path):
    """A horizontal bar chart of the speedups (log scale) as a PNG; needs matplotlib (the
    ``chart`` extra). Returns False when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    modes = {"forward": "fwd", "forward+backward": "fwd+bwd"}
    labels = [f"{r['stem']} {r['case'][:30]} ({modes.get(r['mode'], 'step')})" for r in rows]
    values = [r["speedup"] for r in rows]
    fig, ax = plt.subplots(figsize=(12, 0.28 * len(rows) + 1.2))
    ax.barh(range(len(rows)), values, color=["#2a7" if v >= 1 else "#c44" for v in values])
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup over the stock-TF composite (log scale)")
    ax.set_title("recops_tf fused ops vs stock TensorFlow")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


README_START, README_END = "<!-- bench table: start -->", "<!-- bench table: end -->"


def update_readme(report, path):
    """Replaces the README's generated benchmark section (between the markers) with the
    report's table."""
    with open(path) as f:
        text = f.read()
    if README_START not in text or README_END not in text:
        raise ValueError(f"{path} has no {README_START} ... {README_END} section")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    with open(path, "w") as f:
        f.write(head + README_START + "\n" + markdown_table(report) + README_END + tail)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="recops-tf bench", description=__doc__.split("\n")[0])
    parser.add_argument("stems", nargs="*", help="stems to run (default: all)")
    parser.add_argument("--size", choices=sorted(CEILING_SIZES), default="full")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dtype", default="float32",
                        choices=("float32", "bfloat16", "float16", "float64"),
                        help="the cases' value dtype (compute-bound rows are measured against "
                        "the matmul ceiling of float32, or of bfloat16 for bfloat16)")
    parser.add_argument("--json", dest="json_path", help="write the results as JSON here")
    parser.add_argument("--loop", type=int, default=0, metavar="STEPS",
                        help="time the stateful stems' steps (table lookups and updates, "
                             "optimizer steps) per step in graph loops of STEPS steps, "
                             "without the tf.function call cost (default: per call)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--ops", nargs="+", default=[], metavar="STEM",
                        help="stems to run (as the positional list)")
    parser.add_argument("--out", help="write the report as a markdown table here")
    parser.add_argument("--chart", help="write a PNG bar chart of the speedups here "
                                        "(needs matplotlib: pip install 'recops_tf[chart]')")
    parser.add_argument("--update-readme", metavar="README",
                        help="replace the generated benchmark table of this README")
    args = parser.parse_args(argv)
    if args.loop < 0:
        parser.error("--loop must be >= 0")
    if args.chart:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--chart needs matplotlib: pip install 'recops_tf[chart]'")
    stems = list(args.stems) + list(args.ops)
    report = run(stems or None, args.size, args.warmup, args.reps, args.json_path,
                 progress=not args.no_progress, dtype=args.dtype, loop=args.loop)
    print(format_table(report))
    if args.out:
        with open(args.out, "w") as f:
            f.write(markdown_table(report))
        print(f"wrote {args.out}")
    if args.chart:
        speedup_chart(report, args.chart)
        print(f"wrote {args.chart}")
    if args.update_readme:
        update_readme(report, args.update_readme)
        print(f"updated {args.update_readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

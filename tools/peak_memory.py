#!/usr/bin/env python3
"""Peak memory of one forward+backward step, fused vs reference, each in a fresh process.

    python tools/peak_memory.py hstu_dense            # the stem's largest "full" shape
    python tools/peak_memory.py hstu_dense --shape 0  # another shape of the ops table

Reports the process's peak resident set size (ru_maxrss) after the inputs are built and
after one forward+backward call, and the difference: the memory the op itself needed.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, sys
import tensorflow as tf
import recops_tf
from recops_tf import _ops_table
from recops_tf.testing import cases
from recops_tf.testing.inputs import upstream_like
stem, index, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
case = cases.build(stem, _ops_table.BY_STEM[stem].bench["full"][index])
fn = case.fused if which == "fused" else case.reference
up = case.upstream() if which == "fused" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with tf.GradientTape() as tape:
    watched = [case.args[i] for i in case.diff]
    tape.watch(watched)
    out = tf.nest.flatten(fn(*case.args))
    up = up or upstream_like(out, out[0].dtype)
grads = tape.gradient(out, watched, output_gradients=up)
[tf.convert_to_tensor(g).numpy() for g in grads]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"case": case.label, "inputs_peak_MB": before / 1024, "peak_MB": after / 1024}))
"""


def measure(stem, index, which):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", CHILD, stem, str(index), which], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    from recops_tf import _ops_table

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stem")
    parser.add_argument("--shape", type=int, default=-1, help="index into the full shapes")
    args = parser.parse_args(argv)
    shapes = _ops_table.BY_STEM[args.stem].bench["full"]
    index = args.shape % len(shapes)
    for which in ("fused", "reference"):
        r = measure(args.stem, index, which)
        print(f"{args.stem} {r['case']} {which:<9}: peak RSS {r['peak_MB']:.0f} MB "
              f"(inputs built: {r['inputs_peak_MB']:.0f} MB; step added "
              f"{r['peak_MB'] - r['inputs_peak_MB']:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

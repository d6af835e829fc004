#!/usr/bin/env bash
# Smoke test of a built wheel (tools/build_wheel.sh) as a user gets it: a fresh venv, no
# compiler reachable, only tensorflow-cpu and the wheel installed.
#
#   bash tools/wheel_smoke.sh dist/recops_tf-*.whl
#
# - The venv (python3 -m venv, PYTHON to choose another interpreter) runs with PATH holding only
#   its own bin directory and a directory of links to the tools used here (no gcc, g++, cc, c++
#   or clang), CC, CXX and the compiler flags unset; the script checks that no compiler is
#   reachable and fails otherwise. So any step that would compile fails.
# - It installs tensorflow-cpu==2.21.0, then the wheel, and times each install.
# - Then: import recops_tf (from the venv, not this checkout), one op (ln_mul) and its gradient
#   in a tf.function, compared with a stock-TensorFlow composite; the version (the wheel's,
#   recops_tf.__version__ and `recops-tf --version` agree); and `recops-tf train` for 20 steps
#   on a tiny synthetic CSV, its outputs checked.
# Exits non-zero on any failure. Environment: PYTHON (default python3), KEEP=1 keeps the
# temporary directory (otherwise removed in the background at exit).
set -euo pipefail
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
  echo "usage: bash tools/wheel_smoke.sh WHEEL" >&2
  exit 2
fi
WHEEL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
NAME=$(basename "$WHEEL")
TENSORFLOW=tensorflow-cpu==2.21.0
# The interpreter itself, not a launcher on PATH (such as a pyenv shim) that needs other tools.
PY=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
BEGIN=$EPOCHREALTIME
seconds() {  # wall seconds since $1 (an $EPOCHREALTIME)
  "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
    "$1" "$EPOCHREALTIME"
}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/recops-wheel-smoke.XXXXXX")
if [ "${KEEP:-0}" != 1 ]; then
  # Removed in the background: deleting the venv's 1.6 GB (26,000 files) took a minute on the
  # CI machine's disk (mounted with discard), which the next CI leg need not wait for.
  trap 'rm -rf "$WORK" </dev/null >/dev/null 2>&1 &' EXIT
fi
VENV=$WORK/venv
TOOLS=$WORK/tools  # the only other directory on PATH
mkdir -p "$TOOLS"
ln -s "$PY" "$TOOLS/python3"
for tool in rm cat; do
  ln -s "$(command -v "$tool")" "$TOOLS/$tool"
done
"$PY" -m venv "$VENV"
echo "== wheel smoke: $NAME in a fresh venv ($WORK)"

# From here on: no compiler. Everything else the script runs is a bash builtin, in the venv or
# in $TOOLS.
export PATH=$VENV/bin:$TOOLS
unset CC CXX CPP LD CFLAGS CXXFLAGS CPPFLAGS LDFLAGS VIRTUAL_ENV PYTHONPATH PYTHONHOME
hash -r
found=""
for compiler in g++ gcc cc c++ clang clang++ x86_64-linux-gnu-gcc x86_64-linux-gnu-g++; do
  if command -v "$compiler" >/dev/null 2>&1; then
    found="$found $compiler=$(command -v "$compiler")"
  fi
done
if [ -n "$found" ]; then
  echo "wheel_smoke: FAILED: a compiler is reachable:$found (PATH=$PATH)" >&2
  exit 1
fi
echo "no compiler on PATH ($PATH); CC and CXX unset"
export TF_CPP_MIN_LOG_LEVEL=2 PIP_DISABLE_PIP_VERSION_CHECK=1
cd "$WORK"  # not the checkout: `import recops_tf` must find the installed package

t0=$EPOCHREALTIME
python3 -m pip install --quiet "$TENSORFLOW"
tf_seconds=$(seconds "$t0")
echo "installed $TENSORFLOW in $tf_seconds s"
t0=$EPOCHREALTIME
python3 -m pip install --quiet "$WHEEL"
wheel_seconds=$(seconds "$t0")
echo "installed $NAME in $wheel_seconds s (TensorFlow already installed)"
python3 -m pip check

echo "== wheel smoke: import, one op and its gradient ($(seconds "$BEGIN") s so far)"
cat >smoke.py <<'EOF'
import os
import sys
import time

import numpy as np

began = time.monotonic()
import tensorflow as tf  # noqa: E402

import importlib.metadata  # noqa: E402

import recops_tf  # noqa: E402
from recops_tf import _loader  # noqa: E402

# The installed package and library, not a checkout's.
for path in (recops_tf.__file__, _loader.library_path()):
    assert os.path.realpath(path).startswith(os.path.realpath(sys.prefix)), path
print(f"import recops_tf {recops_tf.__version__} (TensorFlow {tf.__version__}) in "
      f"{time.monotonic() - began:.1f} s from {os.path.dirname(recops_tf.__file__)}")
print(f"op library {_loader.library_path()}")
installed = importlib.metadata.version("recops_tf")
assert recops_tf.__version__ == installed, (recops_tf.__version__, installed)
assert os.environ["WHEEL_NAME"].startswith(f"recops_tf-{installed}-"), os.environ["WHEEL_NAME"]

rng = np.random.default_rng(0)
x, u, w = (tf.constant(rng.standard_normal((5, 24)), tf.float32) for _ in range(3))
gamma, beta = (tf.constant(rng.standard_normal(24), tf.float32) for _ in range(2))


def with_gradient(fn):
    @tf.function
    def run(x, u, gamma, beta):
        with tf.GradientTape() as tape:
            tape.watch([x, u, gamma, beta])
            y = fn(x, u, gamma, beta)
            loss = tf.reduce_sum(y * w)
        return y, tape.gradient(loss, [x, u, gamma, beta])
    return run


def composite(x, u, gamma, beta):  # LayerNorm (eps 1e-5), affine, times u, in stock TF
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return ((x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta) * u


fused = with_gradient(lambda *a: recops_tf.ln_mul(*a, epsilon=1e-5))
types = {op.type for op in fused.get_concrete_function(x, u, gamma, beta).graph.get_operations()}
assert {"Recops>LnMul", "Recops>LnMulGrad"} <= types, sorted(types)
got, want = fused(x, u, gamma, beta), with_gradient(composite)(x, u, gamma, beta)
names = ["y", "dy/dx", "dy/du", "dy/dgamma", "dy/dbeta"]
for name, a, b in zip(names, [got[0], *got[1]], [want[0], *want[1]]):
    err = float(tf.reduce_max(tf.abs(a - b)))
    scale = float(tf.reduce_max(tf.abs(b)))
    assert err <= 1e-4 * max(1.0, scale), f"ln_mul {name}: max error {err} (scale {scale})"
    print(f"ln_mul {name}: max |fused - composite| = {err:.2e} (values up to {scale:.2f})")

# A tiny synthetic interaction file for the train command.
from recops_tf.recommender.synthetic import synthetic  # noqa: E402

data = synthetic(num_users=80, num_items=50, seed=0)
with open("tiny.csv", "w") as f:
    f.write("user,item,timestamp\n")
    for user, (items, stamps) in enumerate(zip(data.items, data.timestamps)):
        f.writelines(f"{user},{i},{t}\n" for i, t in zip(items, stamps))
print(f"tiny.csv: {sum(map(len, data.items))} interactions of {data.num_users} users")
EOF
WHEEL_NAME=$NAME python3 -I smoke.py

echo "== wheel smoke: recops-tf --version ($(seconds "$BEGIN") s so far)"
version=$(python3 -I -c "import importlib.metadata as m; print(m.version('recops_tf'))")
shown=$(recops-tf --version) || {
  echo "wheel_smoke: FAILED: recops-tf --version exited $?" >&2
  exit 1
}
echo "recops-tf --version: $shown"
if [ "$shown" != "recops_tf $version" ]; then
  echo "wheel_smoke: FAILED: recops-tf --version printed '$shown', not 'recops_tf $version'" >&2
  exit 1
fi

echo "== wheel smoke: recops-tf train --max-steps 20 ($(seconds "$BEGIN") s so far)"
t0=$EPOCHREALTIME
recops-tf train --data tiny.csv --max-steps 20 --out run --no-progress >train.log 2>&1 || {
  status=$?
  cat train.log
  echo "wheel_smoke: FAILED: recops-tf train exited $status" >&2
  exit 1
}
for out in run/run.json run/model.keras run/items.txt run/info.json \
    run/saved_model/saved_model.pb; do
  if [ ! -s "$out" ]; then
    cat train.log
    echo "wheel_smoke: FAILED: recops-tf train wrote no $out" >&2
    exit 1
  fi
done
echo "recops-tf train: exit 0 in $(seconds "$t0") s; wrote $(cd run && echo *)"
echo "wheel smoke passed in $(seconds "$BEGIN") s: $TENSORFLOW installed in $tf_seconds s, the" \
  "wheel in $wheel_seconds s"

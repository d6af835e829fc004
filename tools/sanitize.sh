#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer leg: builds an instrumented op library from this
# checkout and runs the op tests, the fuzz suite and the concurrency stress against it.
#
#   bash tools/sanitize.sh            # RECOPS_SANITIZE (default address,undefined)
#
# The instrumented .so goes to build/sanitize/lib/recops_tf/_recops_ops.so, not into the package:
# it loads only with the sanitizer runtimes preloaded, so the normal in-place .so is left alone.
# The tests reach it through RECOPS_TF_LIBRARY (the loader's override), which the fuzz suite's child
# processes inherit together with LD_PRELOAD and the sanitizer options.
#
# Fails when the build or pytest fails (both sanitizers end the process at the first report) or
# when any sanitizer report was written. Where reports go: ASan's to build/sanitize/logs/san.<pid>
# (log_path; complete even for the fuzz suite's child processes, whose stderr the test keeps only
# the tail of); UBSan's to stderr: with GCC's two runtimes loaded, libubsan's log_path call lands
# in libasan (interposed), so only UBSan's SUMMARY line reaches the log files. pytest runs with
# --capture=sys so native stderr is not swallowed when a report ends the process; everything is in
# build/sanitize/pytest.log. Reports naming our code (frames in _recops_ops.so, namespace recops,
# or this checkout's kernels/ or op_defs/, relative or absolute) are marked.
# Environment: PYTHON (default python), RECOPS_SANITIZE, RECOPS_FUZZ_CASES (default 2000 here),
# RECOPS_FUZZ_SALT (default 1 here: other cases than the plain leg's);
# extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python}
export RECOPS_SANITIZE=${RECOPS_SANITIZE:-address,undefined}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
OUT=$ROOT/build/sanitize
LIB=$OUT/lib/recops_tf/_recops_ops.so
LOGS=$OUT/logs

echo "== sanitize: build (-fsanitize=$RECOPS_SANITIZE)"
start=$SECONDS
"$PYTHON" setup.py -q build_ext --build-lib "$OUT/lib"
echo "built $LIB in $((SECONDS - start)) s"

# The Python interpreter is not instrumented: the runtimes must be preloaded (ASan insists on
# coming first in the library list).
preload=()
case ",$RECOPS_SANITIZE," in *,address,*) preload+=(libasan.so) ;; esac
case ",$RECOPS_SANITIZE," in *,undefined,*) preload+=(libubsan.so) ;; esac
paths=()
for name in "${preload[@]}"; do
  path=$(g++ -print-file-name="$name")
  if [ ! -e "$path" ]; then
    echo "sanitize: $name not found (g++ -print-file-name=$name gave '$path')" >&2
    exit 2
  fi
  paths+=("$path")
done

rm -rf "$LOGS"
mkdir -p "$LOGS"
# ASan:  detect_leaks=0               CPython and TensorFlow keep allocations until exit;
#        allocator_may_return_null=1  huge sizes (fuzzed shapes/attributes) fail like plain malloc,
#                                     so TensorFlow raises ResourceExhausted instead of ASan dying;
#        detect_odr_violation=0       TF's and our copies of header-only globals are not ODR bugs;
#        halt (the default)           the first error ends the process (test fails).
# UBSan: halt_on_error=1 (only our code is instrumented, so any report is ours; without halting a
#        report in a fuzz child would vanish with its captured stderr), print_stacktrace=1.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:detect_odr_violation=0:\
print_summary=1:log_path=$LOGS/san${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:print_summary=1:\
log_path=$LOGS/san${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export RECOPS_TF_LIBRARY=$LIB
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}  # this checkout's package, whatever is installed
export RECOPS_FUZZ_CASES=${RECOPS_FUZZ_CASES:-2000}
# Other cases than the plain pytest leg's (tests/test_fuzz.py: each stem's seed xor the salt).
export RECOPS_FUZZ_SALT=${RECOPS_FUZZ_SALT:-1}

tests=(tests/ops tests/compat tests/test_fuzz.py tests/test_concurrency.py)
echo "== sanitize: pytest ${tests[*]} (RECOPS_FUZZ_CASES=$RECOPS_FUZZ_CASES)"
start=$SECONDS
set +e
# -vv (-v against the configured -q): the test a halting report ended is the last one named.
LD_PRELOAD="$(IFS=:; echo "${paths[*]}")${LD_PRELOAD:+:$LD_PRELOAD}" \
  "$PYTHON" -m pytest -p no:xdist -vv --capture=sys "${tests[@]}" "$@" 2>&1 |
  tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
set -e
echo "pytest ran in $((SECONDS - start)) s, exit status $status"

ours_re="_recops_ops\.so|recops::|( |$ROOT/)(kernels|op_defs)/"
found=0
ours=0
for report in $(find "$LOGS" -type f | sort); do
  found=$((found + 1))
  if grep -qE "$ours_re" "$report"; then
    echo "== sanitizer report naming our code: $report"
    ours=$((ours + 1))
  else
    echo "== sanitizer report without a frame of ours: $report"
  fi
  cat "$report"
done
# UBSan reports (and any ASan report that missed log_path) are in the pytest log.
report_re="[^ ]+:[0-9]+:[0-9]+: runtime error: |ERROR: (AddressSanitizer|LeakSanitizer)"
if grep -qE "$report_re" "$OUT/pytest.log"; then
  found=$((found + 1))
  echo "== sanitizer report(s) in $OUT/pytest.log:"
  grep -E -A60 "$report_re" "$OUT/pytest.log" | grep -E "$report_re|^ +#[0-9]+ |^SUMMARY" |
    head -60
  if grep -E -A60 "$report_re" "$OUT/pytest.log" | grep -qE "$ours_re"; then
    ours=$((ours + 1))
  fi
fi
if [ "$found" -ne 0 ]; then
  echo "sanitize: FAILED: sanitizer reports in $found place(s), $ours naming our code"
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "sanitize: FAILED: pytest exit status $status"
  exit "$status"
fi
echo "sanitize: passed with no sanitizer reports"

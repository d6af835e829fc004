# The compiler flags of the op library: the one list, read by both builds.
#   BUILD:    load("//:build_flags.bzl", "RECOPS_COPTS")  (cc_binary copts)
#   setup.py: reads RECOPS_COPTS from this file (ast.literal_eval of the list below, so keep
#             it a plain list of string literals), and adds only what Bazel supplies itself:
#             -fPIC, the repository root as include directory, TF's flags from tf.sysconfig.
# tests/test_layout.py checks that both builds use this list.
RECOPS_COPTS = [
    "-O3",
    "-g0",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    # GCC notes that 64-byte vector values change the ABI; in the kernels they only pass
    # between always_inline functions.
    "-Wno-psabi",
    "-fvisibility-inlines-hidden",
    # No kernel reads errno: sqrt and friends may vectorise (the fused LazyAdam step is 2-3x
    # faster for it).
    "-fno-math-errno",
]

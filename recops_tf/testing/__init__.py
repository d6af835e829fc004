"""Assertion helpers shared by every op's tests: the central tolerance table, the
fused-vs-reference comparison (a float64 oracle on the same rounded inputs), the gradient
checks and the eager / ``tf.function`` modes a test runs in.

Tolerances live here and nowhere else: a test passes a dtype (and, for reductions, the input
magnitude and reduction length) and gets its bounds from ``tolerance``.

The rest of the package, one job each:

- ``inputs``: random inputs rounded to a dtype (values, upstream gradients, Zipf row ids);
- ``layers``: what the Keras layer tests share (a timed ragged batch, a target, a short fit);
- ``cases``: the case builders, one module per stem of the ops table (``cases/<stem>.py``),
  used by the tests, the benchmark and the tools;
- ``drivers``: programs that run the library or generate from it: the smoke run, the fuzzer,
  the multi-worker launcher and the generated docs and golden files.
"""
import math

import numpy as np
import tensorflow as tf

from recops_tf.testing.inputs import upstream_like

# (rtol, atol) for one rounding of a unit-magnitude value.
TOLERANCES = {
    tf.float64: (1e-9, 1e-9),
    tf.float32: (1e-5, 1e-5),
    tf.bfloat16: (1.6e-2, 1.6e-2),
    tf.float16: (2e-3, 2e-3),
}

FLOAT_DTYPES = (tf.float64, tf.float32, tf.bfloat16, tf.float16)


def tolerance(dtype, magnitude=1.0, reduction=1):
    """(rtol, atol) for results of `dtype` with inputs of size ~`magnitude` summed over
    `reduction` terms (error grows like sqrt(reduction) for random rounding)."""
    dtype = tf.as_dtype(dtype)
    if dtype.is_integer or dtype == tf.bool:
        return 0.0, 0.0
    rtol, atol = TOLERANCES[dtype]
    scale = max(1.0, math.sqrt(reduction))
    return rtol * scale, atol * magnitude * scale


def to_float64(x):
    """Upcasts floating tensors to float64 (exact); other values pass through."""
    if isinstance(x, tf.RaggedTensor):
        return x.with_values(to_float64(x.values))
    if tf.is_tensor(x) and x.dtype.is_floating:
        return tf.cast(x, tf.float64)
    return x


def _as_numpy(x):
    if isinstance(x, tf.RaggedTensor):
        x = x.flat_values
    x = tf.convert_to_tensor(x)
    if x.dtype.is_floating:
        x = tf.cast(x, tf.float64)
    return x.numpy()


def assert_close(actual, expected, dtype, magnitude=1.0, reduction=1, what="result"):
    """Asserts two (nested) results agree within the tolerance of `dtype`."""
    actual_flat = tf.nest.flatten(actual, expand_composites=False)
    expected_flat = tf.nest.flatten(expected, expand_composites=False)
    assert len(actual_flat) == len(expected_flat), (
        f"{what}: {len(actual_flat)} outputs vs {len(expected_flat)} expected")
    rtol, atol = tolerance(dtype, magnitude, reduction)
    for i, (a, e) in enumerate(zip(actual_flat, expected_flat)):
        if isinstance(a, tf.RaggedTensor) or isinstance(e, tf.RaggedTensor):
            np.testing.assert_array_equal(_as_numpy(a.row_splits), _as_numpy(e.row_splits),
                                          err_msg=f"{what}[{i}] row_splits")
        a_np, e_np = _as_numpy(a), _as_numpy(e)
        assert a_np.shape == e_np.shape, f"{what}[{i}]: shape {a_np.shape} vs {e_np.shape}"
        if rtol == 0 and atol == 0:
            np.testing.assert_array_equal(a_np, e_np, err_msg=f"{what}[{i}]")
        else:
            np.testing.assert_allclose(a_np, e_np, rtol=rtol, atol=atol,
                                       err_msg=f"{what}[{i}] ({tf.as_dtype(dtype).name})")


def oracle(reference_fn, *args, **kwargs):
    """The reference evaluated in float64 on the same (already rounded) inputs."""
    return reference_fn(*[to_float64(a) for a in args], **kwargs)


def assert_matches_reference(fused_fn, reference_fn, args, dtype, kwargs=None, magnitude=1.0,
                             reduction=1):
    """Runs fused_fn(*args) and checks it against the float64 oracle of reference_fn."""
    kwargs = kwargs or {}
    fused = fused_fn(*args, **kwargs)
    expected = oracle(reference_fn, *args, **kwargs)
    assert_close(fused, expected, dtype, magnitude, reduction, what="forward")
    return fused


def _weighted_sum(outputs, upstream):
    total = tf.constant(0.0, tf.float64)
    for out, u in zip(tf.nest.flatten(outputs), upstream):
        if isinstance(out, tf.RaggedTensor):
            out = out.flat_values
        total += tf.reduce_sum(tf.cast(out, tf.float64) * tf.cast(u, tf.float64))
    return total


def tape_gradients(fn, args, diff, upstream, kwargs=None):
    """Gradients of sum(fn(*args) * upstream) w.r.t. args[i] for i in diff."""
    kwargs = kwargs or {}
    watched = [args[i] for i in diff]
    with tf.GradientTape() as tape:
        for w in watched:
            tape.watch(w)
        out = fn(*args, **kwargs)
        loss = _weighted_sum(out, upstream)
    grads = tape.gradient(loss, watched)
    return [tf.zeros_like(w) if g is None else tf.convert_to_tensor(g)
            for g, w in zip(grads, watched)]


def assert_gradients_match_reference(fused_fn, reference_fn, args, diff, dtype, kwargs=None,
                                     magnitude=1.0, reduction=1, seed=1):
    """Tape-gradient parity: fused gradients in `dtype` vs the reference's in float64 on the
    same rounded inputs and upstream gradients."""
    kwargs = kwargs or {}
    out = fused_fn(*args, **kwargs)
    upstream = upstream_like(out, dtype, seed)
    fused = tape_gradients(fused_fn, list(args), diff, upstream, kwargs)
    args64 = [to_float64(a) for a in args]
    expected = tape_gradients(reference_fn, args64, diff, [to_float64(u) for u in upstream],
                              kwargs)
    for g in fused:
        assert g.dtype == tf.as_dtype(dtype), f"gradient dtype {g.dtype} != {dtype}"
    assert_close(fused, expected, dtype, magnitude, reduction, what="gradient")


def assert_numeric_gradient(fn, args, diff, kwargs=None, max_error=1e-7):
    """Theoretical vs numeric Jacobian of fn in float64 (small inputs only)."""
    kwargs = kwargs or {}
    args = [to_float64(a) for a in args]

    def partial(*xs):
        full = list(args)
        for i, x in zip(diff, xs):
            full[i] = x
        out = fn(*full, **kwargs)
        flat = [o.flat_values if isinstance(o, tf.RaggedTensor) else o
                for o in tf.nest.flatten(out)]
        return tf.concat([tf.reshape(o, [-1]) for o in flat], axis=0)

    theoretical, numerical = tf.test.compute_gradient(partial, [args[i] for i in diff])
    for t, n in zip(theoretical, numerical):
        err = float(np.max(np.abs(t - n))) if t.size else 0.0
        assert err <= max_error, f"numeric gradient error {err} > {max_error}"


def assert_second_order_raises(fn, args, wrt=0):
    """The gradient of fn's gradient w.r.t. args[wrt] raises NotImplementedError (the
    backward ops are not themselves differentiable)."""
    import pytest  # local: only tests call this

    x = args[wrt]
    with pytest.raises(NotImplementedError, match="second-order"):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32))
                                 for o in tf.nest.flatten(fn(*args))])
            g = inner.gradient(loss, x)
        outer.gradient(g, x)


def outputs_at_thread_counts(script, counts=(1, 2)):
    """The standard output of `script` (Python source) run in a fresh process per intra-op
    thread count in `counts`, for tests that a kernel's sums have one order whatever the thread
    count (the script writes its outputs' bytes). A prologue imports `sys` and `tensorflow as
    tf` and sets the count before anything runs."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    prologue = ("import sys\nimport tensorflow as tf\n"
                "tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))\n")
    return [subprocess.run([sys.executable, "-c", prologue + script, str(threads)], env=env,
                           capture_output=True, text=True, timeout=120, check=True).stdout
            for threads in counts]


MODES = ("eager", "function")


def in_mode(fn, mode, args):
    """`fn` as called eagerly, or inside a tf.function whose input signature has every
    dimension unknown (so shape functions and kernels see unknown dims)."""
    if mode == "eager":
        return fn
    if mode != "function":
        raise ValueError(mode)
    signature = [tf.TensorSpec([None] * len(a.shape), a.dtype) for a in args]
    return tf.function(fn, input_signature=signature)

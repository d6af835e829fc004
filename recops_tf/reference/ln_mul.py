"""Composite reference of stem ln_mul in stock TF (also the benchmark baseline)."""
import tensorflow as tf


def layer_norm(x, gamma, beta, epsilon):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + tf.cast(epsilon, x.dtype)) * gamma + beta


def checked(x, u, gamma, beta, epsilon, fn="ln_mul"):
    """(x, u, gamma, beta) with the fused kernels' checks (``u`` like ``x``, ``gamma`` and
    ``beta`` ``[C]``, a non-empty last axis, ``epsilon > 0``) as InvalidArgumentError, so that
    ``kernel="reference"`` refuses what ``"fused"`` refuses instead of broadcasting."""
    if not float(epsilon) > 0.0:
        raise tf.errors.InvalidArgumentError(None, None,
                                             f"{fn}: epsilon must be > 0, got {epsilon}")
    shape = tf.shape(x)
    cols = shape[-1:]
    checks = [
        tf.debugging.assert_equal(tf.shape(u), shape, message=f"{fn}: u must have x's shape"),
        tf.debugging.assert_equal(tf.shape(gamma), cols,
                                  message=f"{fn}: the scale (gamma / weight) must be [C]"),
        tf.debugging.assert_equal(tf.shape(beta), cols,
                                  message=f"{fn}: the shift (beta / bias) must be [C]"),
        tf.debugging.assert_positive(cols, message=f"{fn}: the last axis of x must not be empty")]
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in (x, u, gamma, beta)]


def ln_mul(x, u, gamma, beta, epsilon=1e-5):
    if isinstance(x, tf.RaggedTensor):
        return x.with_flat_values(ln_mul(x.flat_values, u.flat_values, gamma, beta, epsilon))
    return layer_norm(x, gamma, beta, epsilon) * u

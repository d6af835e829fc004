"""Composite reference of stem fused_linear_cross_entropy in stock TF (the benchmark baseline):
the ``[P, N]`` logits built, soft-maxed and differentiated by TensorFlow."""
import tensorflow as tf


def checked(states, items, targets, bias, positions, extra_items, values, weights,
            fn="fused_linear_cross_entropy"):
    """The inputs with the fused kernel's run-time checks (index ranges, lengths) as
    InvalidArgumentError, so that ``kernel="reference"`` refuses what ``"fused"`` refuses."""
    n = tf.shape(items, out_type=tf.int64)[0]
    p = tf.shape(states, out_type=tf.int64)[0]
    k = tf.shape(positions, out_type=tf.int64)[0]
    t64 = tf.cast(targets, tf.int64)
    checks = [
        tf.debugging.assert_equal(tf.shape(states)[1], tf.shape(items)[1],
                                  message=f"{fn}: items [N, d] must have the states' d columns"),
        tf.debugging.assert_positive(n, message=f"{fn}: items must have at least one row"),
        tf.debugging.assert_equal(tf.shape(targets, out_type=tf.int64)[0], p,
                                  message=f"{fn}: targets must have one entry per position"),
        tf.debugging.assert_non_negative(t64, message=f"{fn}: targets out of range"),
        tf.debugging.assert_less(t64, n, message=f"{fn}: targets out of range"),
        tf.debugging.assert_equal(tf.shape(extra_items, out_type=tf.int64)[0], k,
                                  message=f"{fn}: extra_positions, extra_items and extra_values "
                                  "must have the same length"),
        tf.debugging.assert_equal(tf.shape(values, out_type=tf.int64)[0], k,
                                  message=f"{fn}: extra_positions, extra_items and extra_values "
                                  "must have the same length"),
        tf.debugging.assert_non_negative(tf.cast(positions, tf.int64),
                                         message=f"{fn}: extra_positions out of range"),
        tf.debugging.assert_less(tf.cast(positions, tf.int64), p,
                                 message=f"{fn}: extra_positions out of range"),
        tf.debugging.assert_non_negative(tf.cast(extra_items, tf.int64),
                                         message=f"{fn}: extra_items out of range"),
        tf.debugging.assert_less(tf.cast(extra_items, tf.int64), n,
                                 message=f"{fn}: extra_items out of range"),
    ]
    if bias is not None:
        checks.append(tf.debugging.assert_equal(tf.shape(bias, out_type=tf.int64)[0], n,
                                                message=f"{fn}: bias must be [N]"))
    if weights is not None:
        checks.append(tf.debugging.assert_equal(tf.shape(weights, out_type=tf.int64)[0], p,
                                                message=f"{fn}: weights must be [P]"))
    with tf.control_dependencies(checks):
        return [None if t is None else tf.identity(t)
                for t in (states, items, targets, bias, positions, extra_items, values, weights)]


def fused_linear_cross_entropy(states, items, targets, bias=None, positions=None,
                               extra_items=None, values=None, weights=None, temperature=1.0,
                               label_smoothing=0.0):
    """``(loss [P], lse [P])`` from dense inputs (the public function's argument handling is
    done by its caller): the whole ``[P, N]`` logits in the accumulation dtype (float32 for
    float32 and bfloat16 inputs, float64 for float64)."""
    acc = tf.float64 if states.dtype == tf.float64 else tf.float32
    s, e = tf.cast(states, acc), tf.cast(items, acc)
    logits = tf.matmul(s, e, transpose_b=True) / tf.cast(temperature, acc)
    if bias is not None:
        logits += tf.cast(bias, acc)[None, :]
    if positions is not None:
        idx = tf.stack([tf.cast(positions, tf.int64), tf.cast(extra_items, tf.int64)], 1)
        logits = tf.tensor_scatter_nd_add(logits, idx, tf.cast(values, acc))
    lse = tf.reduce_logsumexp(logits, axis=1)
    target = tf.gather(logits, tf.cast(targets, tf.int64), batch_dims=1)
    ce = lse - target
    if label_smoothing:
        ce = (1.0 - label_smoothing) * ce + label_smoothing * (lse - tf.reduce_mean(logits, 1))
    if weights is None:
        return ce, lse
    w = tf.stop_gradient(tf.cast(weights, acc))
    active = tf.not_equal(w, 0.0)
    return tf.where(active, w * ce, 0.0), tf.where(active, lse, 0.0)

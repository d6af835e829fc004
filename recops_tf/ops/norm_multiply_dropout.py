"""LayerNorm · u with inverted dropout (stem norm_multiply_dropout)."""
import tensorflow as tf

from recops_tf.ops._common import index_tensor, lib, value_tensors
from recops_tf.ops.ln_mul import flat_rows


def _stat_dtype(dtype):
    return tf.float64 if dtype == tf.float64 else tf.float32


def norm_multiply_dropout(x, u, weight, bias, epsilon=1e-5, dropout_rate=0.0, training=True,
                          seed=None, name=None):
    """``dropout((LayerNorm(x) * weight + bias) * u)``, fused (HSTU's output gating).

    Definition, per row of ``x [..., C]`` (the Rec SDK's, any C): ``mean``, biased ``var``,
    ``y0 = ((x - mean) / sqrt(var + epsilon) * weight + bias) * u``; with ``training`` and
    ``dropout_rate = p > 0``: ``y = y0 * keep / (1 - p)`` (inverted dropout), else ``y = y0``.

    The mask is stateless: ``keep`` of element ``e`` (row-major index) is a hash of
    ``(seed, e)``, kept with probability ``1 - p`` (to 2^-32). The same ``seed`` gives the same
    mask on any thread count; pass ``seed = (base_seed, step)`` to change it every step, as
    ``tf.random.stateless_*`` do. The backward recomputes the mask from the seed, so it is
    never stored. The row mean and variance (float32; float64 for float64 ``x``) are kept
    for the backward and not returned.

    Args:
      x: ``[..., C]`` float32, bfloat16, float16 or float64, or a ``tf.RaggedTensor``.
      u: like ``x``.
      weight, bias: ``[C]``.
      epsilon: positive float.
      dropout_rate: in ``[0, 1)``.
      training: dropout only when true (a Python bool).
      seed: ``[2]`` int32/int64 tensor or pair; ``None`` draws a fresh random seed per call
        (a stateful op), so each call gets a new mask.
      name: optional op name.

    Returns:
      ``y`` with ``x``'s shape (ragged for ragged input).

    Gradient: w.r.t. ``x``, ``u``, ``weight`` and ``bias`` (``NormMultiplyDropoutBackward``,
    the same mask; ``dweight`` and ``dbias`` summed in a fixed order and returned in the
    input dtype). Second order: not implemented (raises).

    Raises:
      InvalidArgumentError: shapes (``u`` not like ``x``, ``weight`` / ``bias`` not ``[C]``,
        ``seed`` not of 2 values), an empty last axis, ``epsilon <= 0``, ``dropout_rate``
        outside ``[0, 1)``.
      TypeError: ``x`` not float32/float16/bfloat16/float64, or ``u`` / ``weight`` / ``bias`` of
        another dtype.

    Example:

    >>> y = norm_multiply_dropout([[1., 3.]], [[2., 2.]], [1., 1.], [0., 0.])
    >>> [round(v, 3) for v in y.numpy()[0].tolist()]
    [-2.0, 2.0]
    """
    with tf.name_scope(name or "norm_multiply_dropout"):
        x, u, rebuild = flat_rows(x, u, "norm_multiply_dropout")
        x, u, weight, bias = value_tensors("norm_multiply_dropout", x=x, u=u, weight=weight,
                                           bias=bias)
        rate = float(dropout_rate) if training else 0.0
        if seed is None:
            seed = (tf.random.uniform([2], minval=tf.int64.min, maxval=tf.int64.max,
                                      dtype=tf.int64) if rate > 0.0
                    else tf.zeros([2], tf.int64))
        seed = index_tensor(seed, "seed")
        y, _, _ = lib().recops_norm_multiply_dropout(
            x, u, weight, bias, seed, Tstat=_stat_dtype(x.dtype), epsilon=float(epsilon),
            dropout_rate=rate)
        return rebuild(y)


@tf.RegisterGradient("Recops>NormMultiplyDropout")
def _norm_multiply_dropout_grad(op, grad, grad_mean, grad_var):
    x, u, weight, bias, seed = op.inputs
    _, mean, var = op.outputs
    dx, du, dweight, dbias = lib().recops_norm_multiply_dropout_backward(
        grad, x, u, weight, bias, mean, var, seed, epsilon=op.get_attr("epsilon"),
        dropout_rate=op.get_attr("dropout_rate"))
    return [dx, du, dweight, dbias, None]


@tf.RegisterGradient("Recops>NormMultiplyDropoutBackward")
def _norm_multiply_dropout_backward_grad(op, *grads):
    raise NotImplementedError("second-order gradients of norm_multiply_dropout are not "
                              "implemented")

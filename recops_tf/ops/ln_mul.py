"""LayerNorm then multiply (stem ln_mul)."""
import tensorflow as tf

from recops_tf.ops._common import lib, value_tensors


def flat_rows(x, u, fn_name):
    """(x, u, rebuild): the dense values of x and u (ragged: their flat values, which must have
    the same row structure) and a function that gives a result x's structure back."""
    if isinstance(x, tf.RaggedTensor) or isinstance(u, tf.RaggedTensor):
        if not (isinstance(x, tf.RaggedTensor) and isinstance(u, tf.RaggedTensor)):
            raise TypeError(f"{fn_name}: x and u must both be ragged or both dense")
        return x.flat_values, u.flat_values, x.with_flat_values
    return x, u, lambda y: y


def ln_mul(x, u, gamma, beta, epsilon=1e-5, name=None):
    """LayerNorm over the last axis, affine, then an elementwise product with ``u``, fused.

    Definition, per row of ``x [..., C]``: ``mean = sum(x) / C``, ``var = sum((x - mean)^2) /
    C`` (biased), ``y = ((x - mean) / sqrt(var + epsilon) * gamma + beta) * u``. One pass over
    memory: each row is read once and ``y`` written once (statistics in float32 for
    float16 / bfloat16 inputs, float64 for float64).

    Args:
      x: ``[..., C]`` float32, bfloat16, float16 or float64, or a ``tf.RaggedTensor`` (the
        normalised axis is the last, uniform one).
      u: like ``x`` (ragged with the same row lengths when ``x`` is ragged).
      gamma, beta: ``[C]``.
      epsilon: positive float added to the variance.
      name: optional op name.

    Returns:
      ``y`` with ``x``'s shape (a ``tf.RaggedTensor`` for ragged input).

    Gradient: w.r.t. ``x``, ``u``, ``gamma`` and ``beta`` (``LnMulGrad``, statistics recomputed;
    ``dgamma`` and ``dbeta`` summed over rows in a fixed order: deterministic). The seed op
    has no backward. Second order: not implemented (raises).

    Raises:
      InvalidArgumentError: ``u`` not shaped like ``x``, ``gamma`` / ``beta`` not ``[C]``, an
        empty last axis, ``epsilon <= 0``.
      TypeError: ``x`` not float32/float16/bfloat16/float64, or ``u`` / ``gamma`` / ``beta`` of
        another dtype.

    Example:

    >>> y = ln_mul([[1., 3.]], [[2., 2.]], [1., 1.], [0., 0.])
    >>> [round(v, 3) for v in y.numpy()[0].tolist()]
    [-2.0, 2.0]
    """
    with tf.name_scope(name or "ln_mul"):
        x, u, rebuild = flat_rows(x, u, "ln_mul")
        x, u, gamma, beta = value_tensors("ln_mul", x=x, u=u, gamma=gamma, beta=beta)
        return rebuild(lib().recops_ln_mul(x, u, gamma, beta, epsilon=float(epsilon)))


@tf.RegisterGradient("Recops>LnMul")
def _ln_mul_grad(op, grad):
    return lib().recops_ln_mul_grad(grad, *op.inputs, epsilon=op.get_attr("epsilon"))


@tf.RegisterGradient("Recops>LnMulGrad")
def _ln_mul_grad_grad(op, *grads):
    raise NotImplementedError("second-order gradients of ln_mul are not implemented")

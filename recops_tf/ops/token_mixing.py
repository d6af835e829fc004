"""LayerNorm of x + xᵀ (stem token_mixing)."""
import tensorflow as tf

from recops_tf.ops._common import lib, value_tensors


def token_mixing(x, gamma, beta, epsilon=1e-7, name=None):
    """Token mixing of square ``[B, S, S]`` blocks: LayerNorm of ``x + xᵀ`` over the last axis.

    Definition: ``t[b, i, :] = x[b, i, :] + x[b, :, i]``; ``y[b, i, :] = (t - mean) /
    sqrt(var + epsilon) * gamma + beta`` with the mean and biased variance of ``t[b, i, :]``
    (statistics in float32 for float16 / bfloat16, float64 for float64). The transpose is
    never materialised: each batch element's block is read by rows and by columns in cache.

    Args:
      x: ``[B, S, S]`` float32, bfloat16, float16 or float64 (S tokens by S hidden units; the
        op needs S == H, as the Rec SDK's).
      gamma, beta: ``[S]``.
      epsilon: positive float (default 1e-7, the seed's).
      name: optional op name.

    Returns:
      ``[B, S, S]`` of ``x``'s dtype.

    Gradient: w.r.t. ``x``, ``gamma``, ``beta`` (``TokenMixingGrad``: ``dx = dt + dtᵀ``, dt
    through the LayerNorm; ``dgamma`` / ``dbeta`` summed in a fixed order). The seed op has no
    backward. Second order: not implemented (raises).

    Raises:
      InvalidArgumentError: ``x`` not ``[B, S, S]`` (S != H), ``gamma`` / ``beta`` not
        ``[S]``, S = 0, ``epsilon <= 0``.
      TypeError: ``x`` not float32/float16/bfloat16/float64, or ``gamma`` / ``beta`` of another
        dtype.

    Example:

    >>> y = token_mixing([[[1., 2.], [4., 3.]]], [1., 1.], [0., 0.])
    >>> [[round(v, 3) for v in row] for row in y.numpy()[0].tolist()]
    [[-1.0, 1.0], [0.0, 0.0]]
    """
    with tf.name_scope(name or "token_mixing"):
        x, gamma, beta = value_tensors("token_mixing", x=x, gamma=gamma, beta=beta)
        return lib().recops_token_mixing(x, gamma, beta, epsilon=float(epsilon))


@tf.RegisterGradient("Recops>TokenMixing")
def _token_mixing_grad(op, grad):
    return lib().recops_token_mixing_grad(grad, *op.inputs, epsilon=op.get_attr("epsilon"))


@tf.RegisterGradient("Recops>TokenMixingGrad")
def _token_mixing_grad_grad(op, *grads):
    raise NotImplementedError("second-order gradients of token_mixing are not implemented")

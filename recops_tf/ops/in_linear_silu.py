"""The UVQK projection of an HSTU layer: linear, SiLU, four-way split (stem in_linear_silu)."""
import tensorflow as tf

from recops_tf.ops._common import lib, value_tensors, zeros_if_none


@tf.custom_gradient
def _project(rows, weight):
    """rows · weightᵀ with a gradient whose weight part is computed as (rowsᵀ · dxw)ᵀ: oneDNN
    runs that orientation ~25% faster than TF's default dxwᵀ · rows (measured at M = 16384,
    K = 512, Nw = 2048: 107 vs 138 ms; the transpose of the small [K, Nw] result is free)."""
    def grad(dxw):
        return (tf.matmul(dxw, weight),
                tf.transpose(tf.matmul(rows, dxw, transpose_a=True)))
    return tf.matmul(rows, weight, transpose_b=True), grad


def in_linear_silu(x, weight, bias, split_sizes, *, weight_layout="nk", name=None):
    """``silu(x · Wᵀ + b)`` split by columns into ``(u, v, q, k)``, fused.

    Definition: ``z = x · weightᵀ + bias`` (float32 accumulation; float64 for float64),
    ``a = silu(z) = z · sigmoid(z)``, and ``u, v, q, k = a[:, :s0], a[:, s0:s0+s1], ...`` for
    ``split_sizes = (s0, s1, s2, s3)``. Unlike the Rec SDK, any sizes work (no multiples of
    16, no ``Nw % 4K == 0``).

    The GEMM is TensorFlow's own ``tf.matmul`` (oneDNN: faster on CPU than any GEMM this
    library could ship); the fused ``InLinearSilu`` op does the rest (bias, SiLU, the split
    and keeping z) in one pass over memory, where the composite makes three; its gradient
    ``InLinearSiluBackward`` turns the four upstream gradients into ``dz`` and ``db`` in one
    pass (recomputing z from ``x · Wᵀ``, which the matmul keeps anyway, instead of storing
    it); ``dx = dz · W`` and ``dW = (xᵀ · dz)ᵀ`` are TF matmuls again, the latter in the
    orientation oneDNN runs fastest.

    Args:
      x: ``[..., K]`` float32, bfloat16, float16 or float64 (leading dims flattened into M), or
        a ``tf.RaggedTensor`` ``[B, (L), K]`` (its flat values are projected).
      weight: ``[Nw, K]`` (torch ``Linear`` layout, the seed's), or ``[K, Nw]`` with
        ``weight_layout="kn"`` (Keras ``Dense`` layout; transposed once per call).
      bias: ``[Nw]``.
      split_sizes: four non-negative ints summing to Nw.
      weight_layout: ``"nk"`` (default) or ``"kn"``.
      name: optional op name.

    Returns:
      ``(u, v, q, k)``, each ``[..., s_i]`` of ``x``'s dtype (ragged for ragged ``x``).

    Gradient: w.r.t. ``x``, ``weight`` and ``bias`` (``InLinearSiluBackward``: ``dz`` from the
    saved pre-activation, rounded to the input dtype as the seed does, ``db = Σ dz`` in a
    fixed order; then TF's matmul gradient ``dx = dz · W``, ``dW = dzᵀ · x``). Second order of
    the epilogue: not implemented.

    Raises:
      InvalidArgumentError: ``x`` and ``weight`` not sharing K (raised by the matmul), ``bias``
        not ``[Nw]``, ``split_sizes`` not summing to Nw.
      TypeError: ``x`` not float32/float16/bfloat16/float64, or ``weight`` / ``bias`` of another
        dtype.
      ValueError: ``split_sizes`` not four non-negative ints, an unknown ``weight_layout``.

    Example:

    >>> u, v, q, k = in_linear_silu([[1., 2.]], [[1., 0.], [0., 1.], [1., 1.], [0., 0.]],
    ...                             [0., 0., 0., 0.], [1, 1, 1, 1])
    >>> [round(float(t[0, 0]), 4) for t in (u, v, q, k)]
    [0.7311, 1.7616, 2.8577, 0.0]
    """
    sizes = [int(s) for s in split_sizes]
    if len(sizes) != 4 or min(sizes) < 0:
        raise ValueError(f"split_sizes must be four non-negative ints, got {split_sizes}")
    if weight_layout not in ("nk", "kn"):
        raise ValueError(f"weight_layout must be 'nk' or 'kn', got {weight_layout!r}")
    with tf.name_scope(name or "in_linear_silu"):
        if isinstance(x, tf.RaggedTensor):
            outs = in_linear_silu(x.flat_values, weight, bias, sizes,
                                  weight_layout=weight_layout)
            return tuple(x.with_flat_values(o) for o in outs)
        x, weight, bias = value_tensors("in_linear_silu", x=x, weight=weight, bias=bias)
        if weight_layout == "kn":
            weight = tf.transpose(weight)
        lead = tf.shape(x)[:-1]
        rows = tf.reshape(x, [-1, tf.shape(x)[-1]]) if x.shape.rank != 2 else x
        xw = _project(rows, weight)
        outs = lib().recops_in_linear_silu(xw, bias, split_sizes=sizes)
        if x.shape.rank == 2:
            return tuple(outs)
        return tuple(tf.reshape(o, tf.concat([lead, [s]], 0)) for o, s in zip(outs, sizes))


@tf.RegisterGradient("Recops>InLinearSilu")
def _in_linear_silu_grad(op, du, dv, dq, dk):
    grads = [zeros_if_none(g, out) for g, out in zip((du, dv, dq, dk), op.outputs)]
    return lib().recops_in_linear_silu_backward(*grads, *op.inputs,
                                                split_sizes=op.get_attr("split_sizes"))


@tf.RegisterGradient("Recops>InLinearSiluBackward")
def _in_linear_silu_backward_grad(op, *grads):
    raise NotImplementedError("second-order gradients of in_linear_silu are not implemented")

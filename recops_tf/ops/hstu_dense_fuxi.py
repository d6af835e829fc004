"""Fuxi-alpha three-channel HSTU attention (stem hstu_dense_fuxi)."""
import tensorflow as tf

from recops_tf.ops._common import index_tensor, lib, op_attrs, value_tensors
from recops_tf.ops.hstu_dense import (_check_layout, _check_mask_type, _mask_input,
                                      _ragged_heads, _seq_lens, _static_dim)

_FN = "hstu_attention_fuxi"


def hstu_attention_fuxi(q, k, v, *, seq_offsets=None, max_seq_len=None, timestamp_bias=None,
                        position_bias=None, mask_type="causal", mask=None, silu_scale=0.0,
                        name=None):
    """Fuxi-alpha attention: a semantic SiLU channel plus temporal and positional channels.

    Per sequence b and head h, with ``m`` the visibility (causal ``j <= i``; all ones for
    ``"none"``; the custom mask's values for ``"custom"``) and ``c = silu_scale`` (0 means
    ``1 / max_seq_len``):

    * semantic: ``O_s = round(silu(q_i . k_j) * c * m_ij) . V`` (no softmax, no 1/sqrt(d), no
      alpha, no bias inside the SiLU);
    * temporal: ``O_t = round(timestamp_bias[b, i, j] * m_ij) . V``;
    * positional: ``O_p = round(position_bias[0, i, j] * m_ij) . V``.

    The temporal and positional channels use the raw masked biases as attention weights: no
    SiLU and no scale. They are computed only when both biases are given. Each output row is
    then ``[O_s (all heads) | O_t (all heads) | O_p (all heads)]``: ``[T, 3 N D]``, else
    ``[T, N D]``. Scores are tiled as in ``hstu_attention`` and never stored.

    Args:
      q, k, v: jagged ``[T, N, D]`` with ``seq_offsets``; or ``tf.RaggedTensor`` ``[B, (L), N,
        D]`` (the output is then ragged ``[B, (L), C N D]``); or dense ``[B, S, N, D]`` without
        offsets (output ``[B, S, C N D]``). One head count and one head size for all three (no
        GQA).
      seq_offsets: ``[B + 1]`` int32/int64 row offsets of the jagged layout.
      max_seq_len: S, the extent of the bias and mask planes (dense: defaults to the static S).
      timestamp_bias: ``[B, S, S]``, e.g. ``relative_attn_bias_time(..., duplicate=False)``'s
        bias of one layer.
      position_bias: ``[1, S, S]``.
      mask_type: ``"causal"``, ``"none"`` or ``"custom"`` (``mask`` ``[B, N, S, S]``);
        ``"upper triangular"`` is rejected.
      mask: the custom mask (multiplicative).
      silu_scale: as above.
      name: optional op name.

    Returns:
      ``[T, 3 N D]`` (with both biases) or ``[T, N D]``, of q's dtype (float32, float16,
      bfloat16, float64; float32 accumulation).

    Gradient: ``HstuFuxiBackward`` (fused, scores recomputed per tile) w.r.t. q, k, v and both
    biases; it takes the upstream gradient in this function's output layout (the Rec SDK
    backward expects ``[T, N, 3D]``; no permutation is needed here). Second order raises.

    Raises:
      InvalidArgumentError: bad offsets, a sequence longer than ``max_seq_len``, q, k, v of
        different head counts or head sizes, bias or mask shapes.
      TypeError: q not float32/float16/bfloat16/float64; k, v, the biases or the mask of
        another dtype than q; a ragged q with a dense k or v.
      ValueError: only one of the two biases, an unknown mask_type, a missing mask, a
        max_seq_len below 1; q, k, v of the wrong layout when the static shape shows it (as
        ``hstu_attention``).

    Example:

    >>> q = tf.ones([3, 1, 2]); offsets = tf.constant([0, 3], tf.int64)
    >>> ts = tf.ones([1, 3, 3]); pos = tf.zeros([1, 3, 3])
    >>> out = hstu_attention_fuxi(q, q, q, seq_offsets=offsets, max_seq_len=3,
    ...                           timestamp_bias=ts, position_bias=pos, silu_scale=1.0)
    >>> out.shape, out[:, 2].numpy().tolist()
    (TensorShape([3, 6]), [1.0, 2.0, 3.0])
    """
    _check_mask_type(mask_type)
    max_seq_len, _ = _seq_lens(_FN, max_seq_len)
    if (timestamp_bias is None) != (position_bias is None):
        raise ValueError("hstu_attention_fuxi: give both timestamp_bias and position_bias "
                         "(the temporal and positional channels), or neither")
    with tf.name_scope(name or "hstu_attention_fuxi"):
        if isinstance(q, tf.RaggedTensor):
            qv, splits, kv_, _, vv, _ = _ragged_heads(_FN, q=q, k=k, v=v)
            if max_seq_len is None:
                raise ValueError("max_seq_len must be given for ragged inputs")
            out = _jagged(qv, kv_, vv, splits, max_seq_len, timestamp_bias, position_bias,
                          mask_type, mask, silu_scale)
            return tf.RaggedTensor.from_row_splits(out, splits, validate=False)
        q, k, v = value_tensors(_FN, q=q, k=k, v=v)
        _check_layout(_FN, seq_offsets is not None, q=q, k=k, v=v)
        if seq_offsets is None:
            s = _static_dim(q, 1, "max_seq_len")
            max_seq_len = s if max_seq_len is None else max_seq_len
            shape = tf.shape(q, out_type=tf.int64)
            offsets = tf.range(shape[0] + 1) * shape[1]
            flat = [tf.reshape(x, [-1, x.shape[2], x.shape[3]]) for x in (q, k, v)]
            out = _jagged(*flat, offsets, max_seq_len, timestamp_bias, position_bias,
                          mask_type, mask, silu_scale)
            return tf.reshape(out, tf.concat([shape[:2], [-1]], 0))
        if max_seq_len is None:
            raise ValueError("max_seq_len must be given with seq_offsets")
        return _jagged(q, k, v, seq_offsets, max_seq_len, timestamp_bias, position_bias,
                       mask_type, mask, silu_scale)


def _jagged(q, k, v, seq_offsets, max_seq_len, timestamp_bias, position_bias, mask_type, mask,
            silu_scale):
    q, k, v, ts, pos, mask = value_tensors(_FN, q=q, k=k, v=v, timestamp_bias=timestamp_bias,
                                           position_bias=position_bias, mask=mask)
    mask = _mask_input(mask_type, mask, q.dtype, "[B, N, max_seq_len, max_seq_len]")
    has_bias = ts is not None
    empty = tf.zeros([0], q.dtype)
    ts = empty if ts is None else ts
    pos = empty if pos is None else pos
    return lib().recops_hstu_fuxi_forward(
        q, k, v, index_tensor(seq_offsets, "seq_offsets"), mask, ts, pos,
        max_seq_len=int(max_seq_len), silu_scale=float(silu_scale), mask_type=mask_type,
        has_bias=has_bias)


_ATTRS = ("max_seq_len", "silu_scale", "mask_type", "has_bias")


@tf.RegisterGradient("Recops>HstuFuxiForward")
def _hstu_fuxi_forward_grad(op, grad):
    attrs = op_attrs(op, _ATTRS)
    dq, dk, dv, d_ts, d_pos = lib().recops_hstu_fuxi_backward(grad, *op.inputs, **attrs)
    has_bias = attrs["has_bias"]
    return [dq, dk, dv, None, None, d_ts if has_bias else None, d_pos if has_bias else None]


@tf.RegisterGradient("Recops>HstuFuxiBackward")
def _hstu_fuxi_backward_grad(op, *grads):
    raise NotImplementedError("second-order gradients of hstu_attention_fuxi are not "
                              "implemented")

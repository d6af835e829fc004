"""HSTU relative attention bias: time buckets, their gradient, position bias (stem
relative_attn_bias)."""
import numpy as np
import tensorflow as tf

from recops_tf.ops._common import index_tensor, lib, value_tensors

DEFAULT_BUCKET_DIVISOR = 0.301


def _dense_timestamps(timestamps):
    if isinstance(timestamps, tf.RaggedTensor):
        # Padding positions get timestamp 0; the attention masks them (they lie past each
        # sequence's length).
        timestamps = timestamps.to_tensor()
    return index_tensor(timestamps, "timestamps")


def relative_attn_bias_time(timestamps, weights, bucket_divisor=DEFAULT_BUCKET_DIVISOR, *,
                            duplicate=True, name=None):
    """Time part of HSTU's relative attention bias: learned weights of log-bucketised time gaps.

    With ``a = |timestamps[b, j] - timestamps[b, i]|`` the bucket is
    ``min(floor(ln(max(a, 1)) / bucket_divisor), NB - 1)`` (in float64 from the float32
    divisor; the clamp to ``NB - 1`` makes every index safe) and
    ``bias[l, b, i, j] = weights[l, bucket[b, i, j]]``, for all L layers at once.

    ``duplicate=True`` (the Rec SDK wrapper's layout) fills a 2 x 2 block per entry: sequences
    interleave item and action tokens, so tokens 2i and 2i + 1 share timestamp i and the
    bias is ``[L, B, 2s, 2s]``. ``duplicate=False`` is for models that do not interleave
    (one token per timestamp): the bias is ``[L, B, s, s]``. The buckets are ``[B, s, s]``
    either way.

    Args:
      timestamps: ``[B, s]`` int32/int64, or a ``tf.RaggedTensor`` ``[B, (s)]`` (padded with
        0; the padded positions lie past each sequence and the attention masks them).
      weights: ``[L, NB]`` float32, float16, bfloat16 or float64: one weight per bucket per
        layer (NB >= 1, typically 129).
      bucket_divisor: positive float (float32 attribute), default 0.301.
      duplicate: the 2 x 2 duplication described above.
      name: optional op name.

    Returns:
      ``(bias, buckets)``: ``[L, B, 2s, 2s]`` (or ``[L, B, s, s]``) of ``weights``' dtype, and
      the int32 buckets ``[B, s, s]``.

    Gradient: w.r.t. ``weights``, ``relative_attn_bias_backward`` (deterministic scatter-add
    into the buckets, float32 accumulation); none for ``timestamps``.

    Raises:
      InvalidArgumentError: ``timestamps`` or ``weights`` not rank 2, NB < 1, a non-positive
        or non-finite divisor.
      TypeError: ``weights`` not float32/float16/bfloat16/float64, ``timestamps`` not int32/int64.

    Example:

    >>> bias, buckets = relative_attn_bias_time([[0, 1, 10]], [[0., 1., 2., 3., 4.]],
    ...                                         duplicate=False)
    >>> buckets.numpy().tolist()
    [[[0, 0, 4], [0, 0, 4], [4, 4, 0]]]
    """
    with tf.name_scope(name or "relative_attn_bias_time"):
        timestamps = _dense_timestamps(timestamps)
        weights, = value_tensors("relative_attn_bias_time", weights=weights)
        return tuple(lib().recops_relative_attn_bias_time(
            timestamps, weights, bucket_divisor=float(bucket_divisor), duplicate=duplicate))


def relative_attn_bias_backward(grad, buckets, num_buckets, *, duplicate=True, name=None):
    """Gradient of ``relative_attn_bias_time`` w.r.t. its weights.

    ``weights_grad[l, k]`` sums ``grad[l, b, i, j]`` over the entries whose bucket is k (with
    ``duplicate``, over each bucket's 2 x 2 block, so ``buckets`` stays ``[B, s, s]``; the Rec
    SDK kernel takes the expanded ``[B, 2s, 2s]`` index instead). Deterministic: rows are cut
    into at most 64 chunks fixed by the shape, each summed in order, the chunks added in
    order; float32 accumulation (float64 for float64), one rounding at the end.

    Args:
      grad: ``[L, B, 2s, 2s]`` (or ``[L, B, s, s]`` without ``duplicate``), float dtype.
      buckets: ``[B, s, s]`` int32, each in ``[0, num_buckets)``.
      num_buckets: NB, the weights' second dimension (int or int32 scalar tensor).
      duplicate: as in ``relative_attn_bias_time``.
      name: optional op name.

    Returns:
      ``[L, num_buckets]`` of ``grad``'s dtype.

    Gradient: linear in ``grad``: the upstream gathered by ``buckets`` (a TF composite).

    Raises:
      InvalidArgumentError: ranks, ``grad`` not matching ``buckets``, a bucket out of range.
      TypeError: ``grad`` not float32/float16/bfloat16/float64.

    Example:

    >>> relative_attn_bias_backward(tf.ones([1, 1, 2, 2]), [[[0, 1], [1, 1]]], 3,
    ...                             duplicate=False).numpy().tolist()
    [[1.0, 3.0, 0.0]]
    """
    with tf.name_scope(name or "relative_attn_bias_backward"):
        grad, = value_tensors("relative_attn_bias_backward", grad=grad)
        buckets = tf.convert_to_tensor(buckets, dtype=tf.int32, name="buckets")
        num_buckets = tf.convert_to_tensor(num_buckets, dtype=tf.int32, name="num_buckets")
        return lib().recops_relative_attn_bias_backward(grad, buckets, num_buckets,
                                                        duplicate=duplicate)


def relative_attn_bias_pos(rel_pos_bias, identity, past_valid_lens, name=None):
    """Position bias for KV-cache inference (Rec SDK ``relative_attn_bias_pos``).

    With ``r = i if i < past_valid_lens[b] else past_valid_lens[b]``:
    ``bias[b, i, j] = (1 - identity[i, j]) * rel_pos_bias[r, j] + identity[i, j] *
    rel_pos_bias[0, 0]``: rows past a sequence's cached length reuse the row of its last
    valid position, and entries where ``identity`` is 1 take ``rel_pos_bias[0, 0]``.
    ``toeplitz_position_bias`` builds both matrices from learned weights.

    Args:
      rel_pos_bias: ``[S2, S2]`` float32, float16, bfloat16 or float64.
      identity: ``[S2, S2]`` of the same dtype (0/1 for the usual use; any blend weight works).
      past_valid_lens: ``[B]`` int32/int64, each in ``[0, S2]`` (S2: no clamping). A tensor,
        so one traced function serves every batch.
      name: optional op name.

    Returns:
      ``[B, S2, S2]`` of ``rel_pos_bias``' dtype.

    Gradient: w.r.t. ``rel_pos_bias`` and ``identity`` (``RelativeAttnBiasPosBackward``: one
    pass over the upstream gradient, float32 accumulation, summed in a fixed order:
    deterministic); none for the lengths. Second order: not implemented (raises).

    Raises:
      InvalidArgumentError: matrices not square or of different shapes, a length outside
        ``[0, S2]``.
      TypeError: ``rel_pos_bias`` not float32/float16/bfloat16/float64, or ``identity`` of another
        dtype.

    Example:

    >>> p = tf.reshape(tf.range(9.), [3, 3])
    >>> relative_attn_bias_pos(p, tf.zeros([3, 3]), [1]).numpy()[0].tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [3.0, 4.0, 5.0]]
    """
    with tf.name_scope(name or "relative_attn_bias_pos"):
        rel_pos_bias, identity = value_tensors("relative_attn_bias_pos",
                                               rel_pos_bias=rel_pos_bias, identity=identity)
        return lib().recops_relative_attn_bias_pos(
            rel_pos_bias, identity, index_tensor(past_valid_lens, "past_valid_lens"))


def toeplitz_position_bias(pos_weights, candidate_len=0, *, duplicate=True, name=None):
    """Builds ``(rel_pos_bias, identity)`` for ``relative_attn_bias_pos`` from learned weights.

    For ``pos_weights`` of length ``2N - 1``: ``P0[i, j] = pos_weights[N - 1 + j - i]``
    (i, j < N, Meta's Toeplitz relative position bias), zero-padded by ``candidate_len // 2``
    on both axes' ends; with ``duplicate`` every entry becomes a 2 x 2 block and
    ``identity[R, C] = 1`` iff ``R // 2 == C // 2`` (else ``identity`` is the unit matrix).
    A composite of TF ops (a gather, pads and repeats), built once per model.

    Args:
      pos_weights: ``[2N - 1]`` float tensor.
      candidate_len: extra (candidate) positions; ``candidate_len // 2`` zero rows/columns.
      duplicate: the 2 x 2 duplication of interleaved item / action tokens.
      name: optional op name.

    Returns:
      ``(rel_pos_bias, identity)``, both ``[S2, S2]`` with ``S2 = f * (N + candidate_len //
      2)``, f = 2 with ``duplicate`` else 1.

    Gradient: TF's own (gather, pad, repeat): w.r.t. ``pos_weights`` each weight receives the
    sum over its diagonal of ``rel_pos_bias``'s gradient.

    Raises:
      ValueError: ``pos_weights`` of even or unknown length.

    Example:

    >>> p, i = toeplitz_position_bias(tf.constant([1., 2., 3.]), duplicate=False)
    >>> p.numpy().tolist()
    [[2.0, 3.0], [1.0, 2.0]]
    """
    with tf.name_scope(name or "toeplitz_position_bias"):
        pos_weights = tf.convert_to_tensor(pos_weights, dtype_hint=tf.float32,
                                           name="pos_weights")
        length = pos_weights.shape[0]
        if length is None or length % 2 != 1:
            raise ValueError(f"pos_weights must have a known odd length 2N - 1, got {length}")
        n = (length + 1) // 2
        rel = np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1
        p0 = tf.gather(pos_weights, rel)
        pad = candidate_len // 2
        p0 = tf.pad(p0, [[0, pad], [0, pad]])
        size = n + pad
        if duplicate:
            p0 = tf.repeat(tf.repeat(p0, 2, axis=0), 2, axis=1)
            blocks = np.arange(2 * size) // 2
            ident = (blocks[:, None] == blocks[None, :]).astype(np.float64)
        else:
            ident = np.eye(size)
        return p0, tf.constant(ident, dtype=pos_weights.dtype)


@tf.RegisterGradient("Recops>RelativeAttnBiasTime")
def _relative_attn_bias_time_grad(op, grad_bias, grad_buckets):
    num_buckets = tf.shape(op.inputs[1], out_type=tf.int32)[1]
    dw = lib().recops_relative_attn_bias_backward(grad_bias, op.outputs[1], num_buckets,
                                                  duplicate=op.get_attr("duplicate"))
    return [None, dw]


def _expand(buckets, duplicate):
    if duplicate:
        buckets = tf.repeat(tf.repeat(buckets, 2, axis=1), 2, axis=2)
    return buckets


@tf.RegisterGradient("Recops>RelativeAttnBiasBackward")
def _relative_attn_bias_backward_grad(op, grad):
    # d(weights_grad[l, k]) / d(grad[l, b, i, j]) = [bucket(b, i, j) == k]: a gather.
    index = _expand(op.inputs[1], op.get_attr("duplicate"))
    return [tf.gather(grad, index, axis=1), None, None]


@tf.RegisterGradient("Recops>RelativeAttnBiasPos")
def _relative_attn_bias_pos_grad(op, grad):
    pos, identity, lens = op.inputs
    d_pos, d_identity = lib().recops_relative_attn_bias_pos_backward(grad, pos, identity, lens)
    return [d_pos, d_identity, None]


@tf.RegisterGradient("Recops>RelativeAttnBiasPosBackward")
def _relative_attn_bias_pos_backward_grad(op, *grads):
    raise NotImplementedError("second-order gradients of relative_attn_bias_pos are not "
                              "implemented")

"""HSTU attention: fused forward and backward (stem hstu_dense)."""
import tensorflow as tf

from recops_tf.ops._attention import (check_layout, check_mask_type, gr_mask_args,
                                      mask_input, ragged_heads, seq_lens, static_dim)
from recops_tf.ops._common import (JaggedBatch, check_kernel, index_tensor, lib, op_attrs,
                                   value_tensors)
from recops_tf.ops.relative_attn_bias import DEFAULT_BUCKET_DIVISOR
from recops_tf.reference import hstu_dense as reference

def hstu_attention(q, k, v, *, seq_offsets=None, max_seq_len=None, alpha=1.0, silu_scale=0.0,
                   mask_type="causal", mask=None, attn_bias=None, num_context=None,
                   num_target=None, target_group_size=0, seq_offsets_k=None, max_seq_len_k=None,
                   window_size=None, timestamps=None, time_bias_weights=None,
                   position_bias_weights=None, bucket_divisor=DEFAULT_BUCKET_DIVISOR,
                   gr_mask=None, kernel="fused", name=None):
    """HSTU attention (pointwise SiLU attention of generative recommenders), fused.

    Definition, per sequence b, query head h (kv head ``h // (Nq/Nk)``), query i, key j:

    * ``z_ij = alpha * (q_i . k_j + attn_bias[b, h, i, j])`` (the bias is added before alpha
      multiplies; no softmax, no 1/sqrt(d)), or with the fused relative bias instead of
      ``attn_bias``: ``+ time_bias_weights[bucket(|t_j - t_(i+delta)|)] +
      position_bias_weights[max_seq_len_k - 1 + j - (i + delta)]`` (the sum rounded to the
      input dtype), ``delta = Lk - Lq`` (0 for self-attention) and the bucket that of
      ``relative_attn_bias_time``: ``min(floor(ln(max(gap, 1)) / bucket_divisor), NB - 1)``;
    * ``p_ij = silu(z_ij) * c * m_ij`` with ``c = silu_scale`` (``0`` means
      ``1 / max_seq_len``) and ``m`` the mask: built-in causal (``j <= i + Lk - Lq``, refined
      by ``num_context`` / ``num_target`` / ``target_group_size``), ``"none"``, or a
      multiplicative ``"custom"`` mask; ``window_size = (left, right)`` further limits keys to
      ``i + Lk - Lq - left <= j <= i + Lk - Lq + right`` (-1: unbounded);
    * ``out_i = sum_j p_ij * v_j``.

    ``gr_mask`` replaces the Rec SDK's mask rules above by generative-recommenders' (see
    ``GRMask``; ``recops_tf.compat.gr.hstu_mha`` is GR's ``hstu_mha`` on top of it), evaluated
    per tile in the same kernel.

    With float16/bfloat16 inputs the kernel accumulates in float32 and rounds the scores and
    ``p`` to the input dtype where Rec SDK's kernels do. Scores are computed tile by tile and
    never stored: memory is O(T * N * D), not O(B * N * S^2).

    Layouts:

    * jagged: ``q [Tq, Nq, Dqk]``, ``k [Tk, Nk, Dqk]``, ``v [Tk, Nk, Dv]`` with
      ``seq_offsets [B+1]`` (and ``seq_offsets_k`` for keys of other lengths: "delta", the
      queries being the last positions of each key sequence);
    * ragged: ``tf.RaggedTensor`` q/k/v ``[B, (L), N, D]``; returns a ``tf.RaggedTensor``;
    * dense: ``[B, S, N, D]`` (and ``[B, Sk, Nk, D]`` keys) when no offsets are given.

    Args:
      q, k, v: queries, keys, values (float32, bfloat16, float16, float64; same dtype).
      seq_offsets: ``[B+1]`` int32/int64 query offsets (jagged layout).
      max_seq_len: the longest query sequence allowed (the extent of ``mask``/``attn_bias`` and
        the default SiLU scale); read from the shape in the dense layout.
      alpha: score multiplier.
      silu_scale: the scale ``c``; 0 means ``1 / max_seq_len``.
      mask_type: ``"causal"``, ``"none"`` or ``"custom"`` ("upper triangular" is rejected).
      mask: ``[B, Nq, max_seq_len, max_seq_len_k]`` multiplicative mask for ``"custom"``.
      attn_bias: ``[B, Nq, max_seq_len, max_seq_len_k]`` additive score bias.
      num_context, num_target: ``[B]`` int counts for the causal mask's context rows (they see
        all non-target keys) and target block.
      target_group_size: targets see only their own group (of this size) among targets; 0:
        plain causal among targets.
      seq_offsets_k: ``[B+1]`` key offsets (default ``seq_offsets``).
      max_seq_len_k: the longest key sequence (default ``max_seq_len``).
      window_size: optional ``(left, right)`` window sizes.
      timestamps: int32/int64 timestamps of the key rows, in k's layout: ``[Tk]`` (jagged),
        ``[B, Sk]`` (dense) or a ``tf.RaggedTensor`` ``[B, (Lk)]``; needed by
        ``time_bias_weights``.
      time_bias_weights: ``[NB]`` learned weight per time bucket (HSTU's relative attention
        bias, time part), computed per score tile: the ``[B, N, S, S]`` bias is never built.
      position_bias_weights: ``[2 * max_seq_len_k - 1]`` learned weight per relative position
        ``j - i`` (offset by ``max_seq_len_k - 1``), likewise fused.
      bucket_divisor: the time buckets' log width (positive).
      gr_mask: None (the Rec SDK rules), or a ``GRMask`` (or a dict of its fields:
        ``max_attn_len``, ``contextual_seq_len``, ``min_full_attn_seq_len``) for GR's rules:
        self-attention, ``mask_type`` "causal" or "none", ``num_target`` as GR's
        ``num_targets``; ``num_context``, ``window_size`` and ``target_group_size`` are then
        refused.
      kernel: ``"fused"`` (the op library) or ``"reference"``: the padded stock-TF composite
        (``recops_tf.reference.hstu_dense``; it builds the ``[B, N, S, Sk]`` scores),
        with the same arguments, layouts and checks, differentiated by TensorFlow: the parity
        oracle and speed baseline (generative-recommenders' ``kernel=`` switch).
      name: optional op name.

    Returns:
      ``[Tq, Nq, Dv]`` (jagged), a ``tf.RaggedTensor`` ``[B, (L), Nq, Dv]`` (ragged) or
      ``[B, S, Nq, Dv]`` (dense).

    Gradient: w.r.t. q, k, v and attn_bias (the bias gradient is dS, zero outside each
    sequence's valid block), and w.r.t. ``time_bias_weights`` / ``position_bias_weights``
    (dS summed over heads per bucket / relative position, float32 accumulation, summed in a
    fixed order: deterministic); none for offsets, counts, timestamps and the mask.
    Second-order gradients are not implemented (they raise).

    Raises:
      InvalidArgumentError: bad offsets, a sequence longer than max_seq_len(_k), more queries
        than keys, head counts not divisible, mismatched head dims, mask/bias of the wrong
        shape, counts of the wrong length or too large, timestamps not one per key row, no
        time bucket, position weights not of length ``2 * max_seq_len_k - 1``, a non-positive
        bucket_divisor.
      TypeError: q not float32/float16/bfloat16/float64; k, v, mask, attn_bias or bias weights
        of another dtype than q; a ragged q with a dense k or v.
      ValueError: an unknown or unsupported mask_type, a missing mask, a max_seq_len that cannot
        be inferred, a max_seq_len or max_seq_len_k below 1, time weights without timestamps
        (or the reverse), attn_bias together with the relative bias; q, k, v of the wrong
        layout when the static shape shows it (a ragged ``[B, (L), D]`` without heads axis,
        two ragged axes, a jagged q not of rank 3, a dense q not of rank 4).

    Example:

    >>> q = tf.ones([3, 1, 2]); offsets = tf.constant([0, 3], tf.int64)
    >>> out = hstu_attention(q, q, q, seq_offsets=offsets, max_seq_len=3, silu_scale=1.0)
    >>> [round(x, 4) for x in out[:, 0, 0].numpy().tolist()]
    [1.7616, 3.5232, 5.2848]

    Notes: forward and backward are tiled (64 x 64 score tiles, skipped where the mask is all
    zero) and parallel over (sequence, head, query block) work items balanced by cost. No XLA
    kernel: a Keras layer calling it sets ``supports_jit = False`` (as ``HSTUAttention`` does).
    """
    check_mask_type(mask_type)
    gr_mask = gr_mask_args("hstu_attention", gr_mask, mask_type, num_context, target_group_size,
                           window_size)
    fused = check_kernel(kernel, "hstu_attention")
    max_seq_len, max_seq_len_k = seq_lens("hstu_attention", max_seq_len, max_seq_len_k)
    opts = dict(alpha=alpha, silu_scale=silu_scale, mask_type=mask_type, mask=mask,
                attn_bias=attn_bias, num_context=num_context, num_target=num_target,
                target_group_size=target_group_size, window_size=window_size,
                time_bias_weights=time_bias_weights,
                position_bias_weights=position_bias_weights, bucket_divisor=bucket_divisor,
                gr_mask=gr_mask, fused=fused)
    if (timestamps is None) != (time_bias_weights is None):
        raise ValueError("hstu_attention: timestamps and time_bias_weights go together")
    if attn_bias is not None and (time_bias_weights is not None
                                  or position_bias_weights is not None):
        raise ValueError("hstu_attention: attn_bias cannot be combined with the fused relative "
                         "bias (time_bias_weights / position_bias_weights)")
    with tf.name_scope(name or "hstu_attention"):
        if seq_offsets is not None:  # jagged
            q, k, v = value_tensors("hstu_attention", q=q, k=k, v=v)
            check_layout("hstu_attention", True, q=q, k=k, v=v)
            if max_seq_len is None:
                raise ValueError("max_seq_len must be given with seq_offsets")
            return _jagged(q, k, v, seq_offsets,
                           seq_offsets if seq_offsets_k is None else seq_offsets_k, max_seq_len,
                           max_seq_len_k, timestamps, **opts)
        if isinstance(q, tf.RaggedTensor):
            ragged_heads("hstu_attention", q=q, k=k, v=v)
            if max_seq_len is None:
                raise ValueError("max_seq_len must be given for ragged inputs")
        else:
            q, k, v = value_tensors("hstu_attention", q=q, k=k, v=v)
            check_layout("hstu_attention", False, q=q, k=k, v=v)
            max_seq_len = static_dim(q, 1, "max_seq_len") if max_seq_len is None else max_seq_len
            if max_seq_len_k is None:
                max_seq_len_k = static_dim(k, 1, "max_seq_len_k")
        queries, keys = JaggedBatch(q), JaggedBatch(k)
        out = _jagged(queries.rows, keys.rows, JaggedBatch(v).rows, queries.offsets,
                      keys.offsets, max_seq_len, max_seq_len_k, keys.rows_of(timestamps),
                      **opts)
        return queries.output(out)


def _jagged(q, k, v, seq_offsets, seq_offsets_k, max_seq_len, max_seq_len_k, timestamps, *,
            alpha, silu_scale, mask_type, mask, attn_bias, num_context, num_target,
            target_group_size, window_size, time_bias_weights, position_bias_weights,
            bucket_divisor, gr_mask, fused):
    max_seq_len_k = max_seq_len if max_seq_len_k is None else max_seq_len_k
    index = [index_tensor(seq_offsets, "seq_offsets"), index_tensor(seq_offsets_k, "seq_offsets_k")]
    for count, what in ((num_context, "num_context"), (num_target, "num_target"),
                        (timestamps, "timestamps")):
        index.append(None if count is None else index_tensor(count, what))
    if len({t.dtype for t in index if t is not None}) > 1:
        index = [None if t is None else tf.cast(t, tf.int64) for t in index]
    q, k, v, mask, attn_bias, *weights = value_tensors(
        "hstu_attention", q=q, k=k, v=v, mask=mask, attn_bias=attn_bias,
        time_bias_weights=time_bias_weights, position_bias_weights=position_bias_weights)
    mask = mask_input(mask_type, mask, q.dtype, "[B, Nq, max_seq_len, max_seq_len_k]")
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    if not fused:
        return _reference(q, k, v, *index, mask, attn_bias, *weights, max_seq_len,
                          max_seq_len_k, alpha, silu_scale, mask_type, target_group_size, left,
                          right, bucket_divisor, gr_mask)
    empty = lambda t, dtype: tf.zeros([0], dtype) if t is None else t  # noqa: E731
    index = [empty(t, index[0].dtype) for t in index]
    return lib().recops_hstu_dense_forward(
        q, k, v, *index[:4], mask, empty(attn_bias, q.dtype), index[4],
        *(empty(w, q.dtype) for w in weights), max_seq_len=int(max_seq_len),
        max_seq_len_k=int(max_seq_len_k), alpha=float(alpha), silu_scale=float(silu_scale),
        mask_type=mask_type, target_group_size=int(target_group_size), window_left=left,
        window_right=right, has_bias=attn_bias is not None,
        has_time_bias=time_bias_weights is not None,
        has_position_bias=position_bias_weights is not None,
        bucket_divisor=float(bucket_divisor), **({} if gr_mask is None else gr_mask.attrs()))


def _reference(q, k, v, offsets, offsets_k, num_context, num_target, timestamps, mask,
               attn_bias, time_weights, position_weights, max_seq_len, max_seq_len_k, alpha,
               silu_scale, mask_type, target_group_size, left, right, bucket_divisor, gr_mask):
    """hstu_attention's composite on jagged arguments (what ``kernel="reference"`` runs).
    The kernel's checks without which the composite would give silent garbage are asserted
    first (InvalidArgumentError when run): sequences within max_seq_len(_k), no more queries
    than keys, counts of one entry per sequence, one timestamp per key row; bad offsets are
    refused by ``tf.RaggedTensor.from_row_splits``."""
    lq = tf.cast(offsets[1:] - offsets[:-1], tf.int64)
    lk = tf.cast(offsets_k[1:] - offsets_k[:-1], tf.int64)
    fn = "hstu_attention"
    checks = [
        tf.debugging.assert_equal(tf.size(offsets), tf.size(offsets_k),
                                  message=f"{fn}: seq_offsets_k must have seq_offsets' length"),
        tf.debugging.assert_less_equal(lq, tf.constant(max_seq_len, tf.int64),
                                       message=f"{fn}: a query sequence is longer than "
                                       "max_seq_len"),
        tf.debugging.assert_less_equal(lk, tf.constant(max_seq_len_k, tf.int64),
                                       message=f"{fn}: a key sequence is longer than "
                                       "max_seq_len_k"),
        tf.debugging.assert_less_equal(lq, lk, message=f"{fn}: more queries than keys")]
    if gr_mask is not None:
        checks.append(tf.debugging.assert_equal(lq, lk, message=f"{fn}: gr_mask is "
                                                "self-attention (as many queries as keys)"))
        if num_target is not None:
            checks.append(tf.debugging.assert_less_equal(
                tf.cast(num_target, tf.int64)[:tf.size(lq)], lq,
                message=f"{fn}: num_target must be <= the sequence length"))
    for count, what in ((num_context, "num_context"), (num_target, "num_target")):
        if count is not None:
            checks.append(tf.debugging.assert_equal(
                tf.size(count), tf.size(lq), message=f"{fn}: {what} must have B entries"))
    plane = tf.stack([tf.size(lq, out_type=tf.int64), tf.shape(q, out_type=tf.int64)[1],
                      max_seq_len, max_seq_len_k])
    for given, what in ((mask if mask_type == "custom" else None, "mask"),
                        (attn_bias, "attn_bias")):
        if given is not None:
            checks.append(tf.debugging.assert_equal(
                tf.shape(given, out_type=tf.int64), plane,
                message=f"{fn}: {what} must be [B, Nq, max_seq_len, max_seq_len_k]"))
    if timestamps is not None:
        checks.append(tf.debugging.assert_equal(
            tf.size(timestamps, out_type=tf.int64), tf.cast(offsets_k[-1], tf.int64),
            message=f"{fn}: timestamps must have one entry per key row"))
    with tf.control_dependencies(checks):
        q = tf.identity(q)
    return reference.hstu_attention(
        q, k, v, offsets, offsets_k, max_seq_len, max_seq_len_k, alpha=alpha,
        silu_scale=silu_scale, mask_type=mask_type, mask=mask if mask_type == "custom" else None,
        attn_bias=attn_bias, num_context=num_context, num_target=num_target,
        target_group_size=target_group_size, window_left=left, window_right=right,
        timestamps=timestamps, time_bias_weights=time_weights,
        position_bias_weights=position_weights, bucket_divisor=bucket_divisor, gr_mask=gr_mask)


_ATTRS = ("max_seq_len", "max_seq_len_k", "alpha", "silu_scale", "mask_type",
          "target_group_size", "window_left", "window_right", "has_bias", "has_time_bias",
          "has_position_bias", "bucket_divisor", "mask_rules", "max_attn_len", "contextual_seq_len",
          "min_full_attn_seq_len")


@tf.RegisterGradient("Recops>HstuDenseForward")
def _hstu_dense_forward_grad(op, grad):
    attrs = op_attrs(op, _ATTRS)
    dq, dk, dv, dbias, d_time, d_pos = lib().recops_hstu_dense_backward(grad, *op.inputs,
                                                                         **attrs)
    return [dq, dk, dv, None, None, None, None, None, dbias if attrs["has_bias"] else None,
            None, d_time if attrs["has_time_bias"] else None,
            d_pos if attrs["has_position_bias"] else None]


@tf.RegisterGradient("Recops>HstuDenseBackward")
def _hstu_dense_backward_grad(op, *grads):
    raise NotImplementedError("second-order gradients of hstu_attention are not implemented")


def hstu_attention_paged(q, k, v, kv_cache, *, seq_offsets, page_offsets, page_ids,
                         last_page_len, num_target, max_seq_len, max_seq_len_k, alpha=1.0,
                         silu_scale=0.0, target_group_size=1, name=None):
    """HSTU attention forward over a paged KV cache (inference, "M-FALCON" style).

    Sequence ``b`` has ``L_b`` query tokens (``seq_offsets``): new history tokens followed by
    its ``num_target[b]`` target tokens. Its keys are the cached pages
    ``kv_cache[page_ids[page_offsets[b]] ... page_ids[page_offsets[b+1]-1], 0]`` (every page
    full except the last, which holds ``last_page_len[b]`` rows; the cache already contains the
    past and the new history tokens) followed by the fresh ``k`` rows of the target tokens;
    values likewise from ``kv_cache[..., 1]`` and ``v``. Attention is that of
    ``hstu_attention`` with the causal mask aligned to the end of the keys and the target
    group rule (``target_group_size`` 1: each target sees the whole cache and itself).

    Args:
      q: ``[T, Nq, D]`` queries of all tokens.
      k, v: ``[T, Nk, D]`` keys / values of the same tokens (only the targets' rows are read).
      kv_cache: ``[num_pages, 2, page_size, Nk, D]`` (index 0: keys, 1: values).
      seq_offsets: ``[B+1]`` offsets of the query tokens.
      page_offsets: ``[B+1]`` offsets into ``page_ids``.
      page_ids: ``[page_offsets[B]]`` page numbers, each in ``[0, num_pages)``.
      last_page_len: ``[B]`` rows used in each sequence's last page, in ``[1, page_size]``.
      num_target: ``[B]`` target tokens per sequence (their k/v are appended to the cache).
      max_seq_len, max_seq_len_k: longest query / key sequences (``silu_scale`` 0 means
        ``1 / max_seq_len``).
      alpha, silu_scale, target_group_size: as in ``hstu_attention``.
      name: optional op name.

    Returns:
      ``[T, Nq, D]``.

    Gradient: none (inference op; asking for one raises).

    Raises:
      InvalidArgumentError: bad offsets, a page id out of range, a last_page_len outside
        ``[1, page_size]``, more targets than tokens, more query tokens than keys, sequences
        longer than max_seq_len(_k), a kv_cache of the wrong shape.
      TypeError: q not float32/float16/bfloat16/float64, or k, v, kv_cache of another dtype.
      ValueError: max_seq_len or max_seq_len_k below 1.

    Example:

    >>> cache = tf.ones([2, 2, 4, 1, 2])
    >>> q = tf.ones([2, 1, 2])
    >>> out = hstu_attention_paged(q, q, q, cache, seq_offsets=[0, 2], page_offsets=[0, 1],
    ...     page_ids=[1], last_page_len=[3], num_target=[1], max_seq_len=2, max_seq_len_k=4,
    ...     silu_scale=1.0)
    >>> out.shape.as_list()
    [2, 1, 2]
    """
    max_seq_len, max_seq_len_k = seq_lens("hstu_attention_paged", max_seq_len, max_seq_len_k)
    with tf.name_scope(name or "hstu_attention_paged"):
        q, k, v, kv_cache = value_tensors("hstu_attention_paged", q=q, k=k, v=v,
                                          kv_cache=kv_cache)
        index = [index_tensor(x, n) for x, n in (
            (seq_offsets, "seq_offsets"), (page_offsets, "page_offsets"), (page_ids, "page_ids"),
            (last_page_len, "last_page_len"), (num_target, "num_target"))]
        if len({t.dtype for t in index}) > 1:
            index = [tf.cast(t, tf.int64) for t in index]
        return lib().recops_hstu_paged_forward(
            q, k, v, kv_cache, *index, max_seq_len=int(max_seq_len),
            max_seq_len_k=int(max_seq_len_k), alpha=float(alpha), silu_scale=float(silu_scale),
            target_group_size=int(target_group_size))


def hstu_attention_cached(q, k, v, past_keys, past_values, *, max_seq_len, key_column=0,
                          value_column=0, alpha=1.0, silu_scale=0.0, timestamps=None,
                          time_bias_weights=None, position_bias_weights=None,
                          bucket_divisor=DEFAULT_BUCKET_DIVISOR, kernel="fused", name=None):
    """HSTU attention of one sequence's new tokens over its cached tokens (inference).

    The sequence has P cached tokens, whose keys and values an earlier call computed, and n
    new ones (``q``, ``k``, ``v``). New token i is position ``P + i``: it attends the P cached
    keys and the new keys ``0..i`` (the causal mask of ``hstu_attention``), with the same
    scores, fused relative bias, alpha, SiLU and scale. The result equals the last n rows of
    ``hstu_attention`` on the whole sequence, at O(n (P + n)) cost, and the cache is read
    where it is: cached key ``j`` of head ``h`` is ``past_keys[j, key_column + h * Dqk:][:Dqk]``
    (values likewise from ``past_values`` at ``value_column``), so a user's cache rows holding
    every block's keys and values side by side need no slicing or concatenation.

    Args:
      q, k: ``[n, N, Dqk]`` the new tokens' queries and keys.
      v: ``[n, N, Dv]``.
      past_keys, past_values: ``[P, Wk]``, ``[P, Wv]`` the cached rows (``P`` may be 0).
      max_seq_len: the attention's sequence bound (``P + n`` at most; the position bias has
        ``2 * max_seq_len - 1`` weights; ``silu_scale`` 0 means ``1 / max_seq_len``).
      key_column, value_column: where head 0's key / value starts in a cached row.
      alpha, silu_scale, bucket_divisor: as in ``hstu_attention``.
      timestamps: ``[P + n]`` int64, every token's (with ``time_bias_weights``).
      time_bias_weights: ``[num_buckets]`` or None; position_bias_weights: ``[2 *
        max_seq_len - 1]`` or None.
      kernel: ``"fused"`` (the op library) or ``"reference"`` (concatenation, then the
        stock-TF composite of ``hstu_attention``).
      name: optional op name.

    Returns:
      ``[n, N, Dv]``.

    Gradient: none (inference op; asking for one raises).

    Raises:
      InvalidArgumentError: shapes (k unlike q, v or the cached rows of other lengths,
        columns past a cached row), more than max_seq_len tokens, timestamps not one per
        token, position weights not ``2 * max_seq_len - 1``.
      TypeError: q not float32/float16/bfloat16/float64, or the others of another dtype.
      ValueError: max_seq_len below 1, a negative column.

    Example:

    >>> past = tf.ones([3, 4])  # 3 cached tokens: key (2 wide) then value (2 wide)
    >>> new = tf.ones([1, 1, 2])
    >>> out = hstu_attention_cached(new, new, new, past, past, max_seq_len=4,
    ...     value_column=2, silu_scale=1.0)
    >>> [round(x, 4) for x in out.numpy().ravel().tolist()]
    [7.0464, 7.0464]
    """
    max_seq_len, _ = seq_lens("hstu_attention_cached", max_seq_len)
    if int(key_column) < 0 or int(value_column) < 0:
        raise ValueError(f"hstu_attention_cached: key_column and value_column must be >= 0, "
                         f"got {key_column} and {value_column}")
    with tf.name_scope(name or "hstu_attention_cached"):
        q, k, v, past_keys, past_values = value_tensors(
            "hstu_attention_cached", q=q, k=k, v=v, past_keys=past_keys,
            past_values=past_values)
        dtype = q.dtype
        time_w = (tf.zeros([0], dtype) if time_bias_weights is None else
                  tf.cast(time_bias_weights, dtype))
        pos_w = (tf.zeros([0], dtype) if position_bias_weights is None else
                 tf.cast(position_bias_weights, dtype))
        if time_bias_weights is not None and timestamps is None:
            raise ValueError("hstu_attention_cached: time_bias_weights need timestamps")
        ts = (tf.zeros([0], tf.int64) if timestamps is None else
              tf.cast(index_tensor(timestamps, "timestamps"), tf.int64))
        if not check_kernel(kernel, "hstu_attention_cached"):
            return reference.hstu_attention_cached(
                q, k, v, past_keys, past_values, int(max_seq_len), int(key_column),
                int(value_column), alpha=alpha, silu_scale=silu_scale,
                timestamps=None if timestamps is None else ts,
                time_bias_weights=None if time_bias_weights is None else time_w,
                position_bias_weights=None if position_bias_weights is None else pos_w,
                bucket_divisor=bucket_divisor)
        return lib().recops_hstu_cached_forward(
            q, k, v, past_keys, past_values, ts, time_w, pos_w, key_column=int(key_column),
            value_column=int(value_column), max_seq_len=int(max_seq_len), alpha=float(alpha),
            silu_scale=float(silu_scale), bucket_divisor=float(bucket_divisor))


@tf.RegisterGradient("Recops>HstuCachedForward")
def _hstu_cached_forward_grad(op, grad):
    raise NotImplementedError("hstu_attention_cached is an inference op: it has no gradient")


@tf.RegisterGradient("Recops>HstuPagedForward")
def _hstu_paged_forward_grad(op, grad):
    raise NotImplementedError("hstu_attention_paged is an inference op: it has no gradient")

"""Padded dense composite of HSTU attention from stock TF ops (jagged -> dense, einsum, bias,
SiLU, mask, einsum, dense -> jagged): the test oracle and the benchmark baseline. It builds
the full [B, N, S, Sk] score tensor, which is what the fused kernel avoids."""
import numpy as np
import tensorflow as tf


def _lengths(offsets):
    offsets = tf.cast(offsets, tf.int64)
    return offsets[1:] - offsets[:-1]


def visibility(seq_offsets, seq_offsets_k, max_seq_len, max_seq_len_k, mask_type="causal",
               num_context=None, num_target=None, target_group_size=0, window_left=-1,
               window_right=-1, gr_mask=None):
    """Boolean [B, 1, S, Sk]: query i of sequence b may see key j (spec §1 rules, windows; or
    generative-recommenders' rules with a ``GRMask``)."""
    if gr_mask is not None:
        return gr_visibility(seq_offsets, max_seq_len, mask_type == "causal", num_target,
                             *gr_mask)
    lq, lk = _lengths(seq_offsets), _lengths(seq_offsets_k)
    col = lambda x: tf.reshape(x, [-1, 1, 1, 1])  # noqa: E731
    lq, lk = col(lq), col(lk)
    delta = lk - lq
    i = tf.reshape(tf.range(max_seq_len, dtype=tf.int64), [1, 1, -1, 1])
    j = tf.reshape(tf.range(max_seq_len_k, dtype=tf.int64), [1, 1, 1, -1])
    vis = (i < lq) & (j < lk)
    if mask_type == "causal":
        zeros = tf.zeros_like(lq)
        ctx = zeros if num_context is None else col(tf.cast(num_context, tf.int64))
        tgt = zeros if num_target is None else col(tf.cast(num_target, tf.int64))
        rule = tf.where((ctx > 0) & (i < ctx), j < lk - tgt, j <= i + delta)
        if target_group_size > 0:
            g = target_group_size
            in_targets = (tgt > 0) & (i >= lq - tgt) & (j >= lk - tgt)
            ti, tj = i - (lq - tgt), j - (lk - tgt)
            group_rule = (tf.math.floordiv(ti, g) == tf.math.floordiv(tj, g)) & (tj <= ti)
            rule = tf.where(in_targets, group_rule, rule)
        vis &= rule
    if window_left >= 0:
        vis &= j >= i + delta - window_left
    if window_right >= 0:
        vis &= j <= i + delta + window_right
    return vis


def gr_visibility(seq_offsets, max_seq_len, causal, num_target, max_attn_len,
                  contextual_seq_len, min_full_attn_seq_len):
    """Boolean [B, 1, S, S]: GR's rules (``recops_tf.ops._attention.GRMask``) as a dense
    plane, inside each sequence only."""
    n = _lengths(seq_offsets)[:, None]  # [B, 1]
    c = contextual_seq_len
    tgt = tf.zeros_like(n) if num_target is None else tf.cast(num_target, tf.int64)[:, None]
    top = n - max(c - 1, 0) - tgt  # the largest id
    pos = tf.range(max_seq_len, dtype=tf.int64)[None, :]  # [1, S]
    ids = tf.minimum(tf.maximum(pos - c + 1, 0) if c > 0 else pos, top)  # [B, S]
    row, col = ids[:, :, None], ids[:, None, :]
    dist = row - col
    if not causal:
        dist = tf.abs(dist)
    vis = (pos[:, :, None] == pos[:, None, :]) | (dist > 0)
    if max_attn_len > 0:
        within = dist <= max_attn_len
        if min_full_attn_seq_len > 0:
            within |= row >= top[:, :, None] - min_full_attn_seq_len
        vis &= within
    if c > 0:
        vis |= (row == 0) & (col < top[:, :, None])
    inside = pos < n
    return (vis & inside[:, :, None] & inside[:, None, :])[:, None]


def relative_bias(timestamps, seq_offsets, seq_offsets_k, max_seq_len, max_seq_len_k,
                  time_bias_weights=None, position_bias_weights=None,
                  bucket_divisor=0.301):
    """The relative bias plane [B, 1, S, Sk] of hstu_attention's fused relative bias, built
    densely: time_w[bucket(|t_j - t_(i+delta)|)] + pos_w[Sk - 1 + j - (i + delta)], the
    bucket in float64 from the float32 divisor. Padding entries hold clipped garbage (the
    mask removes them)."""
    lq, lk = _lengths(seq_offsets), _lengths(seq_offsets_k)
    batch = tf.shape(lq)[0]
    key_i = (tf.range(max_seq_len, dtype=tf.int64)[None, :] + (lk - lq)[:, None])  # [B, S]
    key_i = tf.clip_by_value(key_i, 0, max_seq_len_k - 1)
    bias = 0
    if time_bias_weights is not None:
        tk = tf.RaggedTensor.from_row_splits(tf.cast(timestamps, tf.int64),
                                             tf.cast(seq_offsets_k, tf.int64))
        tk = tk.to_tensor(shape=[batch, max_seq_len_k])
        ti = tf.gather(tk, key_i, batch_dims=1)
        gap = tf.cast(tf.abs(tk[:, None, :] - ti[:, :, None]), tf.float64)
        num_buckets = tf.shape(time_bias_weights, out_type=tf.int64)[0]
        bucket = tf.floor(tf.math.log(tf.maximum(gap, 1.0)) / float(np.float32(bucket_divisor)))
        bucket = tf.minimum(tf.cast(bucket, tf.int64), num_buckets - 1)
        bias = tf.gather(time_bias_weights, bucket)
    if position_bias_weights is not None:
        offset = (max_seq_len_k - 1 + tf.range(max_seq_len_k, dtype=tf.int64)[None, None, :]
                  - key_i[:, :, None])
        bias = bias + tf.gather(position_bias_weights, offset)
    return bias[:, None]


def hstu_attention(q, k, v, seq_offsets, seq_offsets_k, max_seq_len, max_seq_len_k, alpha=1.0,
                   silu_scale=0.0, mask_type="causal", mask=None, attn_bias=None,
                   num_context=None, num_target=None, target_group_size=0, window_left=-1,
                   window_right=-1, timestamps=None, time_bias_weights=None,
                   position_bias_weights=None, bucket_divisor=0.301, gr_mask=None):
    """Jagged q [Tq, Nq, Dqk], k [Tk, Nk, Dqk], v [Tk, Nk, Dv] -> [Tq, Nq, Dv]."""
    if time_bias_weights is not None or position_bias_weights is not None:
        attn_bias = relative_bias(timestamps, seq_offsets, seq_offsets_k, max_seq_len,
                                  max_seq_len_k, time_bias_weights, position_bias_weights,
                                  bucket_divisor)
    dtype = q.dtype
    splits_q = tf.cast(seq_offsets, tf.int64)
    splits_k = tf.cast(seq_offsets_k, tf.int64)
    batch = tf.shape(splits_q, out_type=tf.int64)[0] - 1
    nq, nk = q.shape[1], k.shape[1]
    to_dense = lambda x, splits, s: tf.RaggedTensor.from_row_splits(x, splits).to_tensor(  # noqa
        shape=[batch, s, x.shape[1], x.shape[2]])
    qd = to_dense(q, splits_q, max_seq_len)
    kd = tf.repeat(to_dense(k, splits_k, max_seq_len_k), nq // nk, axis=2)
    vd = tf.repeat(to_dense(v, splits_k, max_seq_len_k), nq // nk, axis=2)
    s = tf.einsum("bihd,bjhd->bhij", qd, kd)
    if attn_bias is not None:
        s = s + attn_bias
    z = tf.cast(alpha, dtype) * s
    scale = silu_scale if silu_scale != 0.0 else float(np.float32(1.0) / np.float32(max_seq_len))
    p = z * tf.sigmoid(z) * tf.cast(scale, dtype)
    m = tf.cast(visibility(seq_offsets, seq_offsets_k, max_seq_len, max_seq_len_k, mask_type,
                           num_context, num_target, target_group_size, window_left,
                           window_right, gr_mask), dtype)
    if mask_type == "custom":
        m = m * mask
    o = tf.einsum("bhij,bjhd->bihd", p * m, vd)
    return tf.RaggedTensor.from_tensor(o, lengths=_lengths(splits_q)).values


def paged_keys(k, v, kv_cache, seq_offsets, page_offsets, page_ids, last_page_len, num_target):
    """Effective jagged keys / values and key offsets of the paged layout (eager, per sequence)."""
    page_size = kv_cache.shape[2]
    ks, vs, lengths = [], [], []
    offsets = tf.cast(seq_offsets, tf.int64).numpy()
    page_offsets = tf.cast(page_offsets, tf.int64).numpy()
    page_ids = tf.cast(page_ids, tf.int64).numpy()
    for b in range(len(offsets) - 1):
        ids = page_ids[page_offsets[b]:page_offsets[b + 1]]
        pages = tf.gather(kv_cache, ids)  # [n, 2, page_size, Nk, D]
        rows = (len(ids) - 1) * page_size + int(last_page_len[b]) if len(ids) else 0
        cached_k = tf.reshape(pages[:, 0], [-1, k.shape[1], k.shape[2]])[:rows]
        cached_v = tf.reshape(pages[:, 1], [-1, v.shape[1], v.shape[2]])[:rows]
        first = offsets[b + 1] - int(num_target[b])
        ks.append(tf.concat([cached_k, k[first:offsets[b + 1]]], axis=0))
        vs.append(tf.concat([cached_v, v[first:offsets[b + 1]]], axis=0))
        lengths.append(rows + int(num_target[b]))
    offsets_k = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return tf.concat(ks, axis=0), tf.concat(vs, axis=0), tf.constant(offsets_k)


def hstu_attention_paged(q, k, v, kv_cache, seq_offsets, page_offsets, page_ids, last_page_len,
                         num_target, max_seq_len, max_seq_len_k, alpha=1.0, silu_scale=0.0,
                         target_group_size=1):
    keys, values, offsets_k = paged_keys(k, v, kv_cache, seq_offsets, page_offsets, page_ids,
                                         last_page_len, num_target)
    return hstu_attention(q, keys, values, seq_offsets, offsets_k, max_seq_len, max_seq_len_k,
                          alpha=alpha, silu_scale=silu_scale, num_target=num_target,
                          target_group_size=target_group_size)


def hstu_attention_cached(q, k, v, past_keys, past_values, max_seq_len, key_column=0,
                          value_column=0, alpha=1.0, silu_scale=0.0, timestamps=None,
                          time_bias_weights=None, position_bias_weights=None,
                          bucket_divisor=0.301):
    """q, k [n, N, Dqk], v [n, N, Dv] of one sequence's new tokens over its P cached rows:
    the cached keys and values concatenated before the new ones, then the delta layout's
    attention (the new tokens are the last positions of the keys)."""
    heads, dk = q.shape[1], q.shape[2]
    dv = v.shape[2]
    keys = tf.concat([tf.reshape(past_keys[:, key_column:key_column + heads * dk],
                                 [-1, heads, dk]), k], 0)
    values = tf.concat([tf.reshape(past_values[:, value_column:value_column + heads * dv],
                                   [-1, heads, dv]), v], 0)
    zero = tf.zeros([1], tf.int64)
    offsets_q = tf.concat([zero, tf.shape(q, out_type=tf.int64)[:1]], 0)
    offsets_k = tf.concat([zero, tf.shape(keys, out_type=tf.int64)[:1]], 0)
    return hstu_attention(q, keys, values, offsets_q, offsets_k, max_seq_len, max_seq_len,
                          alpha=alpha, silu_scale=silu_scale, timestamps=timestamps,
                          time_bias_weights=time_bias_weights,
                          position_bias_weights=position_bias_weights,
                          bucket_divisor=bucket_divisor)

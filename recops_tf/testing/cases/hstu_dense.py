"""Cases of hstu_dense: causal jagged HSTU attention, its paged KV-cache forward, its cached
forward (new tokens over cache rows read in place) and its fused relative bias."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import hstu_dense as ref
from recops_tf.testing.cases._common import Case, row_offsets, tensor_bytes
from recops_tf.testing.inputs import random_values


def build(batch=3, max_len=70, heads=2, dim=8, paged=False, page_size=16, cached=0,
          rel_bias=False, gr_window=0, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """Causal jagged HSTU attention, lengths uniform in [1, max_len], Nq = Nk, Dqk = Dv.

    With `paged`, the paged KV-cache forward: each sequence has a cache of up to max_len keys
    in pages and up to 4 new tokens, the last up to 2 of them targets (forward only).

    With `cached` = n > 0, the cached forward (``hstu_attention_cached``) of `batch`
    sequences called one after the other (a serving step per user): each has max_len - n
    cached tokens, whose rows hold every head's keys then values, and n new tokens, with the
    relative bias (forward only); the reference concatenates the cache and the new keys.

    With `rel_bias`, the fused relative bias (129 time buckets of increasing timestamps, gaps
    up to a day, and 2 * max_len - 1 position weights) against the same attention given the
    dense bias built by the separate ops (relative_attn_bias_time + the Toeplitz position
    bias, broadcast over heads), which is how the bias is applied without the fusion.

    With `gr_window` > 0, generative-recommenders' mask rules (``gr_mask``: max_attn_len
    `gr_window`, 3 context positions, up to 8 targets): the reference is GR's mask built
    densely, the benchmark's baseline the Rec SDK rules' nearest equivalent on the same
    shape (window (gr_window, 0), 3 context rows, the same targets), so the benchmark's
    speedup is Rec SDK time / GR time."""
    rng = np.random.default_rng(seed)
    if paged:
        return _hstu_paged(rng, batch, max_len, heads, dim, page_size, dtype, index_dtype, seed)
    if cached:
        return _hstu_cached(rng, batch, max_len, heads, dim, cached, dtype, seed)
    lengths = rng.integers(1, max_len + 1, size=batch)
    offsets = row_offsets(lengths, index_dtype)
    rows = int(lengths.sum())
    q, k, v = (random_values([rows, heads, dim], dtype, seed + i) for i in (1, 2, 3))
    # Useful (causal, unpadded) work: two GEMMs over half of each L x L score matrix forward,
    # four backward.
    flops = int(2 * heads * (dim + dim) * np.sum(lengths.astype(np.float64) ** 2) / 2)
    if gr_window:
        return _hstu_gr(rng, lengths, offsets, max_len, heads, [q, k, v], flops, gr_window,
                        index_dtype)
    if rel_bias:
        return _hstu_rel_bias(rng, lengths, offsets, max_len, heads, [q, k, v], flops, dtype,
                              seed)
    return Case(f"B={batch} L<={max_len} H={heads} D={dim}",
                lambda q, k, v: recops_tf.hstu_attention(q, k, v, seq_offsets=offsets,
                                                         max_seq_len=max_len),
                lambda q, k, v: ref.hstu_attention(q, k, v, offsets, offsets, max_len,
                                                   max_len),
                [q, k, v], [0, 1, 2], tensor_bytes(q, k, v, v), 2 * tensor_bytes(q, k, v, v),
                flops_forward=flops, flops_backward=2 * flops)


def _hstu_gr(rng, lengths, offsets, max_len, heads, qkv, flops, window, index_dtype):
    context = np.minimum(3, lengths)
    targets = tf.constant(np.minimum(rng.integers(1, 9, size=len(lengths)), lengths - context),
                          index_dtype)
    gr_mask = {"max_attn_len": window, "contextual_seq_len": 3}
    common = dict(seq_offsets=offsets, max_seq_len=max_len, num_target=targets)

    def fused(q, k, v):
        return recops_tf.hstu_attention(q, k, v, gr_mask=gr_mask, **common)

    def reference(q, k, v):
        return recops_tf.hstu_attention(q, k, v, gr_mask=gr_mask, kernel="reference", **common)

    def rec_sdk(q, k, v):
        return recops_tf.hstu_attention(q, k, v, num_context=tf.constant(context, index_dtype),
                                        window_size=(window, 0), **common)

    q = qkv[0]
    return Case(f"GR mask m={window} c=3 B={len(lengths)} L<={max_len} H={heads} "
                f"D={q.shape[2]}", fused, reference, qkv, [0, 1, 2],
                tensor_bytes(*qkv, qkv[2]), 2 * tensor_bytes(*qkv, qkv[2]),
                flops_forward=flops, flops_backward=2 * flops, baseline=rec_sdk)


def _hstu_rel_bias(rng, lengths, offsets, max_len, heads, qkv, flops, dtype, seed):
    ts = np.concatenate([np.cumsum(rng.integers(0, 86400, size=n)) for n in lengths])
    ts = tf.constant(ts, tf.int64)
    dense_ts = tf.RaggedTensor.from_row_splits(ts, tf.cast(offsets, tf.int64)).to_tensor(
        shape=[len(lengths), max_len])
    time_w = random_values([129], dtype, seed + 4)
    pos_w = random_values([2 * max_len - 1], dtype, seed + 5)

    def fused(q, k, v, time_w, pos_w):
        return recops_tf.hstu_attention(q, k, v, seq_offsets=offsets, max_seq_len=max_len,
                                        timestamps=ts, time_bias_weights=time_w,
                                        position_bias_weights=pos_w)

    def separate(q, k, v, time_w, pos_w):
        time_bias, _ = recops_tf.relative_attn_bias_time(dense_ts, time_w[None],
                                                         duplicate=False)
        pos_bias, _ = recops_tf.toeplitz_position_bias(pos_w, duplicate=False)
        bias = time_bias[0] + pos_bias[None]
        bias = tf.broadcast_to(bias[:, None], [len(lengths), heads, max_len, max_len])
        return recops_tf.hstu_attention(q, k, v, seq_offsets=offsets, max_seq_len=max_len,
                                        attn_bias=bias)

    return Case(f"rel. bias B={len(lengths)} L<={max_len} H={heads} D={qkv[0].shape[2]}",
                fused, separate, [*qkv, time_w, pos_w], [0, 1, 2, 3, 4],
                tensor_bytes(*qkv, qkv[2]), 2 * tensor_bytes(*qkv, qkv[2]), flops_forward=flops,
                flops_backward=2 * flops)


def _hstu_cached(rng, batch, max_len, heads, dim, new, dtype, seed):
    past = max_len - new
    q, k, v = (random_values([batch, new, heads, dim], dtype, seed + i) for i in (1, 2, 3))
    rows = random_values([batch, past, 2 * heads * dim], dtype, seed + 4)
    stamps = tf.constant(np.cumsum(rng.integers(0, 86_400, [batch, max_len]), 1), tf.int64)
    time_w = random_values([129], dtype, seed + 5)
    pos_w = random_values([2 * max_len - 1], dtype, seed + 6)

    def each(fn, kernel):
        def run(q, k, v, rows):
            return tf.stack([fn(q[b], k[b], v[b], rows[b], rows[b], max_seq_len=max_len,
                                value_column=heads * dim, timestamps=stamps[b],
                                time_bias_weights=time_w, position_bias_weights=pos_w,
                                kernel=kernel) for b in range(batch)])
        return run

    flops = int(2 * heads * 2 * dim * batch * new * max_len)
    row_bytes = heads * dim * tf.as_dtype(dtype).size
    return Case(f"cached B={batch} x (cache {past} + {new} new) H={heads} D={dim}",
                each(recops_tf.hstu_attention_cached, "fused"),
                each(recops_tf.hstu_attention_cached, "reference"), [q, k, v, rows], [],
                batch * (2 * past + 4 * new) * row_bytes, 0, flops_forward=flops,
                bound="memory")


def _hstu_paged(rng, batch, max_len, heads, dim, page_size, dtype, index_dtype, seed):
    cache_len = rng.integers(1, max_len + 1, size=batch)
    new = rng.integers(1, 5, size=batch)
    targets = np.minimum(rng.integers(0, 3, size=batch), new)
    pages_per = (cache_len + page_size - 1) // page_size
    num_pages = int(pages_per.sum()) + 1
    page_ids = rng.permutation(num_pages)[:int(pages_per.sum())]
    page_offsets = np.concatenate([[0], np.cumsum(pages_per)])
    last = cache_len - (pages_per - 1) * page_size
    offsets = np.concatenate([[0], np.cumsum(new)])
    q, k, v = (random_values([int(new.sum()), heads, dim], dtype, seed + i) for i in (1, 2, 3))
    cache = random_values([num_pages, 2, page_size, heads, dim], dtype, seed + 4)
    # Composite: gather the effective keys (flat cache rows, then the fresh target rows).
    src, k_lengths = [], []
    for b in range(batch):
        for j, page in enumerate(page_ids[page_offsets[b]:page_offsets[b + 1]]):
            rows = page_size if j + 1 < pages_per[b] else last[b]
            src += [page * page_size + r for r in range(rows)]
        src += [num_pages * page_size + r for r in range(offsets[b + 1] - targets[b],
                                                         offsets[b + 1])]
        k_lengths.append(cache_len[b] + targets[b])
    src = tf.constant(src, tf.int64)
    offsets_k = row_offsets(np.array(k_lengths), tf.int64)
    ints = lambda x: tf.constant(x, index_dtype)  # noqa: E731
    max_k = int(max_len + 2)

    def fused(q, k, v, cache):
        return recops_tf.hstu_attention_paged(
            q, k, v, cache, seq_offsets=ints(offsets), page_offsets=ints(page_offsets),
            page_ids=ints(page_ids), last_page_len=ints(last), num_target=ints(targets),
            max_seq_len=4, max_seq_len_k=max_k)

    def reference(q, k, v, cache):
        flat = lambda part, x: tf.concat(  # noqa: E731
            [tf.reshape(cache[:, part], [-1, heads, dim]), x], axis=0)
        return ref.hstu_attention(q, tf.gather(flat(0, k), src), tf.gather(flat(1, v), src),
                                  ints(offsets), offsets_k, 4, max_k,
                                  num_target=ints(targets), target_group_size=1)

    flops = int(2 * heads * 2 * dim * np.sum(new * (cache_len + targets)))
    # Memory-bound (a few queries per sequence against its whole cache): the bytes a step must
    # move are the cached keys and values it reads, q, k, v and the output.
    row_bytes = heads * dim * tf.as_dtype(dtype).size
    cache_read = int(2 * cache_len.sum()) * row_bytes
    return Case(f"paged B={batch} cache<={max_len} H={heads} D={dim} page={page_size}", fused,
                reference, [q, k, v, cache], [], cache_read + 4 * int(new.sum()) * row_bytes, 0,
                flops_forward=flops, bound="memory")

"""recops_tf.compat.gr: GR's hstu_mha on the fused kernel against a float64 implementation of
GR's mask rules written here from their definition (docs/gr_compat.md), over the 16 mask
classes (causal or not x window x context x targets) and their edge cases."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from recops_tf import layers
from recops_tf.compat import gr
from recops_tf.testing import assert_close, tolerance


# ---- the oracle: GR's rules per (query, key), then dense float64 attention ----------------

def gr_visible(i, j, n, c, t, m, f, causal):
    """Whether query i sees key j in a sequence of length n (context c, targets t, window m,
    full-attention tail f)."""
    top = n - max(c - 1, 0) - t  # the targets' id, the largest

    def pid(p):
        return min(max(p - c + 1, 0) if c > 0 else p, top)

    d = pid(i) - pid(j)
    if not causal:
        d = abs(d)
    visible = i == j or d > 0
    if m > 0 and d > m and not (f > 0 and pid(i) >= top - f):
        visible = False
    if c > 0 and pid(i) == 0 and pid(j) < top:
        visible = True
    return visible


def oracle_mask(lengths, targets, c, m, f, causal):
    """[B, S, S] float64 mask, S = max(lengths)."""
    s = max(max(lengths), 1)
    out = np.zeros((len(lengths), s, s))
    for b, n in enumerate(lengths):
        t = 0 if targets is None else targets[b]
        for i in range(n):
            for j in range(n):
                out[b, i, j] = gr_visible(i, j, n, c, t, m, f, causal)
    return out


def default_scale(rows, max_seq_len):
    """GR's default 1 / max_seq_len, as the kernel computes it (in float32)."""
    return tf.fill([rows], tf.constant(float(np.float32(1) / np.float32(max_seq_len)),
                                       tf.float64))


def oracle_mha(q, k, v, lengths, mask, alpha, scale):
    """float64 jagged attention with a dense mask; scale [L] per row (differentiable)."""
    outs, first = [], 0
    for b, n in enumerate(lengths):
        qb, kb, vb = q[first:first + n], k[first:first + n], v[first:first + n]
        z = alpha * tf.einsum("ihd,jhd->hij", qb, kb)
        p = z * tf.sigmoid(z) * mask[b, :n, :n][None] * scale[first:first + n][None, :, None]
        outs.append(tf.einsum("hij,jhd->ihd", p, vb))
        first += n
    return tf.concat(outs, axis=0)


# ---- hand-checked rules (the oracle itself is tested) -------------------------------------

def test_oracle_rules_by_hand():
    # Window + context (issue 21): at m = 8, c = 3 rows 9-10 still see the context, row 11 not.
    assert gr_visible(9, 0, 20, 3, 0, 8, 0, True) and gr_visible(10, 2, 20, 3, 0, 8, 0, True)
    assert not gr_visible(11, 0, 20, 3, 0, 8, 0, True)
    # Window + targets: every target sees the same last m history items and itself only.
    n, t, m = 12, 3, 4
    for i in range(n - t, n):
        seen = [j for j in range(n) if gr_visible(i, j, n, 0, t, m, 0, True)]
        assert seen == list(range(n - t - m, n - t)) + [i]
    # Context rows see all context and history, no targets; non-causal history sees all.
    assert [gr_visible(0, j, 8, 2, 2, 0, 0, True) for j in range(8)] == [1] * 6 + [0, 0]
    assert all(gr_visible(3, j, 8, 0, 0, 0, 0, False) for j in range(8))
    # min_full_attn_seq_len: rows near the end ignore the window.
    assert not gr_visible(9, 0, 10, 0, 0, 2, 0, True)
    assert gr_visible(9, 0, 10, 0, 0, 2, 1, True) and not gr_visible(7, 0, 10, 0, 0, 2, 1, True)


# ---- the grid over the 16 classes ---------------------------------------------------------

# Lengths: empty, 1, shorter than the context (3), one tile plus, several tiles (tile skipping).
LENGTHS = [0, 1, 2, 7, 70, 150]
MAX_SEQ_LEN = 160


def targets_for(lengths, kind):
    if kind == "none":
        return None
    # 0, all-but-one, a full sequence, and a few.
    return [min(n, x) for n, x in zip(lengths, [0, 1, 2, 7, 5, 9])] if kind == "some" else \
        list(lengths)


def inputs(lengths, dtype, heads=2, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    make = lambda: tf.cast(rng.normal(0, 0.7, (total, heads, dim)), dtype)  # noqa: E731
    offsets = tf.constant(np.concatenate([[0], np.cumsum(lengths)]), tf.int64)
    return make(), make(), make(), offsets


CLASSES = list(itertools.product([True, False], [0, 12], [0, 3], ["none", "some"]))


def check(lengths, causal, m, c, tkind, dtype, f=0, attn_scale=False, alpha=0.8, seed=0):
    q, k, v, offsets = inputs(lengths, dtype, seed=seed)
    targets = targets_for(lengths, tkind)
    num_targets = None if targets is None else tf.constant(targets, tf.int64)
    scale = (tf.cast(np.random.default_rng(seed + 1).uniform(0.01, 0.03, q.shape[0]), dtype)
             if attn_scale else None)
    kw = dict(causal=causal, num_targets=num_targets, attn_scale=scale, max_attn_len=m,
              contextual_seq_len=c, min_full_attn_seq_len=f)
    upstream = tf.cast(np.random.default_rng(seed + 2).normal(size=(q.shape[0], 2, 8)), dtype)
    with tf.GradientTape() as tape:
        tape.watch([q, k, v] + ([scale] if attn_scale else []))
        out = gr.hstu_mha(MAX_SEQ_LEN, alpha, q, k, v, offsets, **kw)
        loss = tf.reduce_sum(tf.cast(out, tf.float64) * tf.cast(upstream, tf.float64))
    grads = tape.gradient(loss, [q, k, v] + ([scale] if attn_scale else []))

    mask = oracle_mask(lengths, targets, c, m, f, causal)
    q64, k64, v64 = (tf.cast(x, tf.float64) for x in (q, k, v))
    s64 = tf.cast(scale, tf.float64) if attn_scale else default_scale(q.shape[0], MAX_SEQ_LEN)
    with tf.GradientTape() as tape:
        tape.watch([q64, k64, v64, s64])
        expected = oracle_mha(q64, k64, v64, lengths, mask, float(np.float32(alpha)), s64)
        loss = tf.reduce_sum(expected * tf.cast(upstream, tf.float64))
    expected_grads = tape.gradient(loss, [q64, k64, v64] + ([s64] if attn_scale else []))
    reduction = max(lengths)
    assert_close(out, expected, dtype, reduction=reduction, what="forward")
    assert_close([g for g in grads], [tf.zeros_like(e) if e is None else e
                                      for e in expected_grads],
                 dtype, magnitude=4.0, reduction=reduction, what="gradient")
    return mask


@pytest.mark.parametrize("causal,m,c,tkind", CLASSES,
                         ids=[f"{'causal' if a else 'bidir'}-m{m}-c{c}-t_{t}"
                              for a, m, c, t in CLASSES])
def test_grid_float32(causal, m, c, tkind):
    mask = check(LENGTHS, causal, m, c, tkind, tf.float32)
    assert mask.sum() > 0


@pytest.mark.parametrize("causal", [True, False])
def test_min_full_attn_seq_len_and_attn_scale(causal):
    check(LENGTHS, causal, 5, 3, "some", tf.float32, f=20, attn_scale=True)


@pytest.mark.parametrize("dtype", [tf.float64, tf.bfloat16, tf.float16])
def test_dtypes(dtype):
    check([0, 3, 70, 9], True, 12, 3, "some", dtype, f=4)


@pytest.mark.parametrize("lengths,targets", [
    ([6, 6], [3, 3]),   # context + targets = length = max_seq_len (GR accepts it)
    ([2, 1], [2, 1]),   # targets fill sequences shorter than the context
])
def test_edges(lengths, targets):
    q, k, v, offsets = inputs(lengths, tf.float64)
    out = gr.hstu_mha(6, 1.0, q, k, v, offsets, num_targets=tf.constant(targets),
                      contextual_seq_len=3, max_attn_len=2)
    mask = np.zeros((len(lengths), 6, 6))
    for b, n in enumerate(lengths):
        for i in range(n):
            for j in range(n):
                mask[b, i, j] = gr_visible(i, j, n, 3, targets[b], 2, 0, True)
    expected = oracle_mha(q, k, v, lengths, mask, 1.0, default_scale(sum(lengths), 6))
    assert_close(out, expected, tf.float64)


def test_reference_kernel_matches_fused():
    q, k, v, offsets = inputs([5, 70, 0, 33], tf.float32)
    kw = dict(num_targets=tf.constant([1, 4, 0, 2]), max_attn_len=10, contextual_seq_len=2,
              min_full_attn_seq_len=3)
    fused = gr.hstu_mha(80, 0.5, q, k, v, offsets, **kw)
    ref = gr.hstu_mha(80, 0.5, q, k, v, offsets, kernel="reference", **kw)
    assert_close(fused, ref, tf.float32, reduction=80)
    # valid_attn_mask is the reference's plane; it equals the oracle.
    plane = gr.valid_attn_mask(offsets, 80, num_targets=kw["num_targets"], max_attn_len=10,
                               contextual_seq_len=2, min_full_attn_seq_len=3)
    want = oracle_mask([5, 70, 0, 33], [1, 4, 0, 2], 2, 10, 3, True)
    np.testing.assert_array_equal(plane.numpy()[:, :70, :70], want.astype(bool))


def test_tf_function_and_int32_offsets():
    q, k, v, offsets = inputs([4, 9], tf.float32)
    fn = tf.function(lambda q, k, v, o: gr.hstu_mha(9, 1.0, q, k, v, o, max_attn_len=3))
    out = fn(q, k, v, tf.cast(offsets, tf.int32))
    assert_close(out, gr.hstu_mha(9, 1.0, q, k, v, offsets, max_attn_len=3), tf.float32)


def test_bad_inputs():
    q, k, v, offsets = inputs([4, 5], tf.float32)
    with pytest.raises(ValueError, match="dropout"):
        gr.hstu_mha(9, 1.0, q, k, v, offsets, dropout_pr=0.1)
    gr.hstu_mha(9, 1.0, q, k, v, offsets, dropout_pr=0.1, training=False)
    with pytest.raises(ValueError, match="hstu_mha: max_attn_len must be an int >= 0"):
        gr.hstu_mha(9, 1.0, q, k, v, offsets, max_attn_len=-1)
    with pytest.raises(TypeError, match="causal must be a Python bool, got 'yes'"):
        gr.hstu_mha(9, 1.0, q, k, v, offsets, causal="yes")
    with pytest.raises(tf.errors.InvalidArgumentError, match="attn_scale must have one entry"):
        gr.hstu_mha(9, 1.0, q, k, v, offsets, attn_scale=tf.ones([3]))
    with pytest.raises(ValueError, match="kernel"):
        gr.hstu_mha(9, 1.0, q, k, v, offsets, kernel="triton2")
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_target"):
        gr.hstu_mha(9, 1.0, q, k, v, offsets, num_targets=tf.constant([5, 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_seq_len"):
        gr.hstu_mha(4, 1.0, q, k, v, offsets)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_target"):
        gr.hstu_mha(9, 1.0, q, k, v, offsets, num_targets=tf.constant([1, 1, 1]))
    with pytest.raises(ValueError, match="gr_mask"):
        from recops_tf import hstu_attention
        hstu_attention(q, k, v, seq_offsets=offsets, max_seq_len=9, window_size=(2, 0),
                       gr_mask={"max_attn_len": 2})
    with pytest.raises(ValueError, match="gr_mask.max_attn_len must be an int >= 0"):
        from recops_tf import hstu_attention
        hstu_attention(q, k, v, seq_offsets=offsets, max_seq_len=9, gr_mask=gr.GRMask(-1))
    with pytest.raises(ValueError, match="unknown keys"):
        from recops_tf import hstu_attention
        hstu_attention(q, k, v, seq_offsets=offsets, max_seq_len=9, gr_mask={"window": 2})


# ---- the layers' GR mode ------------------------------------------------------------------

def test_hstu_block_gr_mode_fused_equals_stock_and_serializes():
    gr_mask = {"max_attn_len": 4, "contextual_seq_len": 2, "min_full_attn_seq_len": 0}
    x = tf.RaggedTensor.from_row_lengths(
        tf.random.stateless_normal([30, 16], seed=[1, 2]), [3, 20, 7])
    targets = tf.constant([1, 2, 0])
    fused = layers.HSTUBlock(num_heads=2, head_dim=8, max_seq_len=24, gr_mask=gr_mask)
    out = fused(x, num_targets=targets)
    stock = layers.HSTUBlock.from_config(dict(fused.get_config(), use_fused=False))
    stock(x, num_targets=targets)
    stock.set_weights(fused.get_weights())
    assert_close(stock(x, num_targets=targets), out, tf.float32, reduction=24)
    assert fused.get_config()["gr_mask"] == gr_mask
    # The GR rules change the result (the window is honoured).
    plain = layers.HSTUBlock.from_config(dict(fused.get_config(), gr_mask=None))
    plain(x, num_targets=targets)
    plain.set_weights(fused.get_weights())
    rtol, atol = tolerance(tf.float32, reduction=24)
    assert not np.allclose(plain(x, num_targets=targets).flat_values, out.flat_values,
                           rtol=rtol, atol=atol)


def test_hstu_attention_layer_gr_mode():
    x = tf.random.stateless_normal([2, 10, 8], seed=[3, 4])
    layer = layers.HSTUAttention(num_heads=2, head_dim=4, max_seq_len=10,
                                 gr_mask={"max_attn_len": 3})
    out = layer(x)
    assert out.shape == (2, 10, 8)
    assert layers.HSTUAttention.from_config(layer.get_config()).gr_mask == gr.GRMask(3, 0, 0)
    with pytest.raises(ValueError, match="gr_mask"):
        layers.HSTUAttention(num_heads=2, head_dim=4, max_seq_len=10, window_size=(1, 0),
                             gr_mask={"max_attn_len": 3})

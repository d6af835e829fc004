"""Tests of stem hstu_dense_fuxi: Fuxi-alpha three-channel attention and its gradients."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import hstu_dense_fuxi as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient, in_mode,
                               random_values)

# Empty, length-1 and multi-tile (> 64, so diagonal and full tiles) sequences.
LENS = [5, 0, 70, 1]
MAX = 72


def offsets(lens, dtype=tf.int64):
    return tf.constant(np.concatenate([[0], np.cumsum(lens)]), dtype)


def make(dtype=tf.float32, heads=2, dim=8, lens=LENS, seed=0, index_dtype=tf.int64):
    rows = sum(lens)
    q, k, v = (random_values([rows, heads, dim], dtype, seed + i) for i in range(3))
    ts = random_values([len(lens), MAX, MAX], dtype, seed + 4)
    pos = random_values([1, MAX, MAX], dtype, seed + 5)
    return q, k, v, ts, pos, offsets(lens, index_dtype)


VARIANTS = {
    "causal_biases": {},
    "causal_no_bias": {"_no_bias": True},
    "none": {"mask_type": "none"},
    "custom": {"mask_type": "custom", "_mask": True},
    "silu_scale": {"silu_scale": 0.25},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_matches_reference(dtype, variant, mode):
    q, k, v, ts, pos, off = make(dtype)
    kw = dict(VARIANTS[variant])
    if kw.pop("_no_bias", False):
        ts = pos = None
    if kw.pop("_mask", False):
        kw["mask"] = random_values([len(LENS), 2, MAX, MAX], dtype, 9, low=0.0)
    fused = lambda q, k, v: recops_tf.hstu_attention_fuxi(  # noqa: E731
        q, k, v, seq_offsets=off, max_seq_len=MAX, timestamp_bias=ts, position_bias=pos, **kw)
    reference = lambda q, k, v: ref.hstu_attention_fuxi(  # noqa: E731
        q, k, v, off, MAX, None if ts is None else tf.cast(ts, tf.float64),
        None if pos is None else tf.cast(pos, tf.float64),
        mask=None if "mask" not in kw else tf.cast(kw["mask"], tf.float64),
        **{a: b for a, b in kw.items() if a != "mask"})
    out = in_mode(fused, mode, [q, k, v])(q, k, v)
    assert out.shape[1] == (1 if ts is None else 3) * 2 * 8
    assert_matches_reference(fused, reference, [q, k, v], dtype, magnitude=3.0, reduction=70)


def test_output_layout_is_head_major_channel_blocks():
    q, k, v, ts, pos, off = make(tf.float64)
    out = recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                        timestamp_bias=ts, position_bias=pos)
    semantic = recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX)
    np.testing.assert_allclose(out[:, :16].numpy(), semantic.numpy(), rtol=1e-12)
    # The temporal channel with v = ones and a constant bias counts the visible keys.
    ones = tf.ones_like(v)
    const = tf.ones_like(ts)
    out = recops_tf.hstu_attention_fuxi(q, k, ones, seq_offsets=off, max_seq_len=MAX,
                                        timestamp_bias=const, position_bias=2 * pos[:1] * 0)
    counts = np.concatenate([np.arange(1, n + 1) for n in LENS]).astype(np.float64)
    np.testing.assert_allclose(out[:, 16:32].numpy(), np.repeat(counts[:, None], 16, 1))
    np.testing.assert_array_equal(out[:, 32:].numpy(), 0.0)


def test_dense_and_ragged_layouts_match_jagged():
    lens = [6, 6, 6]
    q, k, v, ts, pos, off = make(lens=lens)
    ts, pos = ts[:, :6, :6], pos[:, :6, :6]
    jagged = recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=6,
                                           timestamp_bias=ts, position_bias=pos)
    dense = recops_tf.hstu_attention_fuxi(*(tf.reshape(x, [3, 6, 2, 8]) for x in (q, k, v)),
                                          timestamp_bias=ts, position_bias=pos)
    np.testing.assert_array_equal(tf.reshape(dense, [18, -1]).numpy(), jagged.numpy())
    rag = [tf.RaggedTensor.from_row_splits(x, off) for x in (q, k, v)]
    ragged = recops_tf.hstu_attention_fuxi(*rag, max_seq_len=6, timestamp_bias=ts,
                                           position_bias=pos)
    np.testing.assert_array_equal(ragged.values.numpy(), jagged.numpy())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradients_match_reference(dtype, variant):
    q, k, v, ts, pos, off = make(dtype)
    kw = dict(VARIANTS[variant])
    no_bias = kw.pop("_no_bias", False)
    if kw.pop("_mask", False):
        kw["mask"] = random_values([len(LENS), 2, MAX, MAX], dtype, 9, low=0.0)
    mask = kw.pop("mask", None)

    def fused(q, k, v, ts=None, pos=None):
        return recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                             timestamp_bias=ts, position_bias=pos, mask=mask,
                                             **kw)

    def reference(q, k, v, ts=None, pos=None):
        m = None if mask is None else tf.cast(mask, q.dtype)
        return ref.hstu_attention_fuxi(q, k, v, off, MAX, ts, pos, mask=m, **kw)

    args, diff = ([q, k, v], [0, 1, 2]) if no_bias else ([q, k, v, ts, pos], [0, 1, 2, 3, 4])
    assert_gradients_match_reference(fused, reference, args, diff, dtype, magnitude=3.0,
                                     reduction=140)


def test_numeric_gradients():
    lens = [3, 0, 4]
    q, k, v, ts, pos, off = make(tf.float64, heads=2, dim=3, lens=lens)
    ts, pos = ts[:3, :4, :4], pos[:, :4, :4]
    f = lambda q, k, v, ts, pos: recops_tf.hstu_attention_fuxi(  # noqa: E731
        q, k, v, seq_offsets=off, max_seq_len=4, timestamp_bias=ts, position_bias=pos,
        silu_scale=0.5)
    assert_numeric_gradient(f, [q, k, v, ts, pos], [0, 1, 2, 3, 4])


def test_bias_gradients_are_zero_outside_visible_entries():
    q, k, v, ts, pos, off = make()
    with tf.GradientTape() as tape:
        tape.watch([ts, pos])
        out = recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                            timestamp_bias=ts, position_bias=pos)
        loss = tf.reduce_sum(out)
    d_ts, d_pos = tape.gradient(loss, [ts, pos])
    i, j = np.meshgrid(np.arange(MAX), np.arange(MAX), indexing="ij")
    for b, n in enumerate(LENS):
        visible = (j <= i) & (i < n)
        assert np.all(d_ts[b].numpy()[~visible] == 0)
        if n > 1:
            assert np.all(d_ts[b].numpy()[visible] != 0)
    assert np.all(d_pos[0].numpy()[j > i] == 0)


def test_backward_is_deterministic():
    q, k, v, ts, pos, off = make()

    def grads():
        with tf.GradientTape() as tape:
            tape.watch([q, k, v, ts, pos])
            out = recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                                timestamp_bias=ts, position_bias=pos)
            loss = tf.reduce_sum(out * out)
        return [g.numpy() for g in tape.gradient(loss, [q, k, v, ts, pos])]

    first = grads()
    for again in (grads(), grads()):
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)


def test_error_grad_shape():
    q, k, v, ts, pos, off = make()
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad must have"):
        recops_tf.ops.hstu_dense_fuxi.lib().recops_hstu_fuxi_backward(
            tf.ones([76, 16]), q, k, v, off, tf.zeros([0]), ts, pos, max_seq_len=MAX,
            has_bias=True)


# ---- validation ----------------------------------------------------------------------------

def test_error_gqa_rejected():
    q, k, v, ts, pos, off = make()
    with pytest.raises(tf.errors.InvalidArgumentError, match="one head count"):
        recops_tf.hstu_attention_fuxi(q, k[:, :1], v[:, :1], seq_offsets=off, max_seq_len=MAX)


def test_error_head_dims_differ():
    q, k, v, ts, pos, off = make()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        recops_tf.hstu_attention_fuxi(q, k, v[:, :, :4], seq_offsets=off, max_seq_len=MAX)


def test_error_bias_shapes():
    q, k, v, ts, pos, off = make()
    with pytest.raises(tf.errors.InvalidArgumentError, match="timestamp_bias must have shape"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                      timestamp_bias=ts[:, :10], position_bias=pos)
    with pytest.raises(tf.errors.InvalidArgumentError, match="position_bias"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                      timestamp_bias=ts, position_bias=ts)


def test_error_only_one_bias():
    q, k, v, ts, pos, off = make()
    with pytest.raises(ValueError, match="both"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                      timestamp_bias=ts)


def test_error_offsets():
    q, k, v, ts, pos, off = make()
    with pytest.raises(tf.errors.InvalidArgumentError, match="seq_offsets"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=offsets([5, 0, 70, 2]),
                                      max_seq_len=MAX)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_seq_len"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=60)


def test_error_layouts_and_arguments():
    q, k, v, ts, pos, off = make()
    with pytest.raises(ValueError, match="^hstu_attention_fuxi: max_seq_len must be a positive "
                       "int, got 0$"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=0)
    with pytest.raises(TypeError, match="^hstu_attention_fuxi: q must be float32, float16, "
                       "bfloat16 or float64, got int32$"):
        recops_tf.hstu_attention_fuxi(tf.cast(q, tf.int32), k, v, seq_offsets=off,
                                      max_seq_len=MAX)
    with pytest.raises(TypeError, match="timestamp_bias is float64 but q is float32"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                      timestamp_bias=tf.cast(ts, tf.float64), position_bias=pos)
    rq = tf.RaggedTensor.from_row_splits(tf.reshape(q, [q.shape[0], -1]), off)
    with pytest.raises(ValueError, match=r"a ragged q must be \[B, \(L\), N, D\]"):
        recops_tf.hstu_attention_fuxi(rq, rq, rq, max_seq_len=MAX)
    with pytest.raises(ValueError, match=r"q must be jagged \[T, N, D\] \(with seq_offsets\), "
                       r"got a dense tensor \[\d+, 16\] \(rank 2\)"):
        recops_tf.hstu_attention_fuxi(rq.values, rq.values, rq.values, seq_offsets=off,
                                      max_seq_len=MAX)


def test_error_mask():
    q, k, v, ts, pos, off = make()
    with pytest.raises(ValueError, match="needs a mask"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                      mask_type="custom")
    with pytest.raises(tf.errors.InvalidArgumentError, match="mask must have shape"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                      mask_type="custom", mask=tf.ones([4, 2, 5, 5]))
    with pytest.raises(ValueError, match="upper"):
        recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=off, max_seq_len=MAX,
                                      mask_type="upper triangular")


def test_error_backward_checks_heads_like_the_forward():
    q, k, v, ts, pos, off = make()
    with pytest.raises(tf.errors.InvalidArgumentError, match="one head count"):
        recops_tf.ops.hstu_dense_fuxi.lib().recops_hstu_fuxi_backward(
            tf.ones([76, 48]), q, k[:, :1], v[:, :1], off, tf.zeros([0]), ts, pos,
            max_seq_len=MAX, has_bias=True)

"""Tests of stem disentangle_attention: forward (output, probs, weights) and gradients."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import disentangle_attention as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient,
                               assert_second_order_raises, in_mode)
from recops_tf.testing.inputs import random_values

B, N, S, D = 2, 3, 7, 5


def relative(s=S, seed=0):
    # Out-of-range offsets on purpose: the clamp is part of the semantics.
    return tf.constant(np.random.default_rng(seed).integers(-s - 3, s + 3, size=[s, s]), tf.int64)


def args(dtype, b=B, n=N, s=S, d=D, seed=0):
    return ([random_values([b, n, s, d], dtype, seed + i) for i in range(3)]
            + [random_values([2 * s, n, d], dtype, seed + 3 + i) for i in range(2)])


def mask(dtype, b=B, s=S, seed=0):
    m = np.where(np.random.default_rng(seed).uniform(size=[b, 1, s, s]) < 0.2, -1e4, 0.0)
    return tf.constant(m, dtype)


def call(fn, rel, attn_mask=None, **kw):
    return lambda q, k, v, pk, pq: fn(q, k, v, pk, pq, rel, attn_mask, **kw)


@pytest.mark.parametrize("pos_att_type", ["c2p|p2c", "c2p", "p2c"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(dtype, pos_att_type):
    a, rel = args(dtype), relative()
    m = mask(tf.float64)  # the same mask values in every dtype
    fused = call(recops_tf.disentangle_attention, rel, tf.cast(m, dtype),
                 pos_att_type=pos_att_type)
    reference = call(ref.disentangle_attention, rel, m, pos_att_type=pos_att_type)
    assert_matches_reference(fused, reference, a, dtype, magnitude=4.0, reduction=3 * D)
    assert_gradients_match_reference(fused, reference, a, [0, 1, 2, 3, 4], dtype,
                                     magnitude=8.0, reduction=4 * S * D)


@pytest.mark.parametrize("mode", MODES)
def test_modes_and_explicit_scale(mode):
    a, rel = args(tf.float32), relative(seed=1)
    fused = call(recops_tf.disentangle_attention, rel, score_scale=0.3)
    reference = call(ref.disentangle_attention, rel, score_scale=0.3)
    assert_matches_reference(in_mode(fused, mode, a), reference, a, tf.float32,
                             magnitude=4.0, reduction=3 * D)


def test_numeric_gradient():
    a, rel = args(tf.float64, 1, 2, 4, 3), relative(4, 2)
    assert_numeric_gradient(call(recops_tf.disentangle_attention, rel, mask(tf.float64, 1, 4)),
                            a, [0, 1, 2, 3, 4])


def test_relative_pos_layouts_and_mask_layouts():
    a, rel = args(tf.float32), relative(seed=3)
    m = mask(tf.float32)
    base = recops_tf.disentangle_attention(*a, rel, m)
    for r in (rel[None], rel[None, None]):
        for mm in (m, m[:, 0]):
            out = recops_tf.disentangle_attention(*a, r, mm)
            for x, y in zip(out, base):
                np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_position_gradients_are_deterministic():
    a, rel = args(tf.float32, b=6), relative(seed=4)
    grads = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = tf.reduce_sum(recops_tf.disentangle_attention(*a, rel)[0] ** 2)
        grads.append([g.numpy() for g in tape.gradient(loss, a)])
    for g in grads[1:]:
        for x, y in zip(grads[0], g):
            np.testing.assert_array_equal(x, y)


def test_error_unknown_pos_att_type():
    with pytest.raises(ValueError, match="pos_att_type"):
        recops_tf.disentangle_attention(*args(tf.float32), relative(), pos_att_type="p2p")


def test_error_relative_pos_shape():
    with pytest.raises(tf.errors.InvalidArgumentError, match="relative_pos"):
        recops_tf.disentangle_attention(*args(tf.float32), relative()[:, :4])


def test_error_key_shape():
    q, k, v, pk, pq = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="key must have query's shape"):
        recops_tf.disentangle_attention(q, k[:, :2], v, pk, pq, relative())


def test_error_position_table_shape():
    q, k, v, pk, pq = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"pos_key must have shape"):
        recops_tf.disentangle_attention(q, k, v, pk[1:], pq, relative())


def test_error_mask_shape():
    with pytest.raises(tf.errors.InvalidArgumentError, match="attn_mask"):
        recops_tf.disentangle_attention(*args(tf.float32), relative(), tf.zeros([B, S, S + 1]))


def test_error_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank|b, n, s, d"):
        recops_tf.disentangle_attention(tf.zeros([2, 3, 4]), tf.zeros([2, 3, 4]),
                                        tf.zeros([2, 3, 4]), tf.zeros([6, 3, 4]),
                                        tf.zeros([6, 3, 4]), tf.zeros([3, 3], tf.int64),
                                        score_scale=1.0)


def test_second_order_gradient_raises():
    assert_second_order_raises(call(recops_tf.disentangle_attention, relative()),
                               args(tf.float32))
